"""The one table of constraints: every fact about a constraint but its check.

A row holds what the constraint is called, how its limit reads, which FixOptions fields ask for it and the
documentation of when it is violated (which of them count in a run: report.split_requested). Which passes fix it is
not in the row: each pass declares that in its own file (``Pass.fixes``, passes/base.py), and :func:`responsible`
and :func:`fixed_by_text` derive the answers from those declarations, so that the table's "fixed by", the passes
``--check`` asks (constraints/fixed_by.py) and the docs cannot disagree with the passes. docs/constraints.md's
table is :func:`markdown_table` (tested).
"""

from __future__ import annotations

import functools
import textwrap
from dataclasses import dataclass

from onnx_npu_fix.passes.base import Fixes


@dataclass(frozen=True)
class Constraint:
    """One constraint ``--check`` reports: every fact about it but its check (constraints/checks.py) and the passes
    that fix it (their own ``fixes``), in one row."""

    name: str
    """Stable: it appears in the one-line text and in the JSON report."""
    limit: str
    """How its limit reads in the one-line form (``<value> vs <limit>``): a format with one ``{}``."""
    asked_by: tuple[str, ...]
    """The FixOptions fields that ask for it (:func:`split_requested`); none: it counts under any target."""
    violated_when: str
    """When it is violated (markdown): the constraint table of docs/constraints.md."""
    otherwise: str = ""
    """What fixes it besides the passes that declare it (markdown: an option, another finding's fix, or "none"),
    after their names in the "fixed by" column (:func:`fixed_by_text`)."""


# Adding a constraint is a row here, its check in constraints/checks.py, a test and the row in
# docs/constraints.md (tests/test_constraints.py compares that table with this one); a pass that fixes it says
# so in its own ``fixes``.
CONSTRAINT_TABLE: tuple[Constraint, ...] = (
    Constraint("shape-inference", "{}", (),
               "onnx shape inference fails on the model",
               "none (the vendor compiler will likely fail too)"),
    Constraint("dynamic-shape", "{}", (),
               "a graph input/output dim is not a static integer (a declared `dim_value` below 0, as Paddle2ONNX "
               "writes for \"any size\", is read as unknown)",
               "`--input-shape` for a graph input; for an output whose unknown shape starts upstream, what fixes "
               "that (see `unknown-shape`)"),
    Constraint("unknown-shape", "{}", (),
               "an intermediate shape is unknown although the graph inputs are static (reported where it starts)",
               "behind an If / Loop, what folds that (see `control-flow`); else none"),
    Constraint("dilation", "max {}", ("max_dilation",),
               "a Conv dilation above `--max-dilation`"),
    Constraint("dilation-allowed", "allowed {}", ("allowed_dilations",),
               "a Conv dilation not 1 and outside the target's `allowed_dilations`"),
    Constraint("in-channels-align", "multiple of {}", ("align",),
               "Conv / ConvTranspose input channels (per group) not a multiple of `--align`"),
    Constraint("out-channels-align", "multiple of {}", ("align",),
               "Conv / ConvTranspose output channels (per group) not a multiple of `--align`"),
    Constraint("concat-align", "multiples of {}", ("concat_align",),
               "a Concat input's channels not a multiple of the target's `concat_align`",
               "else none"),
    Constraint("batchnorm", "{}", ("allow_batchnorm",),
               "a BatchNormalization remains (unless `allow_batchnorm`)"),
    Constraint("resize-mode", "{}", ("require_nearest_resize",),
               "a Resize / Upsample not in nearest mode (`require_nearest_resize`)"),
    Constraint("max-rank", "max {}", ("max_rank",),
               "a graph input or activation of rank above `--max-rank`",
               "none"),
    Constraint("batch-one", "max {}", ("batch_one",),
               "batch above 1 where it starts (`batch_one`), only on tensors whose axis 0 is traced to a graph "
               "input's batch (`analysis/batch_axis.py`)",
               "none"),
    Constraint("forbidden-op", "forbidden {}", ("forbidden_ops",),
               "an op type in the target's `forbidden_ops`",
               "else none"),
    Constraint("leftover-op", "{}", (),
               "a Dropout / Identity remains"),
    Constraint("max-kernel", "max {}", ("max_kernel",),
               "a Conv kernel extent above the target's `max_kernel`",
               "none"),
    Constraint("max-stride", "max {}", ("max_stride", "max_stride_quantized"),
               "a Conv stride above the target's `max_stride` (with `stride_limit_depthwise_only`: a depthwise Conv's "
               "or a ConvTranspose's only), or a quantized Conv's (its weight a DequantizeLinear of a constant; not a "
               "ConvTranspose) above `max_stride_quantized`",
               "none"),
    Constraint("kernel-allowed", "allowed {}", ("allowed_kernels",),
               "a Conv kernel that is not k x k with k among the target's `allowed_kernels` (k210: 1x1 or 3x3, so no "
               "1x3 / 3x1)",
               "none"),
    Constraint("asymmetric-pads", "{}", ("symmetric_pads",),
               "a Conv pads a spatial axis unequally at its two ends (`symmetric_pads`; `auto_pad` resolved)",
               "none"),
    Constraint("resize-factor", "{}", ("resize_factors", "linear_half_pixel_factors"),
               "a 4-D Resize whose H / W factors are not equal and among `resize_factors` ((out-1)/(in-1) with "
               "align_corners), or a half-pixel linear one outside `linear_half_pixel_factors`",
               "else none"),
    Constraint("constant-node-input", "{}", ("initializer_inputs",),
               "an input after the first of an op in the target's `initializer_inputs` is made by a Constant node, "
               "which the target's importer does not read (it reads initializers)"),
    Constraint("resize-sizes", "{}", ("resize_scales_only",),
               "a Resize is given its output `sizes` (its `scales` omitted), and the target's importer reads only "
               "`scales` (`resize_scales_only`)",
               "else none"),
    Constraint("squeeze-axes", "{}", ("squeeze_axes_ignored",),
               "a Squeeze with its axes as an input (opset 13 on) keeps a size-1 axis, and the target's importer "
               "removes every one (`squeeze_axes_ignored`)",
               "else none"),
    Constraint("quantized-input", "{}", ("allow_qdq",),
               "the model holds QuantizeLinear / DequantizeLinear or QOperator ops and the target's compiler "
               "takes float models only (`allow_qdq = false`)",
               "none — give the compiler the float export; it quantizes with its own calibration"),
    Constraint("sram", "SRAM {}", ("sram_bytes",),
               "the estimated activation peak exceeds `--sram`",
               "else `--split` when every layer fits, else none"),
    Constraint("control-flow", "{}", ("allow_control_flow",),
               "an If / Loop / Scan remains and the target forbids control flow (`allow_control_flow = false`)",
               "`--freeze-input NAME=<value>` / `--input-shape` naming the graph input that decides it; else none"),
    Constraint("sram-layer", "SRAM {}", ("sram_bytes",),
               "one node's activation inputs plus outputs alone exceed `--sram`: no order or split can fit it",
               "none — the line names the layer and says what would fit: the largest input size at which the "
               "whole model (or, with `--split`, every layer) fits, or the number of spatial tiles"),
    Constraint("judge", "{}", (),
               "`--judge CMD` (a fixing run) rejects the output, and every other emission form tried for the "
               "region it rejects too (reported at the reduced region's first node)",
               "the first form the judge accepts, found by `--judge` itself (docs/reduce.md); else none"),
)
CONSTRAINT: dict[str, Constraint] = {c.name: c for c in CONSTRAINT_TABLE}
CONSTRAINTS: tuple[str, ...] = tuple(CONSTRAINT)

