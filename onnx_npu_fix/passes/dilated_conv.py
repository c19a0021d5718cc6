"""Pass ``dilated-conv``: no Conv keeps a dilation above ``max_dilation`` (or outside ``allowed_dilations``).

Space-to-batch, exactly. On one spatial axis a Conv with kernel K, dilation D, stride s and pads (pb, pe)
computes, on the padded input ``xp`` (length Lp = L + pb + pe)::

    y[o] = sum_j w[j] * xp[o*s + j*D]            o = 0 .. O-1,  O = (Lp - (K-1)*D - 1) // s + 1

Pick a block size k dividing D (D = k*D') and cut ``xp`` into k phases, ``X[r][q] = xp[q*k + r]``. Every tap
of output o then lies in one phase, because j*D is a multiple of k::

    y[o] = sum_j w[j] * X[(o*s) % k][(o*s) // k + j*D']

With stride 1 the outputs o = m*k + t read phase t at rows m + j*D': each phase is a Conv with dilation D',
and output m of phase t is y[m*k + t] (TensorFlow's SpaceToBatchND / BatchToSpaceND algebra). With a stride,
let p = gcd(k, s) and T = k / p. Output o = m*T + t reads phase (t*s) % k at row m*(s/p) + (t*s)//k + j*D';
the row offset (t*s)//k is the same (0) for every t exactly when ``s | k`` or ``k | s`` — then the kept phases
are r = 0, p, 2p, ... (a Slice with step p, T of them), and each is a Conv with stride s/p and dilation D'.
Otherwise phases would need different offsets, which one Conv cannot do, so k is only chosen among divisors
of D with ``s % k == 0 or k % s == 0``; when there is none the node is left with a blocking Rejection.

k is the smallest such divisor with D/k <= ``max_dilation`` (and D/k in ``allowed_dilations`` when set; a
dilation of 1 is always acceptable): D=8, max 4 -> k=2; D=128, max 4 -> k=32; D=5, max 4 -> k=5. An axis
whose kernel extent is 1 only has its dilation reset (it reads one tap; the dilation is meaningless).

Per split axis the conv reads exactly ``q*k`` samples, where q = (ceil(O/T) - 1)*(s/p) + (K-1)*D' + 1 is the
shortest per-phase length that yields ceil(O/T) outputs. Whole blocks of k padding samples are whole zero
rows of every phase, so the new Conv pads them itself (pads floor(pb/k) and floor(E/k) rows, E the end padding
needed — never more than the original pads, divided by k); only the remainders (< k per side) are padded
explicitly, which disappears when the Conv's pads and the length are multiples of k (the usual TCN case).
The remainder padding takes the target's form (``remainder_pad``, :func:`padding_steps`): ``concat`` (the
default) concatenates constant zero blocks along each padded axis; ``pad4d`` pads a rank-3 tensor on its
[B,C,1,L] view; ``pad`` is one Pad of the tensor's rank — tpu-mlir 1.30.2 aborts in codegen on that rank-3
Pad before the phase Reshape (``getI64Array: Assertion arr->size() == num_elem``) and compiles the other two.
All three are the same zeros in the same places. The per-phase outputs are interleaved back
and a Slice crops to O. When k divides the stride (T = 1) only phase 0 is read: the split is a strided Slice
``[0 : q*k : k]`` (which also drops the trailing samples the floor mode ignores) and no phase axis is needed
("direct" in the report).

MACs: the Conv computes T*ceil(O/T) outputs where the original computed O, so the conv MAC count is unchanged
whenever T divides O (e.g. a TCN with L a multiple of k) and otherwise grows by fewer than T output positions
per axis; the report gives each node's MACs before/after and the metrics the whole graph's. Nodes added per
conv: spatial 1-D at most 5 (Pad, Reshape, phase Slice with a stride, Reshape, Slice; 2 Reshapes on a TCN),
channel/batch 1-D at most 8, 2-D dilated on both axes at most 12.

Layouts (``s2b_layout``), all exact, all built from Pad, Reshape, Slice, Transpose and Conv with constant
shape inputs and static shapes, no tensor above rank 4 for 1-D and 2-D convs::

    spatial  (1-D convs: [B,C,L], or [B,C,1,L]/[B,C,L,1] with kernel 1 on the unit axis)
             x (-> Pad) -> Reshape [B,C,q,k] (-> Slice phases step p) -> Conv kernel [K,1], dilation [D',1],
             stride [s/p,1], pads on the row axis only -> Reshape [B,M,oq*T] (-> Slice [0:O])
             The phases are a trailing axis the [K,1] kernel never mixes: no Transpose, no weight tiling,
             batch unchanged, rank 4. Weights are reshaped [M,C/g,K] -> [M,C/g,K,1].
    channel  phases to channels, phase-major (channel r*C + c), so any group works: group g -> g*T and the
             weights (and bias) tiled T times along the output axis. Per split axis:
             Reshape [B, C*S<a*q, k, S>a] (-> Slice) -> Transpose(0,2,1,3) -> Reshape [B, T*C, ..., q, ...]
             and the mirror image after the Conv. A conv dilated on both axes is split one axis after the
             other, so every intermediate tensor stays 4-D (consecutive Reshapes are merged). Batch unchanged.
    batch    phases to the batch axis, [B,C,L] -> [T*B,C,q] (phase-major), same Reshape/Transpose pattern
             with B folded into the second axis; no weight tiling. For NPUs that accept batch > 1.
    auto     of the layouts that can rewrite the conv — spatial (1-D convs only), channel, and batch unless
             ``batch_one`` (Ethos-U, Neutron want batch 1) — whose ops avoid ``forbidden_ops`` and that the
             target runs on its NPU (``s2b_layouts``), the cheapest: fewest weight elements, then MACs, then
             added ops (on a tie, that order). A 2-D conv therefore takes batch where batch > 1 is allowed
             (channel tiles its weights T times: DeepLabV3's ASPP +98%), channel where it is not.

A forced ``spatial`` on a genuinely 2-D conv is impossible at rank 4 without a Transpose (the phase index is
the innermost one of the innermost conv axis); that node falls back to ``channel`` with a warning, or is
rejected when Transpose is forbidden.

QDQ: when the Conv input comes from a per-tensor int8/uint8 DequantizeLinear, every input-side op (Pad / Concat
with zeros, Reshape, Slice, Transpose) is a canonical QDQ unit ``DQ -> op -> Q`` with that DQ's parameters, as
onnxruntime's quantizer emits them, the last one's DQ feeding the Conv; when the Conv's only consumer is a
per-tensor QuantizeLinear, the output-side ops are units with that Q's parameters, the last Q writing the old Q's
output. So the DQ -> Conv -> Q pattern that quantized compilers fuse stays adjacent and no op but Q / DQ reads or
writes an integer activation (Qualcomm HTP rejects a Concat on raw uint8 tensors, error 3110).
Exact: each op only moves values or fills zeros, and ``Q(DQ(q)) = q``, ``Q(0) = zp``. A weight (or bias) read
through DequantizeLinear keeps its DQ: the quantized initializer is reshaped/tiled (and a per-output-channel
scale/zero point tiled with it); a DQ also read elsewhere gets a private copy.

Dead taps first. A tap j of an axis reads xp[o*s + j*D] for o = 0..O-1; when every one of those positions lies
in the zero padding (D at least the input length: an ASPP conv with dilation 36 on an 8x8 map, a TCN block on
a short clip), the tap contributes exactly 0. The live taps j0..j1 are kept — kernel K' = j1 - j0 + 1, pads
(pb - j0*D, pe - (K-1-j1)*D), which leaves O unchanged and every output reading the same samples — and an
axis left with one tap needs no dilation at all. This is exact, lowers MACs and weights, and often removes
the need for space-to-batch; it is applied only to convs over the limit, with constant weights, and only when
the new pads stay non-negative ("trim dead taps" in the report). A QDQ conv's weights, ``DequantizeLinear(Wq,
scale, zp)`` read by that conv alone, are trimmed on the integer side: the live taps of ``Wq`` keep their scale
(per tensor, or per output channel: axis 0, which a spatial slice leaves alone), so every remaining weight
dequantizes to the same float and the dropped ones only ever met zero padding.

Lifting 1-D convs (``lift_conv1d``, before everything else): every Conv on a static [B,C,L] input becomes
Reshape [B,C,1,L] -> Conv (kernel [1,K], dilation [1,D], stride [1,s], pads [0,pb,0,pe], weights reshaped
[M,C/g,K] -> [M,C/g,1,K]) -> Reshape [B,M,O]: each output reads the same samples with the same weights. The
lifted conv is then split like any [B,C,1,L] conv (spatial layout), and the Reshapes the lift and the split emit
back to back are merged (Reshape(Reshape(x, s1), s2) = Reshape(x, s2)). A QDQ conv keeps DQ -> Conv -> Q adjacent:
the Reshapes move to the quantized side as above.

Do no harm (``s2b_layouts``): a target may list the layouts whose ops its compiler keeps on the NPU (rknn runs
the channel / batch layouts' Transpose and Reshape on the CPU). ``auto`` tries only those; when none of them can
rewrite a conv (a genuinely 2-D conv has no spatial layout), the rewrite would only move work to the CPU, so the
conv is left with a Rejection that says so, unless ``force_rewrite``. An explicit ``s2b_layout`` is honoured with
a warning.

Left alone with a blocking Rejection: a non-static input shape (the reason names ``--input-shape``), an
unknown kernel, stride with no usable k, opset < 11, layouts whose needed ops are forbidden, channel layout
with non-constant weights when batch is not possible, and ConvTranspose with a dilation above the limit
(not rewritten by this pass).

Find, then rewrite. :meth:`DilatedConvPass.find` decides everything without editing the model: the 1-D lifts
(:class:`LiftPlan`), the dead-tap trims (:class:`TrimPlan`) and each space-to-batch (:class:`SpaceToBatchPlan`:
layout, k per axis, every emitted op with its shape and constants), and why each refused conv is refused. A
decision that depends on an earlier edit (the split of a lifted or trimmed conv) is made on find's own record of
the conv as that edit leaves it (:class:`_Conv`), not on an edited copy of the model.
:meth:`DilatedConvPass.rewrite` applies the plans it is given — lifts, then trims, then splits — and decides
nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx
from onnx import helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import (
    ConvGeometry,
    GraphEditor,
    GraphIndex,
    Shape,
    conv_geometry,
    conv_macs,
    format_shape,
    get_attr,
    opset_version,
    payload_bytes,
    private_initializer,
    set_attr,
)
from onnx_npu_fix.ir.ops import is_default_domain
from onnx_npu_fix.ir.qdq import qoperator_reason, quantized_const
from onnx_npu_fix.passes.base import Change, Fact, Fixes, Form, Found, Pass, PassResult, Plan, Rejection

_MIN_OPSET = 11  # Pad with a pads input, Slice with steps
_WEIGHT_GROWTH_WARNING = 16 << 20  # bytes of tiled weights above which the report suggests the batch layout
_MOVABLE_QTYPES = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)


class _Skip(Exception):
    """A candidate cannot be rewritten (in one layout); the message is the reason."""


# --- choosing k ----------------------------------------------------------------------------------------


def dilation_ok(d: int, max_dilation: int | None, allowed: Sequence[int] | None) -> bool:
    """Whether a dilation of ``d`` satisfies the target (1 always does: an undilated conv)."""
    if d == 1:
        return True
    if max_dilation is not None and d > max_dilation:
        return False
    return allowed is None or d in allowed


_DILATED_OPS = frozenset({"Conv", "ConvTranspose", "QLinearConv", "ConvInteger"})
"""Every op :func:`_find_trims` and :func:`_find_splits` look at (in any domain: a superset of theirs)."""


def _within_limit(dilations: Sequence[int], options: FixOptions) -> bool:
    return all(dilation_ok(d, options.max_dilation, options.allowed_dilations) for d in dilations)


def block_size(dilation: int, *, max_dilation: int | None, allowed: Sequence[int] | None = None,
               stride: int = 1) -> int | None:
    """The smallest divisor k of ``dilation`` with dilation/k acceptable and ``stride % k == 0 or
    k % stride == 0`` (the condition for an exact phase split with one Conv); None if there is none."""
    for k in range(1, dilation + 1):
        if dilation % k or not dilation_ok(dilation // k, max_dilation, allowed):
            continue
        if stride % k == 0 or k % stride == 0:
            return k
    return None


# --- the plans -----------------------------------------------------------------------------------------


@dataclass
class _Split:
    """One spatial axis cut into k phases (see the module docstring for the symbols)."""

    axis: int  # spatial axis index (0 = first spatial axis)
    k: int
    dilation: int
    stride: int
    kernel: int
    length: int  # L
    pad_begin: int
    pad_end: int
    out_len: int  # O

    @property
    def step(self) -> int:  # p: keep every p-th phase
        return math.gcd(self.k, self.stride)

    @property
    def phases(self) -> int:  # T
        return self.k // self.step

    @property
    def new_dilation(self) -> int:
        return self.dilation // self.k

    @property
    def new_stride(self) -> int:
        return self.stride // self.step

    @property
    def out_q(self) -> int:  # outputs per phase
        return -(-self.out_len // self.phases)

    @property
    def q(self) -> int:  # rows per phase on the input side
        return (self.out_q - 1) * self.new_stride + (self.kernel - 1) * self.new_dilation + 1

    @property
    def end_adjust(self) -> int:  # samples to add (or, if negative, drop) after the begin pad
        return self.q * self.k - self.length - self.pad_begin

    # Whole blocks of k padding samples are whole zero rows of every phase: the new Conv pads them itself.
    @property
    def rows_begin(self) -> int:
        return self.pad_begin // self.k

    @property
    def rows_end(self) -> int:
        return max(self.end_adjust, 0) // self.k

    @property
    def q_data(self) -> int:  # rows per phase the data path carries (q minus the rows the Conv pads)
        return self.q - self.rows_begin - self.rows_end


@dataclass
class _Step:
    """One emitted op on the data path: ``op(current, *consts)`` with ``shape`` as its output shape."""

    op: str
    tag: str
    shape: list[int]
    consts: list[np.ndarray] = field(default_factory=list)  # each becomes a new initializer
    attrs: dict[str, Any] = field(default_factory=dict)
    data_slot: int = 0  # where the current tensor goes among the inputs (Concat [zeros, x, zeros]: 1)


@dataclass(kw_only=True)
class ConvPlan(Plan):
    """An edit of one Conv. ``nodes`` names the conv when the pass leaves it within the dilation limit (or lifts a
    conv that has none) and is empty for a lift or trim of a conv whose space-to-batch is then refused: that edit
    is made, but the conv keeps its violation (``--check`` gives the refusal's reason)."""

    output: str
    """The conv's output in the model find read: it names the conv (node names may be empty or repeat)."""
    lifted: bool = False
    """Made on the conv as its :class:`LiftPlan` leaves it: applies only together with that plan."""


@dataclass(kw_only=True)
class TrimPlan(ConvPlan):
    """Drop the kernel taps that only read zero padding: the live taps' weights, attributes old -> new."""

    weight: np.ndarray
    old: dict[str, list[int]]
    new: dict[str, list[int]]
    macs: list[int]  # before, after
    quantized: bool = False  # ``weight`` is the integer input of the conv's own weight DequantizeLinear


@dataclass(kw_only=True)
class ReplacePlan(ConvPlan):
    """Replace the conv by ``pre`` ops -> a new Conv -> ``post`` ops (a lift or a space-to-batch)."""

    layout: str
    pre: list[_Step]
    post: list[_Step]
    conv_attrs: dict[str, Any]
    weight_op: str  # "keep" | "reshape" | "tile"
    weight_shape: list[int]
    tile: int
    dq_input: bool  # the input-side ops are QDQ units on the grid of the conv's DequantizeLinear
    q_output: bool  # the output-side ops are QDQ units on the grid of the conv's QuantizeLinear


@dataclass(kw_only=True)
class LiftPlan(ReplacePlan):
    """Run a 1-D Conv as a 4-D one (``lift_conv1d``): Reshape [B,C,1,L] -> Conv -> Reshape [B,M,O]."""


@dataclass(kw_only=True)
class SpaceToBatchPlan(ReplacePlan):
    """The phase split of a conv over the limit (or only the reset of kernel-1 axes' dilations)."""

    splits: list[_Split]
    reset_axes: dict[int, int]  # kernel-1 axes whose dilation is only reset: axis -> new dilation
    old_dilations: list[int]
    macs_before: int
    macs_after: int
    warning: str | None = None

    def new_dilations(self) -> list[int]:
        dilations = list(self.old_dilations)
        for axis, d in self.reset_axes.items():
            dilations[axis] = d
        for s in self.splits:
            dilations[s.axis] = s.new_dilation
        return dilations


# --- find's record of a conv -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """Where a weight or bias comes from."""

    kind: str  # "const" | "dq" (a DequantizeLinear of constants) | "dynamic"
    blocked: bool = False  # dq: blocked quantization
    scale_size: int = 1  # dq: elements of the scale
    axis: int = 1  # dq: the quantized axis, non-negative


@dataclass
class _Conv:
    """A Conv as planning reads it: from the graph (:func:`_read_conv`), or as this pass's earlier plans leave it
    (:func:`_lifted`, :func:`_trimmed`) — find's own record instead of an edited copy of the model."""

    node: onnx.NodeProto  # in the model find reads: name, op, inputs and outputs
    dilations: list[int]  # the attribute ([] when absent)
    x_shape: Shape | None  # the input's recorded shape (symbolic dims kept, for the message)
    w_shape: tuple[int, ...] | None
    out_shape: tuple[int, ...] | None
    geo: ConvGeometry | None  # None when the kernel is unknown
    weight: np.ndarray | None  # constant weights
    weights: _Source | None
    bias: _Source | None
    dq_input: bool  # the input comes from a per-tensor 8-bit DequantizeLinear (:func:`_quantized_input`)
    q_output: bool  # the only reader is a per-tensor QuantizeLinear (:func:`_quantized_output`)
    data_type: int  # of the tensor the input-side ops read (the float one, also with dq_input)
    kernel_attr: bool  # the node spells out kernel_shape
    lifted: bool = False
    weight_quantized: bool = False  # ``weight`` holds the integers of a DequantizeLinear only this conv reads

    @property
    def in_shape(self) -> tuple[int, ...] | None:
        shape = self.x_shape
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        return tuple(shape)

    @property
    def macs(self) -> int:
        """Multiply-accumulates, as :func:`~onnx_npu_fix.ir.graph.node_macs` counts them (0 if unknown)."""
        if self.w_shape is None or self.out_shape is None:
            return 0
        return int(np.prod(self.out_shape, dtype=np.int64)) * int(np.prod(self.w_shape[1:], dtype=np.int64))


def _dilations(node: onnx.NodeProto) -> list[int]:
    return [int(d) for d in (get_attr(node, "dilations") or [])]


def _read_conv(index: GraphIndex, node: onnx.NodeProto, options: FixOptions) -> _Conv:
    w_name = node.input[1] if len(node.input) > 1 else ""
    # Weight values are only read for a conv over the limit (its dead taps): a lift needs none.
    over = not _within_limit(_dilations(node), options)
    weight = index.const_value(w_name) if w_name and over else None
    quantized = weight is None and over and _trimmable_quantized(index, w_name)
    if quantized:
        weight = index.const_value(index.producer[w_name].input[0])
    try:
        geo: ConvGeometry | None = conv_geometry(index, node)
    except ValueError:  # no kernel_shape and no weight shape
        geo = None
    dq = _quantized_input(index, node)
    return _Conv(
        node=node, dilations=_dilations(node), x_shape=index.shape(node.input[0]),
        w_shape=index.static_shape(w_name) if w_name else None, out_shape=index.static_shape(node.output[0]),
        geo=geo, weight=weight, weights=_weight_source(index, w_name),
        bias=_weight_source(index, node.input[2]) if len(node.input) > 2 else None,
        dq_input=dq is not None, q_output=_quantized_output(index, node) is not None,
        data_type=index.elem_type(node.input[0]) or onnx.TensorProto.FLOAT,
        kernel_attr=get_attr(node, "kernel_shape") is not None, weight_quantized=quantized)


def _trimmable_quantized(index: GraphIndex, w_name: str) -> bool:
    """``w_name`` is a DequantizeLinear of a constant, with a scale per tensor or per output channel (axis 0),
    read by one conv alone: its integer taps can be trimmed without touching anything else."""
    weight = quantized_const(index, w_name) if w_name else None
    return (weight is not None and weight.params.axis in (None, 0) and len(index.consumers_of(w_name)) == 1
            and w_name not in index.output_set)


def _geometry(attrs: dict[str, Any]) -> ConvGeometry:
    """The geometry of a Conv with these attributes (explicit pads): what the rewritten node will read as."""
    return ConvGeometry(helper.make_node("Conv", [], [], **attrs), attrs["kernel_shape"])


def _lifted(conv: _Conv, plan: LiftPlan) -> _Conv:
    """``conv`` as ``plan`` leaves it: the 4-D conv between the two Reshapes (its DQ/Q copies, if any, keep the
    quantized pattern, so the QDQ facts stay)."""
    assert conv.in_shape is not None and conv.w_shape is not None and conv.geo is not None
    batch, _, length = conv.in_shape
    out_len = conv.geo.output_length(0, length)
    weight = None if conv.weight is None else conv.weight.reshape(plan.weight_shape)
    return replace(conv, dilations=list(plan.conv_attrs["dilations"]), x_shape=(batch, conv.in_shape[1], 1, length),
                   w_shape=tuple(plan.weight_shape), out_shape=(batch, conv.w_shape[0], 1, out_len),
                   geo=_geometry(plan.conv_attrs), weight=weight, kernel_attr=True, lifted=True)


def _trimmed(conv: _Conv, plan: TrimPlan) -> _Conv:
    """``conv`` as ``plan`` leaves it: the live taps, new pads, auto_pad gone."""
    assert conv.geo is not None
    attrs = {**plan.new, "strides": conv.geo.strides, "group": conv.geo.group}
    return replace(conv, dilations=list(plan.new["dilations"]), w_shape=tuple(plan.weight.shape),
                   geo=_geometry(attrs), weight=plan.weight, kernel_attr=True)


# --- the pass ----------------------------------------------------------------------------------------


def _rank3_pad(index: GraphIndex, node: onnx.NodeProto, options: FixOptions) -> int | None:
    shape = index.shape(node.input[0])
    return 3 if shape is not None and len(shape) == 3 else None


def _conv1d(index: GraphIndex, node: onnx.NodeProto, options: FixOptions) -> int | None:
    shape = index.shape(node.input[0])
    return 1 if shape is not None and len(shape) == 3 else None


def _dilation(index: GraphIndex, node: onnx.NodeProto, options: FixOptions) -> int | None:
    dilation = max(conv_geometry(index, node).dilations or [1])
    return dilation if dilation > 1 else None


def _dilation_limits(current: int | None, region: Sequence[onnx.NodeProto]) -> list[int]:
    """``max_dilation`` values worth trying: for each dilation d of a Conv in the region, d - 1 (the pass then
    rewrites that conv), largest first, below the current limit; then half the current limit (another k)."""
    dilations = {max(get_attr(n, "dilations", None) or [1]) for n in region if n.op_type == "Conv"}
    below = [d - 1 for d in sorted(dilations, reverse=True) if d > 1 and (current is None or d - 1 < current)]
    halved = [current // 2] if current is not None and current > 1 else []
    return list(dict.fromkeys([*below, *halved]))

class DilatedConvPass(Pass):
    """Dilated Conv via space-to-batch (module docstring). ``find`` plans the 1-D lifts, the dead-tap trims and
    the splits, each on its record of the conv as the plans before leave it; ``rewrite`` applies them in order."""
    name = "dilated-conv"
    summary = "rewrite Conv with dilation > --max-dilation by an exact space-to-batch (Pad/Reshape/Slice)"
    exact = True
    fixes = (Fixes("dilation", note="not for ConvTranspose / QOperator convs"),
             Fixes("dilation-allowed", note="not for ConvTranspose / QOperator convs"))
    forms = (
        Form("remainder_pad", ("Pad", "Concat", "Reshape"), "how a remainder (< k samples) is padded before the "
             "phase Reshape: a Concat with zeros, a Pad on a 4-D view, or a plain Pad", cost=20,
             facts=(Fact("Pad", "rank-{} Pad (dilated-conv's remainder form: concat / pad4d avoid it)", _rank3_pad),)),
        Form("lift_conv1d", ("Reshape", "Conv"), "whether a 1-D Conv runs as a 4-D one (kernel [1,K])", cost=30,
             facts=(Fact("Conv", "{}-D Conv (run as a 4-D one, kernel [1,K])", _conv1d),)),
        Form("s2b_layout", ("Reshape", "Transpose", "Conv", "Slice", "Pad", "Concat"), "where the space-to-batch "
             "phases go: the spatial axes, the channels or the batch", cost=40),
        Form("max_dilation", ("Reshape", "Transpose", "Conv", "Slice", "Pad", "Concat"), "the largest dilation "
             "left, which sets the block size k of the rewrite", cost=50, values=_dilation_limits,
             facts=(Fact("Conv", "Conv dilation {} (space-to-batch rewrites it)", _dilation),)),
    )

    def find(self, model: onnx.ModelProto, options: FixOptions) -> Found:
        found = Found()
        limited = options.max_dilation is not None or options.allowed_dilations is not None
        if not limited and not options.lift_conv1d:
            return found
        if not options.lift_conv1d and all(node.op_type not in _DILATED_OPS or _within_limit(_dilations(node), options)
                                           for node in model.graph.node):
            return found  # no conv over the limit: trims and splits look at nothing else (no index built)
        index = GraphIndex(model)
        convs: dict[str, _Conv] = {}  # conv output -> the conv as the plans so far leave it
        if options.lift_conv1d:
            _find_lifts(index, options, found, convs)
        if limited:
            _find_trims(index, options, found, convs)
            _find_splits(index, options, found, convs)
        return found

    def rewrite(self, model: onnx.ModelProto, options: FixOptions, found: Found) -> PassResult:
        result = PassResult(rejections=list(found.rejections))
        if not found.plans:
            return result
        index = GraphIndex(model)
        macs_before = conv_macs(model, index)
        weights_before = sum(payload_bytes(t) for t in model.graph.initializer)  # the pass line's growth %
        lifted: dict[str, str] = {}  # a lifted conv's output in the model find read -> the 4-D conv's output
        emitted: set[str] = set()  # names of the Reshape nodes this pass emits (merged at the end)
        lifts = [plan for plan in found.plans if isinstance(plan, LiftPlan)]
        if lifts:
            _apply_lifts(index, lifts, result, lifted, emitted)
            index = GraphIndex(model)  # the 1-D convs are 4-D now
        trims = [plan for plan in found.plans if isinstance(plan, TrimPlan)]
        if trims:
            _apply_trims(index, trims, result, lifted)
            index = GraphIndex(model)  # weight shapes changed
        splits = [plan for plan in found.plans if isinstance(plan, SpaceToBatchPlan)]
        totals = _apply_splits(index, splits, result, lifted, emitted)
        _merge_reshape_chains(model, emitted)  # the lift's Reshapes and the phase split's become one each
        if options.max_dilation is not None or options.allowed_dilations is not None:
            result.metrics.update({
                "conv_macs_before": macs_before,
                "conv_macs_after": macs_before + totals["macs_added"],
                "convs_rewritten": len(splits),
                "nodes_added": totals["nodes_added"],
                "weight_bytes_added": totals["weight_bytes_added"],
                "weight_bytes_before": weights_before,
            })
        return result


# --- find ----------------------------------------------------------------------------------------------


def _find_lifts(index: GraphIndex, options: FixOptions, found: Found, convs: dict[str, _Conv]) -> None:
    """A :class:`LiftPlan` for every 1-D Conv (``lift_conv1d``), or why not."""
    for node in index.graph.node:
        if not is_default_domain(node) or node.op_type != "Conv" or len(node.input) < 2:
            continue
        shape = index.shape(node.input[0])
        if shape is None or len(shape) != 3:
            continue
        conv = _read_conv(index, node, options)
        try:
            plan = _plan_lift(conv, options)
        except _Skip as skip:
            found.rejections.append(Rejection(node.name, node.op_type, f"not lifted to 4-D: {skip}"))
            continue
        found.plans.append(plan)
        convs[node.output[0]] = _lifted(conv, plan)


def _find_trims(index: GraphIndex, options: FixOptions, found: Found, convs: dict[str, _Conv]) -> None:
    """A :class:`TrimPlan` for every conv over the limit with dead taps (module docstring)."""
    for node in index.graph.node:
        if not is_default_domain(node) or node.op_type != "Conv" or len(node.input) < 2:
            continue
        conv = convs.get(node.output[0])
        if _within_limit(conv.dilations if conv is not None else _dilations(node), options):
            continue
        conv = convs[node.output[0]] = conv or _read_conv(index, node, options)
        trim = _plan_trim(conv)
        if isinstance(trim, Rejection):
            found.rejections.append(trim)
        elif trim is not None:
            found.plans.append(trim)
            convs[node.output[0]] = _trimmed(conv, trim)


def _find_splits(index: GraphIndex, options: FixOptions, found: Found, convs: dict[str, _Conv]) -> None:
    """A :class:`SpaceToBatchPlan` for every conv still over the limit, or a blocking Rejection."""
    opset = opset_version(index.model)
    for node in index.graph.node:
        if node.op_type in ("QLinearConv", "ConvInteger"):
            if not _within_limit(_dilations(node), options):
                found.rejections.append(Rejection(node.name, node.op_type, qoperator_reason(node), True))
            continue
        if not is_default_domain(node) or node.op_type not in ("Conv", "ConvTranspose"):
            continue
        conv = convs.get(node.output[0])
        dilations = conv.dilations if conv is not None else _dilations(node)
        if _within_limit(dilations, options):
            continue
        if node.op_type == "ConvTranspose":
            found.rejections.append(Rejection(
                node.name, node.op_type, f"ConvTranspose dilations {dilations} are not rewritten by "
                f"dilated-conv", blocking=True))
            continue
        try:
            found.plans.append(_plan(conv or _read_conv(index, node, options), options, opset, index.graph_inputs))
        except _Skip as skip:
            found.rejections.append(Rejection(node.name, node.op_type, str(skip), blocking=True))
            for plan in found.plans:  # its lift or trim is still made, but fixes nothing
                if isinstance(plan, ConvPlan) and plan.output == node.output[0]:
                    plan.nodes = ()


# --- lifting 1-D convs to 4-D ----------------------------------------------------------------------------


def _plan_lift(conv: _Conv, options: FixOptions) -> LiftPlan:
    """x [B,C,L] -> Reshape [B,C,1,L] -> Conv with kernel [1,K], dilation [1,D], stride [1,s], pads [0,pb,0,pe]
    -> [B,M,1,O] -> Reshape [B,M,O]. The 4-D conv reads the same samples with the same weights (reshaped
    [M,C/g,K] -> [M,C/g,1,K]): exact."""
    node = conv.node
    in_shape, w_shape, geo = conv.in_shape, conv.w_shape, conv.geo
    if in_shape is None:
        raise _Skip(f"input '{node.input[0]}' has no static shape; freeze it with --input-shape")
    if w_shape is None or len(w_shape) != 3:
        raise _Skip("weight shape unknown")
    assert geo is not None  # the weight shape gives the kernel
    if not geo.resolved:
        raise _Skip(f"auto_pad {geo.auto_pad} could not be resolved")
    if "Reshape" in options.forbidden_ops:
        raise _Skip("needs Reshape, which the target forbids")
    _check_weight(conv.weights, "reshape", "weights")
    batch, channels, length = in_shape
    out_len = geo.output_length(0, length)
    view, final = [batch, channels, 1, length], [batch, w_shape[0], out_len]
    begin, end = geo.pad_pair(0)
    attrs = {"kernel_shape": [1, geo.kernel[0]], "dilations": [1, geo.dilations[0]],
             "strides": [1, geo.strides[0]], "pads": [0, begin, 0, end], "group": geo.group}
    return LiftPlan(nodes=(node.name,), action="lift 1-D conv to 4-D", output=node.output[0], layout="lift",
                    pre=[_Step("Reshape", "lift_in", view, [np.array(view, np.int64)])],
                    post=[_Step("Reshape", "lift_out", final, [np.array(final, np.int64)])],
                    conv_attrs=attrs, weight_op="reshape", weight_shape=[w_shape[0], w_shape[1], 1, geo.kernel[0]],
                    tile=1, dq_input=conv.dq_input, q_output=conv.q_output)


# --- dead taps ---------------------------------------------------------------------------------------


def _live_taps(kernel: int, dilation: int, stride: int, begin: int, length: int, out_len: int) -> list[int]:
    """Taps j whose positions o*s + j*D - begin (o < out_len) ever land inside [0, length)."""
    live = []
    for j in range(kernel):
        first = -(-(begin - j * dilation) // stride)            # smallest o with position >= 0
        last = (length - 1 + begin - j * dilation) // stride    # largest o with position <= length-1
        if max(first, 0) <= min(last, out_len - 1):
            live.append(j)
    return live


def _live_window(geo: ConvGeometry, in_shape: Sequence[int],
                 ndim: int) -> tuple[list[slice], list[int], list[int]] | None:
    """Per axis the live taps j0..j1 (as weight slices), the pads and dilations that keep every output reading
    the same samples; None when no tap can go."""
    n = geo.rank
    slices: list[slice] = [slice(None)] * ndim
    pads = list(geo.pads)
    new_dil = list(geo.dilations)
    for a in range(n):
        length = in_shape[2 + a]
        begin, end = geo.pad_pair(a)
        live = _live_taps(geo.kernel[a], geo.dilations[a], geo.strides[a], begin,
                          length, geo.output_length(a, length))
        if not live or (live[0] == 0 and live[-1] == geo.kernel[a] - 1):
            continue
        j0, j1 = live[0], live[-1]
        new_begin = begin - j0 * geo.dilations[a]
        new_end = end - (geo.kernel[a] - 1 - j1) * geo.dilations[a]
        if new_begin < 0 or new_end < 0:
            continue
        slices[2 + a] = slice(j0, j1 + 1)
        pads[a], pads[a + n] = new_begin, new_end
        if j1 == j0:
            new_dil[a] = 1  # one tap left: the dilation means nothing
    if all(sl == slice(None) for sl in slices):
        return None
    return slices, pads, new_dil


def _plan_trim(conv: _Conv) -> TrimPlan | Rejection | None:
    """The dead-tap trim of a conv over the limit (module docstring); a Rejection when a dead tap's weight is
    not finite; None when no tap can go."""
    node, geo, weight, in_shape = conv.node, conv.geo, conv.weight, conv.in_shape
    if in_shape is None or weight is None or geo is None or not geo.resolved:
        return None
    if conv.weight_quantized and conv.lifted:
        return None  # the lift reshapes the weight behind its DequantizeLinear: trimmed as a 1-D conv is not
    window = _live_window(geo, in_shape, weight.ndim)
    if window is None:
        return None
    slices, pads, new_dil = window
    dropped = np.ones(weight.shape, bool)
    dropped[tuple(slices)] = False
    if np.issubdtype(weight.dtype, np.floating) and not np.isfinite(weight[dropped]).all():
        # 0 * NaN is NaN: a tap with a non-finite weight is not dead even where it only reads padding.
        return Rejection(node.name, "Conv", "dead taps not trimmed: their weights hold NaN or infinity, and "
                         "0 * NaN is not 0", False)
    new_weight = np.ascontiguousarray(weight[tuple(slices)])
    macs_old = conv.macs
    macs_new = macs_old * int(np.prod(new_weight.shape[2:])) // max(1, int(np.prod(geo.kernel)))
    return TrimPlan(nodes=(node.name,), action="trim dead taps", output=node.output[0], lifted=conv.lifted,
                    weight=new_weight,
                    old={"kernel_shape": list(geo.kernel), "dilations": list(geo.dilations), "pads": list(geo.pads)},
                    new={"kernel_shape": list(new_weight.shape[2:]), "dilations": new_dil, "pads": pads},
                    macs=[macs_old, macs_new], quantized=conv.weight_quantized)


# --- planning the split --------------------------------------------------------------------------------


@dataclass
class _Frame:
    """One conv's space-to-batch facts, the same for every layout tried."""

    conv: _Conv
    geo: ConvGeometry
    splits: list[_Split]
    reset: dict[int, int]
    in_shape: list[int]
    w_shape: list[int]
    out_lens: list[int]

    @property
    def phased(self) -> list[_Split]:
        return [s for s in self.splits if s.phases > 1]


@dataclass
class _NewConv:
    """The replacing Conv's attributes and shapes, as a layout sets them."""

    kernel: list[int]
    dilations: list[int]
    strides: list[int]
    begins: list[int]
    ends: list[int]
    group: int
    shape: list[int] = field(default_factory=list)
    weight_shape: list[int] = field(default_factory=list)


def _plan(conv: _Conv, options: FixOptions, opset: int, graph_inputs: Sequence[str]) -> SpaceToBatchPlan:
    in_shape, w_shape, geo = _checked_shapes(conv, opset, graph_inputs)
    spatial_in = list(in_shape[2:])
    out_lens = [geo.output_length(a, spatial_in[a]) for a in range(geo.rank)]
    if min(out_lens) < 1:
        raise _Skip(f"output length {out_lens} < 1: the Conv is invalid")
    splits, reset = _splits(geo, spatial_in, out_lens, options)
    frame = _Frame(conv, geo, splits, reset, list(in_shape), list(w_shape), out_lens)
    phased = frame.phased
    one_d = len(phased) == 1 and all(
        spatial_in[a] == 1 and geo.kernel[a] == 1 and geo.pad_pair(a) == (0, 0)
        for a in range(geo.rank) if a != phased[0].axis)
    node = conv.node
    candidates = _npu_layouts(node, _layouts(node, bool(phased), one_d, options), options,
                              explicit=options.s2b_layout != "auto")
    reasons = []
    plans = []
    for layout, warning in candidates:
        try:
            plan = _plan_layout(frame, layout, options)
        except _Skip as skip:
            reasons.append(f"{layout}: {skip}")
            continue
        plan.warning = warning
        plans.append(plan)
    if not plans:
        raise _Skip("; ".join(reasons))
    # --s2b-layout auto: of the layouts the target allows, the cheapest (min keeps the documented order on a tie).
    # The channel layout tiles a 2-D conv's weights T times (DeepLabV3's ASPP: +98% weights) where batch does not.
    return min(plans, key=_layout_cost)


def _layout_cost(plan: SpaceToBatchPlan) -> tuple[int, int, int]:
    """(weight elements, MACs, added ops) of a plan: the order in which a layout's price is compared."""
    return (math.prod(plan.weight_shape), plan.macs_after,  # the bias tiles with the weights: no new order
            len(plan.pre) + len(plan.post))


def _checked_shapes(conv: _Conv, opset: int,
                    graph_inputs: Sequence[str]) -> tuple[tuple[int, ...], tuple[int, ...], ConvGeometry]:
    """The static input and weight shapes and the resolved geometry a split needs, or why it cannot be made."""
    x_name = conv.node.input[0]
    in_shape, w_shape, geo = conv.in_shape, conv.w_shape, conv.geo
    if in_shape is None:
        inputs = ", ".join(graph_inputs) or "<input>"
        raise _Skip(f"input '{x_name}' has no static shape ({format_shape(conv.x_shape)}); the phase split needs "
                    f"static lengths: freeze the graph inputs with --input-shape (inputs: {inputs})")
    if w_shape is None:
        raise _Skip("weight shape unknown")
    if len(in_shape) < 3 or len(w_shape) != len(in_shape):
        raise _Skip(f"unexpected ranks: input {list(in_shape)}, weight {list(w_shape)}")
    if opset < _MIN_OPSET:
        raise _Skip(f"opset {opset} < {_MIN_OPSET} (Pad needs its pads as an input); convert the model first")
    assert geo is not None  # the weight shape gives the kernel
    if not geo.resolved:
        raise _Skip(f"auto_pad {geo.auto_pad} could not be resolved")
    return in_shape, w_shape, geo


def _splits(geo: ConvGeometry, spatial_in: list[int], out_lens: list[int],
            options: FixOptions) -> tuple[list[_Split], dict[int, int]]:
    """The axes to cut into phases (with their k), and the kernel-1 axes whose dilation is only reset."""
    splits: list[_Split] = []
    reset: dict[int, int] = {}
    for a, d in enumerate(geo.dilations):
        if dilation_ok(d, options.max_dilation, options.allowed_dilations):
            continue
        if geo.kernel[a] == 1:
            reset[a] = 1  # one tap: any dilation computes the same thing
            continue
        k = block_size(d, max_dilation=options.max_dilation, allowed=options.allowed_dilations,
                       stride=geo.strides[a])
        if k is None:
            if geo.strides[a] > 1 and block_size(d, max_dilation=options.max_dilation,
                                                 allowed=options.allowed_dilations) is not None:
                raise _Skip(f"dilation {d} with stride {geo.strides[a]} on axis {2 + a}: no block size k "
                            f"dividing {d} with an acceptable {d}/k is a divisor or a multiple of the "
                            f"stride, and only then is the phase split one exact Conv")
            raise _Skip(f"dilation {d} on axis {2 + a}: no divisor k gives an acceptable dilation {d}/k")
        begin, end = geo.pad_pair(a)
        splits.append(_Split(axis=a, k=k, dilation=d, stride=geo.strides[a], kernel=geo.kernel[a],
                             length=spatial_in[a], pad_begin=begin, pad_end=end, out_len=out_lens[a]))
    return splits, reset


def _layouts(node: onnx.NodeProto, phased: bool, one_d: bool,
             options: FixOptions) -> list[tuple[str, str | None]]:
    """The layouts to try in order, each with the warning its use gives (module docstring, ``s2b_layout``)."""
    if not phased:
        return [("direct", None)]
    if options.s2b_layout == "auto":
        candidates: list[tuple[str, str | None]] = [("spatial", None)] if one_d else []
        candidates.append(("channel", None))
        if not options.batch_one:
            candidates.append(("batch", None))
        return candidates
    if options.s2b_layout == "spatial" and not one_d:
        return [("channel", f"{node.name}: the spatial layout needs a 1-D conv (the other spatial "
                            f"axes of extent 1, kernel 1, no pads); used the channel layout (emits "
                            f"Transpose)")]
    if options.s2b_layout == "batch" and options.batch_one:
        return [("batch", f"{node.name}: the batch layout runs the conv with batch > 1 although the "
                          f"target requires batch 1")]
    return [(options.s2b_layout, None)]


def _npu_layouts(node: onnx.NodeProto, candidates: list[tuple[str, str | None]], options: FixOptions, *,
                 explicit: bool) -> list[tuple[str, str | None]]:
    """Do no harm: keep only the layouts whose ops the target runs on its NPU (``s2b_layouts``).

    When none is left, rewriting would only move this conv's work onto the target's CPU (e.g. rknn runs the
    Reshape/Transpose of the channel and batch layouts on the CPU, while a genuinely 2-D conv has no spatial
    layout): the conv is left alone with a Rejection that says so, unless ``force_rewrite``. A layout the
    user named explicitly (``--s2b-layout``) is used with a warning."""
    npu = options.s2b_layouts
    if npu is None or all(layout == "direct" or layout in npu for layout, _ in candidates):
        return candidates
    if explicit:
        layout, warning = candidates[0]
        note = (f"{node.name}: the {layout} layout was asked for, but the target runs its ops on the CPU "
                f"(it runs {', '.join(npu) or 'no space-to-batch layout'} on the NPU)")
        return [(layout, f"{warning}; {note}" if warning else note)]
    kept = [(layout, warning) for layout, warning in candidates if layout in npu]
    if kept:
        return kept
    if options.force_rewrite:
        layout, warning = candidates[0]
        note = f"{node.name}: --force-rewrite: the {layout} layout puts ops on the target's CPU"
        return [(layout, f"{warning}; {note}" if warning else note)]
    names = ", ".join(layout for layout, _ in candidates)
    raise _Skip(f"do no harm: the layouts that can rewrite this conv ({names}) run their Reshape/Transpose on "
                f"the target's CPU (it keeps only {', '.join(npu) or 'none'} on the NPU), so the rewrite would "
                f"move work from the NPU to the CPU; left as it is (--force-rewrite rewrites it anyway)")


def _plan_layout(f: _Frame, layout: str, options: FixOptions) -> SpaceToBatchPlan:
    """The split of ``f`` in one layout: input padding, phase split, the new Conv, phase merge, crop."""
    tile = math.prod(s.phases for s in f.splits) if layout == "channel" else 1  # T = 1 for strided axes
    pre, cur = _input_padding(f, options)
    new = _split_conv(f)
    pre.extend(_subsample(f, cur))
    post: list[_Step] = []
    if layout == "spatial":
        _spatial_layout(f, new, pre, post)
    elif layout in ("channel", "batch"):
        _stacked_layout(f, layout, new, cur, pre, post, tile)
    else:  # direct: no axis has more than one phase
        new.shape = f.in_shape[:1] + f.w_shape[:1] + f.out_lens
        new.weight_shape = list(f.w_shape)
    post.extend(_crop(f))
    return _finish(f, layout, new, pre, post, tile, options)


def _input_padding(f: _Frame, options: FixOptions) -> tuple[list[_Step], list[int]]:
    """One padding for all split axes: the conv's begin pad plus whatever end padding q*k needs, less the whole
    blocks of k the new Conv pads itself. Phase-split axes never need fewer samples than they have (q*k >= Lp
    there); subsampled axes (k | s) may, and their strided Slice simply stops at q*k. Returns the steps and the
    padded shape."""
    cur = list(f.in_shape)
    pads = [0] * (2 * len(cur))
    for s in f.splits:
        pads[2 + s.axis] = s.pad_begin - s.rows_begin * s.k
        pads[len(cur) + 2 + s.axis] = max(s.end_adjust, 0) - s.rows_end * s.k
        cur[2 + s.axis] = s.length + pads[2 + s.axis] + pads[len(cur) + 2 + s.axis]
        if s.phases > 1 and s.end_adjust < 0:  # pragma: no cover - excluded by the algebra above
            raise _Skip(f"internal: negative end padding on axis {2 + s.axis}")
    if not any(pads):
        return [], cur
    # A quantized input is padded in float too, inside a QDQ unit: Q(0) = zp, so the zeros land on the grid.
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(f.conv.data_type))
    return padding_steps(list(f.in_shape), pads, None, dtype, options.remainder_pad), cur


def _split_conv(f: _Frame) -> _NewConv:
    """The new Conv's attributes: split axes lose their pads and take D/k and s/p; kernel-1 axes' dilation reset."""
    geo = f.geo
    n = geo.rank
    new = _NewConv(kernel=list(geo.kernel), dilations=list(geo.dilations), strides=list(geo.strides),
                   begins=list(geo.pads[:n]), ends=list(geo.pads[n:]), group=geo.group)
    for a, d in f.reset.items():
        new.dilations[a] = d
    for s in f.splits:
        new.dilations[s.axis], new.strides[s.axis] = s.new_dilation, s.new_stride
        new.begins[s.axis], new.ends[s.axis] = s.rows_begin, s.rows_end
    return new


def _subsample(f: _Frame, cur: list[int]) -> list[_Step]:
    """k | stride: only phase 0 is read, so the split is a plain subsampling: one strided Slice, no phases."""
    strided = [s for s in f.splits if s.phases == 1]
    if not strided:
        return []
    for s in strided:
        cur[2 + s.axis] = s.q_data
    return [_Step("Slice", "subsample", list(cur), [
        np.zeros(len(strided), np.int64), np.array([s.q_data * s.k for s in strided], np.int64),
        np.array([2 + s.axis for s in strided], np.int64), np.array([s.k for s in strided], np.int64)])]


def _spatial_layout(f: _Frame, new: _NewConv, pre: list[_Step], post: list[_Step]) -> None:
    """Phases as a trailing axis the [K,1] kernel never mixes: no Transpose, no weight tiling."""
    s = f.phased[0]
    batch, channels, out_channels = f.in_shape[0], f.in_shape[1], f.w_shape[0]
    pre.append(_Step("Reshape", "phases", [batch, channels, s.q_data, s.k], [np.array(
        [batch, channels, s.q_data, s.k], np.int64)]))
    if s.step > 1:
        pre.append(_Step("Slice", "phase_step", [batch, channels, s.q_data, s.phases],
                         _slice_consts(3, 0, s.k, s.step)))
    new.kernel, new.dilations, new.strides = [s.kernel, 1], [s.new_dilation, 1], [s.new_stride, 1]
    new.begins, new.ends = [s.rows_begin, 0], [s.rows_end, 0]
    new.shape = [batch, out_channels, s.out_q, s.phases]
    merged = [batch, out_channels] + [1] * f.geo.rank
    merged[2 + s.axis] = s.out_q * s.phases
    post.append(_Step("Reshape", "merge", merged, [np.array(merged, np.int64)]))
    new.weight_shape = [f.w_shape[0], f.w_shape[1], s.kernel, 1]


def _stacked_layout(f: _Frame, layout: str, new: _NewConv, cur: list[int], pre: list[_Step], post: list[_Step],
                    tile: int) -> None:
    """Phases stacked on the channel axis (groups and weights tiled) or the batch axis (nothing tiled)."""
    batch = _phases_in(f, layout, cur, pre)
    new.group = f.geo.group * tile
    out_sp = list(f.out_lens)
    for s in f.phased:
        out_sp[s.axis] = s.out_q
    new.shape = [batch, f.w_shape[0] * tile] + out_sp
    _phases_out(f, layout, new.shape, post)
    new.weight_shape = [f.w_shape[0] * tile] + list(f.w_shape[1:])


def _phases_in(f: _Frame, layout: str, cur: list[int], pre: list[_Step]) -> int:
    """Per split axis: Reshape [B, C*S<a*q, k, S>a] (-> Slice) -> Transpose(0,2,1,3) -> Reshape [B, T*C, ..., q,
    ...] (the batch layout folds B into the second axis). Returns the conv's batch."""
    cur_n, cur_c = f.in_shape[0], f.in_shape[1]
    for s in f.phased:
        sp = cur[2:]
        a_dim = cur_c * math.prod(sp[:s.axis]) * s.q_data
        z_dim = math.prod(sp[s.axis + 1:])
        lead, mid = (cur_n, a_dim) if layout == "channel" else (1, cur_n * a_dim)
        pre.append(_Step("Reshape", f"phases{2 + s.axis}", [lead, mid, s.k, z_dim],
                         [np.array([lead, mid, s.k, z_dim], np.int64)]))
        if s.step > 1:
            pre.append(_Step("Slice", f"phase_step{2 + s.axis}", [lead, mid, s.phases, z_dim],
                             _slice_consts(2, 0, s.k, s.step)))
        pre.append(_Step("Transpose", f"phases_out{2 + s.axis}", [lead, s.phases, mid, z_dim],
                         attrs={"perm": [0, 2, 1, 3]}))
        if layout == "channel":
            cur_c *= s.phases
        else:
            cur_n *= s.phases
        sp = list(sp)
        sp[s.axis] = s.q_data
        cur = [cur_n, cur_c] + sp
        pre.append(_Step("Reshape", f"phases_to_{layout}{2 + s.axis}", list(cur), [np.array(cur, np.int64)]))
    return cur_n


def _phases_out(f: _Frame, layout: str, conv_shape: list[int], post: list[_Step]) -> None:
    """The mirror image of :func:`_phases_in` after the Conv, last split axis first."""
    cur = list(conv_shape)
    for s in reversed(f.phased):
        o_n, o_c, sp = cur[0], cur[1], cur[2:]
        a_dim = (o_c // s.phases if layout == "channel" else o_c) * math.prod(sp[:s.axis]) * s.out_q
        z_dim = math.prod(sp[s.axis + 1:])
        lead, mid = (o_n, a_dim) if layout == "channel" else (1, (o_n // s.phases) * a_dim)
        post.append(_Step("Reshape", f"phases_in{2 + s.axis}", [lead, s.phases, mid, z_dim],
                          [np.array([lead, s.phases, mid, z_dim], np.int64)]))
        post.append(_Step("Transpose", f"phases_back{2 + s.axis}", [lead, mid, s.phases, z_dim],
                          attrs={"perm": [0, 2, 1, 3]}))
        sp = list(sp)
        sp[s.axis] = s.out_q * s.phases
        cur = ([o_n, o_c // s.phases] if layout == "channel" else [o_n // s.phases, o_c]) + sp
        post.append(_Step("Reshape", f"merge{2 + s.axis}", list(cur), [np.array(cur, np.int64)]))


def _crop(f: _Frame) -> list[_Step]:
    """The final Slice back to the original output lengths, where the phases computed more."""
    final = f.in_shape[:1] + f.w_shape[:1] + f.out_lens
    crop_axes = [2 + s.axis for s in f.splits if s.out_q * s.phases != s.out_len]
    if not crop_axes:
        return []
    return [_Step("Slice", "crop", final, [
        np.zeros(len(crop_axes), np.int64), np.array([final[a] for a in crop_axes], np.int64),
        np.array(crop_axes, np.int64), np.ones(len(crop_axes), np.int64)])]


def _finish(f: _Frame, layout: str, new: _NewConv, pre: list[_Step], post: list[_Step], tile: int,
            options: FixOptions) -> SpaceToBatchPlan:
    """Check the weights and the target's forbidden ops, merge Reshapes, and make the plan."""
    conv = f.conv
    weight_op = "tile" if tile > 1 else "reshape" if new.weight_shape != f.w_shape else "keep"
    _check_weight(conv.weights, weight_op, "weights")
    _check_weight(conv.bias, "tile" if weight_op == "tile" else "keep", "bias")
    pre, post = _merge_reshapes(pre, f.in_shape), _merge_reshapes(post, new.shape)
    forbidden = sorted(({st.op for st in pre + post} | {"Conv"}) & set(options.forbidden_ops))
    if forbidden:
        raise _Skip(f"needs {', '.join(forbidden)}, which the target forbids")
    conv_attrs: dict[str, Any] = {"dilations": new.dilations, "strides": new.strides,
                                  "pads": new.begins + new.ends, "group": new.group}
    if conv.kernel_attr or layout == "spatial":
        conv_attrs["kernel_shape"] = new.kernel
    per_output = f.w_shape[1] * math.prod(f.geo.kernel)
    final = f.in_shape[:1] + f.w_shape[:1] + f.out_lens
    node = conv.node
    return SpaceToBatchPlan(
        nodes=(node.name,), action="space-to-batch" if f.splits else "dilation reset (kernel 1)",
        output=node.output[0], lifted=conv.lifted, layout=layout, pre=pre, post=post, conv_attrs=conv_attrs,
        weight_op=weight_op, weight_shape=new.weight_shape, tile=tile, dq_input=conv.dq_input and bool(pre),
        q_output=conv.q_output and bool(post), splits=f.splits, reset_axes=f.reset,
        old_dilations=list(conv.dilations), macs_before=conv.macs or math.prod(final) * per_output,
        macs_after=math.prod(new.shape) * per_output)


def padding_steps(shape: Sequence[int], pads: Sequence[int], value: np.ndarray | None, dtype: np.dtype,
                  form: str) -> list[_Step]:
    """The ops that zero-pad (or pad with ``value``, a quantized zero point) a tensor of ``shape`` by ``pads``
    (ONNX order: all begins, then all ends), in the target's form (``remainder_pad``, one of
    ``config.options.CHOICES``):

    - ``pad``:    one Pad of the tensor's own rank.
    - ``pad4d``:  a rank-3 tensor [B,C,L] is viewed as [B,C,1,L] around a 4-D Pad (the view's Reshapes merge with
                  the phase Reshape that follows); rank >= 4: one Pad.
    - ``concat``: per padded axis one Concat of [zeros, x, zeros] along it, the zeros a constant (filled with
                  ``value`` if given) of the padded shape.
    All three compute the same tensor; only which op forms the compiler sees differs."""
    rank = len(shape)
    begins, ends = list(pads[:rank]), list(pads[rank:])
    out_shape = [d + b + e for d, b, e in zip(shape, begins, ends)]
    if form == "pad" or (form == "pad4d" and rank >= 4):
        consts = [np.array(pads, np.int64)]
        if value is not None:
            consts.append(value)
        return [_Step("Pad", "pad", out_shape, consts)]
    if form == "pad4d":
        if rank != 3:
            raise _Skip(f"remainder_pad pad4d needs a rank >= 3 tensor, got rank {rank}")
        view = [shape[0], shape[1], 1, shape[2]]
        consts = [np.array([0, 0, 0, begins[2], 0, 0, 0, ends[2]], np.int64)]
        if value is not None:
            consts.append(value)
        padded_view = [shape[0], shape[1], 1, out_shape[2]]
        return [_Step("Reshape", "pad_view", view, [np.array(view, np.int64)]),
                _Step("Pad", "pad", padded_view, consts),
                _Step("Reshape", "pad_unview", out_shape, [np.array(out_shape, np.int64)])]
    fill = 0 if value is None else value.reshape(-1)[0]
    steps: list[_Step] = []
    cur = list(shape)
    for axis in range(rank):
        if not begins[axis] and not ends[axis]:
            continue
        zeros: list[np.ndarray] = []
        for width in (begins[axis], ends[axis]):
            if width:
                block = list(cur)
                block[axis] = width
                zeros.append(np.full(block, fill, dtype=dtype))
        cur = list(cur)
        cur[axis] += begins[axis] + ends[axis]
        steps.append(_Step("Concat", f"pad_axis{axis}", list(cur), zeros, attrs={"axis": axis},
                           data_slot=1 if begins[axis] else 0))
    return steps


def _slice_consts(axis: int, start: int, end: int, step: int) -> list[np.ndarray]:
    return [np.array([start], np.int64), np.array([end], np.int64), np.array([axis], np.int64),
            np.array([step], np.int64)]


def _merge_reshapes(steps: list[_Step], start_shape: Sequence[int]) -> list[_Step]:
    """Drop Reshapes that are immediately reshaped again or that change nothing."""
    merged: list[_Step] = []
    for st in steps:
        if st.op == "Reshape" and merged and merged[-1].op == "Reshape":
            merged.pop()
        merged.append(st)
    out: list[_Step] = []
    shape = list(start_shape)
    for st in merged:
        if st.op == "Reshape" and st.shape == shape:
            continue
        out.append(st)
        shape = st.shape
    return out


# --- weights and QDQ -----------------------------------------------------------------------------------


def _weight_source(index: GraphIndex, name: str) -> _Source | None:
    """Where a weight/bias comes from: a constant, a DequantizeLinear of constants, or something dynamic."""
    if not name:
        return None
    if index.has_value(name):
        return _Source("const")
    producer = index.producer.get(name)
    if (producer is not None and producer.op_type == "DequantizeLinear"
            and is_default_domain(producer)
            and all(index.has_value(i) for i in producer.input if i)):
        xq = index.const_value(producer.input[0])
        scale = index.const_value(producer.input[1])
        axis = int(get_attr(producer, "axis", 1))
        return _Source("dq", blocked=bool(int(get_attr(producer, "block_size", 0) or 0)),
                       scale_size=int(scale.size), axis=axis + xq.ndim if axis < 0 else axis)
    return _Source("dynamic")


def _check_weight(source: _Source | None, op: str, what: str) -> None:
    """Raise _Skip when ``op`` cannot be applied to the weight source (read-only check)."""
    if source is None or op == "keep" or source.kind == "const":
        return
    if source.kind == "dynamic":
        if op == "tile":
            raise _Skip(f"{what} are not constant and the channel layout tiles them")
        return  # a reshape of dynamic weights is emitted as a Reshape node
    if source.blocked:
        raise _Skip(f"{what} use blocked quantization, which the {op} would have to re-block")
    if source.scale_size > 1:
        if op == "reshape" and source.axis > 1:
            raise _Skip(f"{what} are quantized along kernel axis {source.axis}; the reshape would move it")
        if op == "tile" and source.axis != 0:
            raise _Skip(f"{what} are quantized along axis {source.axis}, not the output-channel axis the "
                        f"channel layout tiles")


def _quantized_input(index: GraphIndex, node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The per-tensor 8-bit DequantizeLinear feeding the conv, if the input-side ops can move before it."""
    dq = index.producer.get(node.input[0])
    if dq is None or dq.op_type != "DequantizeLinear" or not is_default_domain(dq):
        return None
    if index.elem_type(dq.input[0]) not in _MOVABLE_QTYPES or index.static_shape(dq.input[0]) is None:
        return None
    if not _per_tensor(index, dq):
        return None
    return dq


def _per_tensor(index: GraphIndex, qnode: onnx.NodeProto) -> bool:
    """Constant single-element scale and zero point (or none): the same map for every element."""
    scale = index.const_value(qnode.input[1])
    if scale is None or scale.size != 1:
        return False
    if len(qnode.input) > 2 and qnode.input[2]:
        zp = index.const_value(qnode.input[2])
        return zp is not None and zp.size == 1
    return True


def _quantized_output(index: GraphIndex, node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The per-tensor QuantizeLinear that is the conv's only reader, if the output-side ops can follow it."""
    q = index.single_consumer(node.output[0])
    if (q is None or q.op_type != "QuantizeLinear" or not is_default_domain(q)
            or q.input[0] != node.output[0] or not _per_tensor(index, q)):
        return None
    if len(q.input) <= 2 or not q.input[2]:
        if int(get_attr(q, "output_dtype", 0) or 0) not in (0, *_MOVABLE_QTYPES):
            return None
    elif index.elem_type(q.input[2]) not in _MOVABLE_QTYPES:
        return None
    return q


# --- rewrite -------------------------------------------------------------------------------------------


def _live_conv(index: GraphIndex, plan: ConvPlan, lifted: dict[str, str]) -> onnx.NodeProto:
    """The conv ``plan`` edits, in the model as the plans applied before it left it."""
    if plan.lifted != (plan.output in lifted):
        raise ValueError(f"dilated-conv: the {plan.action} of the conv writing '{plan.output}' was planned on the "
                         f"4-D conv its LiftPlan makes; apply that plan with it")
    conv = index.producer.get(lifted.get(plan.output, plan.output))
    if conv is None or conv.op_type != "Conv":
        raise ValueError(f"dilated-conv: no Conv writes '{plan.output}': the plans were found on another model")
    return conv


def _apply_lifts(index: GraphIndex, plans: list[LiftPlan], result: PassResult, lifted: dict[str, str],
                 emitted: set[str]) -> None:
    editor = GraphEditor(index)
    convs = [_live_conv(index, plan, lifted) for plan in plans]
    readers = _count_dq_readers(plans, convs)
    for plan, conv in zip(plans, convs):
        added, _, lifted[plan.output] = _replace(index, editor, plan, conv, readers, emitted)
        old = {a: plan.conv_attrs[a][1:] for a in ("kernel_shape", "dilations", "strides")}
        result.changes.append(Change(conv.name, "Conv", "lift 1-D conv to 4-D", old=old,
                                     new={a: plan.conv_attrs[a] for a in old},
                                     detail={"nodes_added": added, "layout": "lift",
                                             "why": "lift_conv1d: the target compiles 4-D convs only "
                                                    "(Reshape [B,C,L] -> [B,C,1,L] around it)"}))
    editor.commit()


def _apply_trims(index: GraphIndex, plans: list[TrimPlan], result: PassResult, lifted: dict[str, str]) -> None:
    editor = GraphEditor(index)
    for plan in plans:
        conv = _live_conv(index, plan, lifted)
        if plan.quantized:  # the integer taps behind the conv's own weight DequantizeLinear
            private_initializer(index, editor, index.producer[conv.input[1]], 0, plan.weight)
        else:
            private_initializer(index, editor, conv, 1, plan.weight)
        set_attr(conv, "auto_pad", None)
        set_attr(conv, "kernel_shape", plan.new["kernel_shape"])
        set_attr(conv, "dilations", plan.new["dilations"])
        set_attr(conv, "pads", plan.new["pads"])
        result.changes.append(Change(conv.name, "Conv", "trim dead taps", old=plan.old, new=plan.new,
                                     detail={"macs": plan.macs,
                                             "why": "the dropped taps only ever read zero padding"}))
    editor.commit()


def _apply_splits(index: GraphIndex, plans: list[SpaceToBatchPlan], result: PassResult, lifted: dict[str, str],
                  emitted: set[str]) -> dict[str, int]:
    """Replace each planned conv by its split; returns the totals the metrics report."""
    totals = {"macs_added": 0, "nodes_added": 0, "weight_bytes_added": 0}
    editor = GraphEditor(index)
    convs = [_live_conv(index, plan, lifted) for plan in plans]
    readers = _count_dq_readers(plans, convs)
    for plan, conv in zip(plans, convs):
        added, added_bytes, _ = _replace(index, editor, plan, conv, readers, emitted)
        totals["weight_bytes_added"] += added_bytes
        totals["nodes_added"] += added
        totals["macs_added"] += plan.macs_after - plan.macs_before
        if plan.tile > 1 and added_bytes > _WEIGHT_GROWTH_WARNING and plan.layout == "channel":
            result.warnings.append(
                f"{conv.name}: the channel layout tiles its weights {plan.tile}x "
                f"(+{added_bytes / 2**20:.1f} MiB); --s2b-layout batch tiles nothing where the NPU "
                f"accepts batch > 1")
        result.changes.append(Change(conv.name, "Conv", plan.action, old={"dilations": plan.old_dilations},
                                     new={"dilations": plan.new_dilations()},
                                     detail=_split_detail(plan, added, added_bytes)))
        if plan.warning:
            result.warnings.append(plan.warning)
    editor.commit()
    return totals


def _split_detail(plan: SpaceToBatchPlan, nodes_added: int, weight_bytes_added: int) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "k": {f"axis{2 + s.axis}": s.k for s in plan.splits},
        "layout": plan.layout,
        "nodes_added": nodes_added,
        "macs": [plan.macs_before, plan.macs_after],
    }
    if any(s.stride > 1 for s in plan.splits):
        detail["strides"] = {f"axis{2 + s.axis}": [s.stride, s.new_stride] for s in plan.splits}
    if plan.reset_axes:
        detail["dilation_reset_kernel1"] = {f"axis{2 + a}": d for a, d in plan.reset_axes.items()}
    if plan.tile > 1:
        detail["weight_tiling"] = plan.tile
        detail["weight_bytes_added"] = weight_bytes_added
    if plan.dq_input or plan.q_output:
        detail["qdq"] = {"input_moved_before_dq": plan.dq_input, "output_moved_after_q": plan.q_output}
    return detail


def _count_dq_readers(plans: Sequence[ReplacePlan], convs: list[onnx.NodeProto]) -> dict[str, int]:
    """Per input DequantizeLinear output: how many of the planned convs read it (moved before a copy)."""
    readers: dict[str, int] = {}
    for plan, conv in zip(plans, convs):
        if plan.dq_input:
            readers[conv.input[0]] = readers.get(conv.input[0], 0) + 1
    return readers


def _replace(index: GraphIndex, editor: GraphEditor, plan: ReplacePlan, conv: onnx.NodeProto,
             readers: dict[str, int], emitted: set[str]) -> tuple[int, int, str]:
    """Replace ``conv`` as ``plan`` says; returns (nodes added, weight bytes added, the new conv's output)."""
    dq = index.producer[conv.input[0]] if plan.dq_input else None
    q = index.single_consumer(conv.output[0]) if plan.q_output else None
    new_nodes, added_bytes, conv_out = _rewrite(index, editor, plan, conv, dq, q)
    editor.replace(conv, new_nodes)
    emitted.update(n.name for n in new_nodes if n.op_type == "Reshape")
    added = len(new_nodes) - 1
    if q is not None:
        editor.remove(q)  # its copy sits right after the new conv
        added -= 1
    if dq is not None:
        dq_out = dq.output[0]
        if dq_out not in index.output_set and readers[dq_out] == len(index.consumers_of(dq_out)):
            # Every reader now goes through its own copy: drop the original once.
            editor.remove(dq)
            readers[dq_out] = -1
            added -= 1
    return added, added_bytes, conv_out


def _transform(value: np.ndarray, op: str, shape: Sequence[int], tile: int) -> np.ndarray:
    if op == "reshape":
        return value.reshape(shape)
    if op == "tile":
        return np.tile(value, (tile,) + (1,) * (value.ndim - 1))
    return value


def _new_weight(index: GraphIndex, editor: GraphEditor, node: onnx.NodeProto, slot: int, op: str,
                shape: Sequence[int], tile: int, base: str) -> tuple[str, list[onnx.NodeProto], int]:
    """The tensor the new conv reads at ``slot``: the weight/bias reshaped or tiled. Returns the name, nodes
    to insert before the conv, and the bytes added."""
    name = node.input[slot]
    if op == "keep":
        return name, [], 0
    source = _weight_source(index, name)
    assert source is not None
    if source.kind == "const":
        value = index.const_value(name)
        new = _transform(value, op, shape, tile)
        private_initializer(index, editor, node, slot, new)  # rewires node.input[slot] if shared
        return node.input[slot], [], new.nbytes - value.nbytes
    if source.kind == "dynamic":  # only "reshape" gets here (checked in planning)
        node_name = index.unique_name(f"{base}/weight_2d")
        out = index.unique_name(f"{node_name}_out")
        shape_name = editor.add_initializer(f"{node_name}_shape", np.array(shape, np.int64))
        return out, [helper.make_node("Reshape", [name, shape_name], [out], name=node_name)], 0
    return _new_dq_weight(index, editor, node, slot, op, shape, tile, base, source)


def _new_dq_weight(index: GraphIndex, editor: GraphEditor, node: onnx.NodeProto, slot: int, op: str,
                   shape: Sequence[int], tile: int, base: str,
                   source: _Source) -> tuple[str, list[onnx.NodeProto], int]:
    """A DequantizeLinear weight: transform the quantized tensor (and a per-output-channel scale/zero point when
    tiling); the conv keeps reading a DQ output — the DQ itself when the conv is its only reader, else a copy."""
    dq = index.producer[node.input[slot]]
    xq = index.const_value(dq.input[0])
    new_inputs: dict[int, np.ndarray] = {0: _transform(xq, op, shape, tile)}
    attrs = {a.name: helper.get_attribute_value(a) for a in dq.attribute}
    if op == "reshape" and int(attrs.get("axis", 1)) < 0:
        attrs["axis"] = source.axis  # a negative axis would point elsewhere after the rank changes
    added = new_inputs[0].nbytes - xq.nbytes
    if op == "tile":
        for i in (1, 2):
            if len(dq.input) > i and dq.input[i]:
                v = index.const_value(dq.input[i])
                if v.size > 1:  # per-channel along the output axis (a bias' only axis, a weight's axis 0)
                    new_inputs[i] = np.tile(v, tile)
                    added += new_inputs[i].nbytes - v.nbytes
    if index.single_consumer(dq.output[0]) is node:
        for i, v in new_inputs.items():
            private_initializer(index, editor, dq, i, v)
        if "axis" in attrs:
            set_attr(dq, "axis", attrs["axis"])
        return dq.output[0], [], added
    role = "weight" if slot == 1 else "bias"
    node_name = index.unique_name(f"{base}/dq_{role}")
    inputs = list(dq.input)
    for i, v in new_inputs.items():
        inputs[i] = editor.add_initializer(f"{node_name}_{('x', 'scale', 'zero_point')[i]}", v)
    out = index.unique_name(f"{node_name}_out")
    return out, [helper.make_node("DequantizeLinear", inputs, [out], name=node_name, **attrs)], added


def _rewrite(index: GraphIndex, editor: GraphEditor, plan: ReplacePlan, node: onnx.NodeProto,
             dq: onnx.NodeProto | None, q: onnx.NodeProto | None) -> tuple[list[onnx.NodeProto], int, str]:
    """The nodes that replace ``node`` (pre-ops, conv, post-ops), the weight bytes added, the new conv's
    output. ``dq`` / ``q``: the conv's DequantizeLinear / QuantizeLinear the moved ops go around (copies)."""
    base = node.name or node.output[0]
    nodes: list[onnx.NodeProto] = []

    w_name, w_nodes, w_bytes = _new_weight(index, editor, node, 1, plan.weight_op, plan.weight_shape,
                                           plan.tile, base)
    b_name, b_nodes, b_bytes = "", [], 0
    if len(node.input) > 2 and node.input[2]:
        b_name, b_nodes, b_bytes = _new_weight(index, editor, node, 2, "tile" if plan.weight_op == "tile"
                                               else "keep", [], plan.tile, base)
    nodes.extend(w_nodes + b_nodes)

    cur = node.input[0]
    grid_in: _Grid | None = None
    if dq is not None:
        dq_name = index.unique_name(f"{base}/dq_in")
        cur = index.unique_name(f"{dq_name}_out")
        attrs = {a.name: helper.get_attribute_value(a) for a in dq.attribute}
        nodes.append(helper.make_node("DequantizeLinear", [dq.input[0], *dq.input[1:]], [cur], name=dq_name,
                                      **attrs))
        grid_in = _input_grid(index, editor, dq, base)
    cur = _emit(index, editor, plan.pre, cur, base, nodes, final=None, grid=grid_in)

    final_out = q.output[0] if q is not None else node.output[0]
    conv_out = final_out if not plan.post and q is None else index.unique_name(f"{base}/conv_out")
    inputs = [cur, w_name] + ([b_name] if b_name else [])
    # The conv keeps its name: it is the same layer, and reports point at it.
    nodes.append(helper.make_node("Conv", inputs, [conv_out], name=node.name, **plan.conv_attrs))
    cur = conv_out
    grid_out: _Grid | None = None
    if q is not None:
        q_name = q.name or index.unique_name(f"{base}/q_out")  # the original Q is removed: keep its name
        out = final_out if not plan.post else index.unique_name(f"{q_name}_out")
        attrs = {a.name: helper.get_attribute_value(a) for a in q.attribute}
        nodes.append(helper.make_node("QuantizeLinear", [cur, *q.input[1:]], [out], name=q_name, **attrs))
        cur = out
        grid_out = _Grid(list(q.input[1:]), attrs)
        if plan.post:  # back to float for the first unit
            cur = _dequantize(index, cur, grid_out, f"{q_name}_dequantize", nodes)
    _emit(index, editor, plan.post, cur, base, nodes, final=final_out, grid=grid_out)
    return nodes, w_bytes + b_bytes, conv_out


@dataclass
class _Grid:
    """A per-tensor quantization grid the inserted ops' QDQ units use: Q / DQ inputs after the data (scale, zero
    point) and the QuantizeLinear's attributes."""

    params: list[str]
    q_attrs: dict[str, Any]


def _input_grid(index: GraphIndex, editor: GraphEditor, dq: onnx.NodeProto, base: str) -> _Grid:
    """The grid of the conv's input DequantizeLinear. Its zero point is spelled out when the DQ omits it: a
    QuantizeLinear without one writes uint8, which would not be an int8 tensor's type."""
    params = list(dq.input[1:])
    if len(params) < 2 or not params[1]:
        dtype = helper.tensor_dtype_to_np_dtype(index.elem_type(dq.input[0]))
        params = [params[0], editor.add_initializer(f"{base}/zero_point", np.zeros((), dtype))]
    return _Grid(params, {})


def _dequantize(index: GraphIndex, quantized: str, grid: _Grid, name: str, nodes: list[onnx.NodeProto]) -> str:
    out = index.unique_name(f"{name}_out")
    nodes.append(helper.make_node("DequantizeLinear", [quantized, *grid.params], [out],
                                  name=index.unique_name(name)))
    return out


_CONST_ROLES = {"Pad": ("pads", "value"), "Concat": ("zeros", "zeros"), "Reshape": ("shape",),
                "Slice": ("starts", "ends", "axes", "steps")}


def _emit(index: GraphIndex, editor: GraphEditor, steps: list[_Step], cur: str, base: str,
          nodes: list[onnx.NodeProto], final: str | None, grid: _Grid | None = None) -> str:
    """Emit ``steps`` on ``cur``; the last one writes ``final`` when given. With a ``grid`` (float ``cur`` on a
    quantized tensor) every op is a QDQ unit: op -> Q, then -> DQ unless that Q writes ``final``."""
    for i, st in enumerate(steps):
        node_name = index.unique_name(f"{base}/{st.tag}")
        roles = _CONST_ROLES.get(st.op) or tuple(f"{st.op.lower()}{i}" for i in range(len(st.consts)))
        inputs = [editor.add_initializer(f"{node_name}_{role}", c) for role, c in zip(roles, st.consts)]
        inputs.insert(st.data_slot, cur)
        last = final is not None and i == len(steps) - 1
        out = final if last and grid is None else index.unique_name(f"{node_name}_out")
        nodes.append(helper.make_node(st.op, inputs, [out], name=node_name, **st.attrs))
        cur = out
        if grid is not None:
            quantized = final if last else index.unique_name(f"{node_name}_quantized")
            nodes.append(helper.make_node("QuantizeLinear", [cur, *grid.params], [quantized],
                                          name=index.unique_name(f"{node_name}_quantize"), **grid.q_attrs))
            cur = quantized if last else _dequantize(index, quantized, grid, f"{node_name}_dequantize", nodes)
    return cur


def _merge_reshape_chains(model: onnx.ModelProto, emitted: set[str]) -> bool:
    """Reshape(Reshape(x, s1), s2) = Reshape(x, s2): merge chains of Reshapes this pass emitted (the lift's
    view and the phase split's), when the inner one has no other reader and is no graph output."""
    if not emitted:
        return False
    index = GraphIndex(model)
    editor = GraphEditor(index)
    dropped_shapes: set[str] = set()
    for node in model.graph.node:
        if node.op_type != "Reshape" or node.name not in emitted:
            continue
        inner = index.producer.get(node.input[0])
        while (inner is not None and inner.op_type == "Reshape" and inner.name in emitted
               and inner.output[0] not in index.output_set and len(index.consumers_of(inner.output[0])) == 1):
            node.input[0] = inner.input[0]
            editor.remove(inner)
            dropped_shapes.add(inner.input[1])
            inner = index.producer.get(node.input[0])
    editor.commit()
    if dropped_shapes:
        still_read = {name for n in model.graph.node for name in n.input}
        keep = [t for t in model.graph.initializer if t.name not in dropped_shapes - still_read]
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
    return bool(dropped_shapes)
