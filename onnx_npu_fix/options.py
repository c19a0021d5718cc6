"""Every knob of a run in one frozen dataclass, shared by the CLI, the pass manager and the passes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FixOptions:
    # --- constraints / pass options -------------------------------------------------------------
    max_dilation: int | None = None
    """Largest dilation a Conv may keep on any axis (None: no limit, dilated-conv does nothing)."""
    s2b_layout: str = "auto"
    """Space-to-batch layout for dilated-conv: auto | spatial | channel | batch."""
    align: int = 8
    """Conv / ConvTranspose channel alignment (0 disables align-channels)."""
    align_io: bool = False
    """Also align channel counts of graph inputs/outputs inside the graph (Pad after inputs)."""
    bn_standalone: str = "mul-add"
    """How a BatchNormalization that cannot be folded is lowered: mul-add | conv."""
    resize_mode: str = "nearest"
    """resize-nearest: nearest (approximate) | exact (exact ConvTranspose/MatMul forms where they exist)."""
    max_approx_error: float = 0.5
    """Bound on the relative L2 error of each output for approximate passes."""
    large_tensor_bytes: int = 1 << 20
    """fold-constants does not materialise tensors larger than this."""
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Overrides for graph input shapes (freezes dynamic dims)."""
    # --- validation -------------------------------------------------------------------------------
    validate: str = "each"
    """each: after every pass that changed the graph; final: once, output against input; none."""
    n_inputs: int = 3
    seed: int = 0
    rtol: float = 1e-4
    atol: float = 1e-5
    keep_going: bool = False
    """Roll back a pass that fails validation and continue, instead of failing the run."""
    # --- constraints checked by --check and after a fixing run (target profiles set these) ----------
    allowed_dilations: tuple[int, ...] | None = None
    """If set, every Conv dilation must be in this set (e.g. MDLA {1,2,4,8}); else only max_dilation."""
    concat_align: int = 0
    """Channel count of every Concat input must be a multiple of this (0: not checked)."""
    batch_one: bool = False
    """Every activation tensor must have batch (axis 0) 1."""
    max_rank: int | None = None
    """Largest tensor rank the target accepts (None: not checked; most NPU profiles set 4)."""
    forbidden_ops: tuple[str, ...] = ()
    """Op types the target cannot run; rewrites must not emit them and --check reports them."""
    allow_batchnorm: bool = False
    """Whether a BatchNormalization may remain (False: a violation fixed by fold-batchnorm)."""
    require_nearest_resize: bool = True
    """Whether a non-nearest Resize/Upsample is a violation (fixed by resize-nearest)."""
    max_kernel: int | None = None
    """Largest Conv kernel extent on any axis worth reporting (None: not checked)."""
    max_stride: int | None = None
    """Largest Conv stride on any axis (None: not checked)."""
    sram_bytes: int | None = None
    """Activation-memory budget for the memory estimate (None: only reported, never a violation)."""
    act_bytes: int = 1
    """Bytes per activation element in the memory estimate (1 for int8, 4 for float32)."""
    # --- emission forms: which op forms the target's compiler runs on its NPU (target profiles set these) ----
    remainder_pad: str = "concat"
    """How dilated-conv pads a remainder (< k samples) before its phase Reshape: concat (Concat with a zeros
    constant, the default: tpu-mlir 1.30.2 aborts on a rank-3 Pad there) | pad4d (a Pad on a rank >= 4 view;
    rank-3 tensors are reshaped to [B,C,1,L] around it) | pad (a plain Pad of the tensor's own rank)."""
    lift_conv1d: bool = False
    """dilated-conv runs every 1-D Conv ([B,C,L]) as a 4-D one: Reshape [B,C,1,L] -> Conv kernel [1,K] -> Reshape."""
    s2b_layouts: tuple[str, ...] | None = None
    """Space-to-batch layouts whose ops the target runs on its NPU (None: all). With --s2b-layout auto only these
    are tried; a conv none of them can rewrite is left alone (do no harm) unless force_rewrite."""
    force_rewrite: bool = False
    """Rewrite a conv even when every form would put ops on the target's CPU (overrides the do-no-harm rule)."""
    allow_convtranspose: bool = True
    """Whether rewrites may emit ConvTranspose (False: resize-nearest's exact mode uses the MatMul form)."""
    max_convtranspose_stride: int | None = None
    """Largest ConvTranspose stride the target compiles (None: no limit); exact Resize forms above it are
    split into stages (x8 -> x2 then x4)."""