LIMIT_TEXT: dict[str, str] = {c.name: c.limit for c in CONSTRAINT_TABLE}
"""How each constraint's limit reads in the one-line form (``<value> vs <limit>``)."""
ASKED_BY: dict[str, tuple[str, ...]] = {c.name: c.asked_by for c in CONSTRAINT_TABLE}
"""The FixOptions fields that ask for each constraint (:func:`split_requested`)."""


# --- the passes that fix each constraint, from their declarations ---------------------------------------------


@functools.cache
def declared_fixes() -> dict[str, tuple[tuple[str, Fixes], ...]]:
    """constraint -> (pass name, its declaration) for every built-in pass that declares it fixes the constraint,
    in the order passes run (the default order, then the opt-in passes)."""
    from onnx_npu_fix.passes import PASSES

    found: dict[str, list[tuple[str, Fixes]]] = {}
    for name, cls in PASSES.items():
        for fix in cls.fixes:
            found.setdefault(fix.constraint, []).append((name, fix))
    return {constraint: tuple(pairs) for constraint, pairs in found.items()}


def responsible(constraint: str, op: str | None = None) -> tuple[str, ...]:
    """The passes that declare they fix ``constraint`` (at a node of type ``op``, when given), in run order."""
    return tuple(name for name, fix in declared_fixes().get(constraint, ())
                 if op is None or not fix.ops or op in fix.ops)


def declaration(constraint: str, pass_name: str) -> Fixes | None:
    """What ``pass_name`` declares about ``constraint``, or None."""
    return next((fix for name, fix in declared_fixes().get(constraint, ()) if name == pass_name), None)


def fixed_by_text(constraint: Constraint) -> str:
    """The "fixed by" cell of the docs' table: the declaring passes (with their notes), then the row's own text."""
    passes = []
    for name, fix in declared_fixes().get(constraint.name, ()):
        note = fix.note or (f"for {' / '.join(fix.ops)}" if fix.ops else "")
        passes.append(f"{name} ({note})" if note else name)
    return "; ".join([*passes, constraint.otherwise] if constraint.otherwise else passes) or "none"


def markdown_table() -> str:
    """The constraint table of docs/constraints.md (constraint, violated when, fixed by), one row per constraint."""
    rows = ["| constraint | violated when | fixed by |", "|---|---|---|"]
    rows += [f"| `{c.name}` | {c.violated_when} | {fixed_by_text(c)} |" for c in CONSTRAINT_TABLE]
    return "\n".join(rows)


def plain_list() -> str:
    """The table as plain text (``constraint  violated when -> fixed by``), for the package's docstring."""
    lines = []
    for c in CONSTRAINT_TABLE:
        text = f"{c.name:<19} {c.violated_when} -> {fixed_by_text(c)}".replace("`", "")
        lines += textwrap.wrap(text, 116, initial_indent="  ", subsequent_indent=" " * 22)
    return "\n".join(lines)
