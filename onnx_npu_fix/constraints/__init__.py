"""Constraint checking for ``--check`` and for the re-check after a fixing run: every violation, as data.

Each check is driven by a :class:`~onnx_npu_fix.config.options.FixOptions` field and names the pass that would fix it
(or ``None``: no pass fixes it). Everything about a constraint but its check is one row of ``CONSTRAINT_TABLE``
(name, limit text, the options that ask for it, the responsible pass, its documentation); ``LIMIT_TEXT``,
``RESPONSIBLE`` and ``ASKED_BY`` are derived from it, and so is the list that ends this docstring and the constraint
table of docs/constraints.md (tested).

Channel counts come from the weight shape (:func:`onnx_npu_fix.ir.ops.conv_channels`). A plain or depthwise conv must
have C and M aligned; a grouped conv (1 < group < C) must have its per-group counts aligned, since NPUs run it as
``group`` convs. Shape findings (unknown-shape, batch-one) are reported where they start, not again on every
tensor downstream.

Which pass fixes a violation is not decided here: the table says which pass is responsible for which
constraint, and :func:`_ask_passes` asks that pass's read-only ``find`` (passes/base.py) whether the violating node
is in its plans — once per pass, only when a violation of its constraint exists. A refused node gets "no pass
fixes this" and the pass's rejection reason as the end of its message. tests/test_fixed_by.py checks the answers
against the finds and against running the passes.

Everything runs on a light copy with inferred shapes (:func:`onnx_npu_fix.analysis.memory.analysis_copy`); the caller's
model is never modified. One pass over the nodes with a GraphIndex, O(nodes + edges), plus the memory estimate,
plus the responsible passes' finds when there is something to ask them.

The constraints by ``constraint`` name (stable: they appear in the JSON report), what violates each -> what fixes
it (appended from ``CONSTRAINT_TABLE`` at import):

"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix.analysis.batch_axis import batch_tensors
from onnx_npu_fix.analysis.memory import (
    MemoryEstimate,
    analysis_copy,
    estimate_index,
    render_memory,
)
from onnx_npu_fix.analysis.schedule import constant_names
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import (
    ConvGeometry,
    GraphIndex,
    Shape,
    format_bytes,
    format_shape,
    get_attr,
    opset_version,
    paused_gc,
    values_from,
)
from onnx_npu_fix.ir.ops import (
    CONTROL_FLOW_OPS,
    channels_follow_inputs,
    conv_channels,
    is_default_domain,
    resize_factor_problem,
)
from onnx_npu_fix.ir.qdq import is_dequantized_const, is_qoperator
from onnx_npu_fix.passes.base import Found
from onnx_npu_fix.passes.resize_scales import given_sizes
from onnx_npu_fix.passes.squeeze_reshape import keeps_a_size_one_axis


@dataclass(frozen=True)
class Constraint:
    """One constraint ``--check`` reports: every fact about it but its check (``_check_*`` below), in one row."""

    name: str
    """Stable: it appears in the one-line text and in the JSON report."""
    limit: str
    """How its limit reads in the one-line form (``<value> vs <limit>``): a format with one ``{}``."""
    asked_by: tuple[str, ...]
    """The FixOptions fields that ask for it (:func:`split_requested`); none: it counts under any target."""
    responsible: str | None
    """The pass responsible for it, whose read-only find is asked whether it fixes a violation (:func:`_ask_passes`);
    None: no pass, or what fixes it is decided where it is found (an option, control_flow_fix, memory.order_plan)."""
    violated_when: str
    """When it is violated (markdown): the constraint table of docs/constraints.md and this module's docstring."""
    fixed_by: str
    """What fixes it (markdown), for the same table."""
    responsible_ops: tuple[str, ...] = ()
    """When set, ``responsible`` is responsible only for violations at these op types."""
    judged_by_result: bool = False
    """Its fix happens upstream of the violating node (fold-constants folds the Shape chain feeding a Reshape, not
    the Reshape): the responsible pass fixes one when the violation is gone from its find's result."""


# The one table of constraints: adding one is a row here, its check below, a test and the row in
# docs/constraints.md (tests/test_constraints.py compares that table with this one).
CONSTRAINT_TABLE: tuple[Constraint, ...] = (
    Constraint("shape-inference", "{}", (), None,
               "onnx shape inference fails on the model",
               "none (the vendor compiler will likely fail too)"),
    Constraint("dynamic-shape", "{}", (), None,
               "a graph input/output dim is not a static integer (a declared `dim_value` below 0, as Paddle2ONNX "
               "writes for \"any size\", is read as unknown)",
               "`--input-shape`; for an output whose unknown shape starts at its producer, what fixes that "
               "(see `unknown-shape`)", judged_by_result=True),
    Constraint("unknown-shape", "{}", (), "fold-constants",
               "an intermediate shape is unknown although the graph inputs are static (reported where it starts)",
               "fold-constants when folding makes it static; behind an If / Loop, what folds that (see "
               "`control-flow`); else none", judged_by_result=True),
    Constraint("dilation", "max {}", ("max_dilation",), "dilated-conv",
               "a Conv dilation above `--max-dilation`",
               "dilated-conv (not for ConvTranspose / QOperator convs)"),
    Constraint("dilation-allowed", "allowed {}", ("allowed_dilations",), "dilated-conv",
               "a Conv dilation not 1 and outside the target's `allowed_dilations`",
               "dilated-conv (not for ConvTranspose / QOperator convs)"),
    Constraint("in-channels-align", "multiple of {}", ("align",), "align-channels",
               "Conv / ConvTranspose input channels (per group) not a multiple of `--align`",
               "align-channels (channels a graph input fixes, even through Relu / pooling, are *exempt* unless "
               "`--align-io`; weights neither constant nor a QDQ weight it pads, and QOperator convs: none, with "
               "its reason)"),
    Constraint("out-channels-align", "multiple of {}", ("align",), "align-channels",
               "Conv / ConvTranspose output channels (per group) not a multiple of `--align`",
               "align-channels (padded, sliced back where the real tensor is read; a depthwise conv's that follow "
               "a graph input are *exempt* unless `--align-io`)"),
    Constraint("concat-align", "multiples of {}", ("concat_align",), "align-channels",
               "a Concat input's channels not a multiple of the target's `concat_align`",
               "align-channels where its padding makes them multiples, else none"),
    Constraint("batchnorm", "{}", ("allow_batchnorm",), "fold-batchnorm",
               "a BatchNormalization remains (unless `allow_batchnorm`)",
               "fold-batchnorm"),
    Constraint("resize-mode", "{}", ("require_nearest_resize",), "resize-nearest",
               "a Resize / Upsample not in nearest mode (`require_nearest_resize`)",
               "resize-nearest"),
    Constraint("max-rank", "max {}", ("max_rank",), None,
               "a graph input or activation of rank above `--max-rank`",
               "none"),
    Constraint("batch-one", "max {}", ("batch_one",), None,
               "batch above 1 where it starts (`batch_one`), only on tensors whose axis 0 is traced to a graph "
               "input's batch (`analysis/batch_axis.py`)",
               "none"),
    Constraint("forbidden-op", "forbidden {}", ("forbidden_ops",), "fold-batchnorm",
               "an op type in the target's `forbidden_ops`",
               "fold-batchnorm for a BatchNormalization, else none", responsible_ops=("BatchNormalization",)),
    Constraint("leftover-op", "{}", (), "cleanup",
               "a Dropout / Identity remains",
               "cleanup (behind a foldable If / Loop: fold-constants, which re-runs it)"),
    Constraint("max-kernel", "max {}", ("max_kernel",), None,
               "a Conv kernel extent above the target's `max_kernel`",
               "none"),
    Constraint("max-stride", "max {}", ("max_stride", "max_stride_quantized"), None,
               "a Conv stride above the target's `max_stride` (with `stride_limit_depthwise_only`: a depthwise Conv's "
               "or a ConvTranspose's only), or a quantized Conv's (its weight a DequantizeLinear of a constant; not a "
               "ConvTranspose) above `max_stride_quantized`",
               "none"),
    Constraint("kernel-allowed", "allowed {}", ("allowed_kernels",), None,
               "a Conv kernel that is not k x k with k among the target's `allowed_kernels` (k210: 1x1 or 3x3, so no "
               "1x3 / 3x1)",
               "none"),
    Constraint("asymmetric-pads", "{}", ("symmetric_pads",), None,
               "a Conv pads a spatial axis unequally at its two ends (`symmetric_pads`; `auto_pad` resolved)",
               "none"),
    Constraint("resize-factor", "{}", ("resize_factors", "linear_half_pixel_factors"), "resize-nearest",
               "a 4-D Resize whose H / W factors are not equal and among `resize_factors` ((out-1)/(in-1) with "
               "align_corners), or a half-pixel linear one outside `linear_half_pixel_factors`",
               "resize-nearest when the nearest form keeps the rule (a half-pixel linear x8 on ethos-u55), else "
               "none"),
    Constraint("constant-node-input", "{}", ("initializer_inputs",), "fold-constants",
               "an input after the first of an op in the target's `initializer_inputs` is made by a Constant node, "
               "which the target's importer does not read (it reads initializers)",
               "fold-constants (the Constant becomes an initializer; an op computed from constants only folds)",
               judged_by_result=True),
    Constraint("resize-sizes", "{}", ("resize_scales_only",), "resize-scales",
               "a Resize is given its output `sizes` (its `scales` omitted), and the target's importer reads only "
               "`scales` (`resize_scales_only`)",
               "resize-scales (the float32 scales the sizes stand for, where they give the same output size), "
               "else none"),
    Constraint("squeeze-axes", "{}", ("squeeze_axes_ignored",), "squeeze-reshape",
               "a Squeeze with its axes as an input (opset 13 on) keeps a size-1 axis, and the target's importer "
               "removes every one (`squeeze_axes_ignored`)",
               "squeeze-reshape (a Reshape to the static output shape), else none"),
    Constraint("quantized-input", "{}", ("allow_qdq",), None,
               "the model holds QuantizeLinear / DequantizeLinear or QOperator ops and the target's compiler "
               "takes float models only (`allow_qdq = false`)",
               "none — give the compiler the float export; it quantizes with its own calibration"),
    Constraint("sram", "SRAM {}", ("sram_bytes",), None,
               "the estimated activation peak exceeds `--sram`",
               "reorder-memory if a reordering fits, else `--split` when every layer fits, else none"),
    Constraint("control-flow", "{}", ("allow_control_flow",), None,
               "an If / Loop / Scan remains and the target forbids control flow (`allow_control_flow = false`)",
               "fold-constants when its condition / trip count is constant; `--freeze-input NAME=<value>` / "
               "`--input-shape` naming the graph input that decides it; else none"),
    Constraint("sram-layer", "SRAM {}", ("sram_bytes",), None,
               "one node's activation inputs plus outputs alone exceed `--sram`: no order or split can fit it",
               "none — the line names the layer and says what would fit: the largest input size at which the "
               "whole model (or, with `--split`, every layer) fits, or the number of spatial tiles"),
    Constraint("judge", "{}", (), None,
               "`--judge CMD` (a fixing run) rejects the output, and every other emission form tried for the "
               "region it rejects too (reported at the reduced region's first node)",
               "the first form the judge accepts, found by `--judge` itself (docs/reduce.md); else none"),
)
CONSTRAINT: dict[str, Constraint] = {c.name: c for c in CONSTRAINT_TABLE}
CONSTRAINTS: tuple[str, ...] = tuple(CONSTRAINT)

# Lookups derived from the table, by the names the checks and callers use.
LIMIT_TEXT: dict[str, str] = {c.name: c.limit for c in CONSTRAINT_TABLE}
"""How each constraint's limit reads in the one-line form (``<value> vs <limit>``)."""
RESPONSIBLE: dict[Any, str] = {
    **{c.name: c.responsible for c in CONSTRAINT_TABLE if c.responsible and not c.responsible_ops},
    **{(c.name, op): c.responsible for c in CONSTRAINT_TABLE if c.responsible for op in c.responsible_ops},
}
"""Which pass is responsible for which constraint (a key (constraint, op type) narrows one to an op). Whether it
fixes a given violation is not decided here but asked from that pass's read-only find (:func:`_ask_passes`)."""
ASKED_BY: dict[str, tuple[str, ...]] = {c.name: c.asked_by for c in CONSTRAINT_TABLE}
"""The FixOptions fields that ask for each constraint (:func:`split_requested`)."""
# Constraints whose fix happens upstream of the violating node (fold-constants folds the Shape chain feeding a
# Reshape, not the Reshape): the responsible pass fixes one when the violation is gone once the pass has run on a
# copy (_remaining_after), not when its find plans the node.
_JUDGED_BY_RESULT = frozenset(c.name for c in CONSTRAINT_TABLE if c.judged_by_result)


def markdown_table() -> str:
    """The constraint table of docs/constraints.md (constraint, violated when, fixed by), one row per constraint."""
    rows = ["| constraint | violated when | fixed by |", "|---|---|---|"]
    rows += [f"| `{c.name}` | {c.violated_when} | {c.fixed_by} |" for c in CONSTRAINT_TABLE]
    return "\n".join(rows)


def _docstring_list() -> str:
    """The table as the plain-text list this module's docstring ends with."""
    lines = []
    for c in CONSTRAINT_TABLE:
        text = f"{c.name:<19} {c.violated_when} -> {c.fixed_by}".replace("`", "")
        lines += textwrap.wrap(text, 116, initial_indent="  ", subsequent_indent=" " * 22)
    return "\n".join(lines)


if __doc__:  # None under python -OO
    __doc__ += _docstring_list() + "\n"


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    return str(value)


@dataclass
class Violation:
    """One violated constraint at one node (or graph input/output).

    ``fixed_by`` is the pass that would fix it, an option such as ``--input-shape``, or None (no pass fixes
    this). ``value`` and ``limit`` are JSON values (numbers, strings, lists).
    """

    node: str
    op: str
    constraint: str
    value: Any
    limit: Any
    fixed_by: str | None
    message: str = ""

    @property
    def fixable(self) -> bool:
        return self.fixed_by is not None

    def text(self) -> str:
        """``node (op): constraint: value vs limit -> fixed by <pass> | no pass fixes this``"""
        if self.constraint in ("sram", "sram-layer"):
            value, limit = format_bytes(self.value), LIMIT_TEXT["sram"].format(format_bytes(self.limit))
        else:
            value = _fmt(self.value)
            limit = LIMIT_TEXT.get(self.constraint, "{}").format(_fmt(self.limit))
        fix = f"fixed by {self.fixed_by}" if self.fixed_by else "no pass fixes this"
        if self.constraint == "sram-layer":  # what would fit is the point of this line
            fix += f"; {self.message}"
        return f"{self.node} ({self.op}): {self.constraint}: {value} vs {limit} -> {fix}"

    __str__ = text

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "op": self.op, "constraint": self.constraint, "value": self.value,
                "limit": self.limit, "fixed_by": self.fixed_by, "message": self.message}


@dataclass
class TensorShape:
    name: str
    shape: Shape | None
    dtype: str
    const: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape) if self.shape is not None else None,
                "dtype": self.dtype, "const": self.const}


@dataclass
class NodeShapes:
    """A node with the shapes of what it reads and writes (``--dump-shapes``)."""

    name: str
    op: str
    inputs: list[TensorShape] = field(default_factory=list)
    outputs: list[TensorShape] = field(default_factory=list)

    def text(self) -> str:
        def one(t: TensorShape) -> str:
            return f"{t.name} {format_shape(t.shape)}" + (" (const)" if t.const else "")

        return (f"{self.name} ({self.op}): {', '.join(one(t) for t in self.inputs) or '-'} -> "
                f"{', '.join(one(t) for t in self.outputs) or '-'}")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "op": self.op, "inputs": [t.to_json() for t in self.inputs],
                "outputs": [t.to_json() for t in self.outputs]}


@dataclass
class CheckReport:
    """The result of checking one model: violations, the memory estimate, optionally the shape listing."""

    violations: list[Violation]
    memory: MemoryEstimate | None = None
    shapes: list[NodeShapes] | None = None
    exempt: list[Violation] = field(default_factory=list)
    """Findings reported but not counted: channel counts a graph input fixes (without align_io)."""

    @property
    def clean(self) -> bool:
        return not self.violations

    @property
    def unfixable(self) -> list[Violation]:
        return [v for v in self.violations if not v.fixable]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "clean": self.clean,
            "violations": [v.to_json() for v in self.violations],
            "exempt": [v.to_json() for v in self.exempt],
            "memory": self.memory.to_json() if self.memory else None,
        }
        if self.shapes is not None:
            out["shapes"] = [s.to_json() for s in self.shapes]
        return out


# --- checking --------------------------------------------------------------------------------------


def find_violations(model: onnx.ModelProto, options: FixOptions) -> list[Violation]:
    """Every violation of the constraints in ``options`` (see the module docstring). ``model`` is not modified."""
    return check_model(model, options).violations


def check_model(model: onnx.ModelProto, options: FixOptions, *, shapes: bool = False,
                prepared: bool = False, memory: bool = True, _ask: bool = True,
                index: GraphIndex | None = None) -> CheckReport:
    """Violations plus the activation-memory estimate (and the shape listing when ``shapes``), all from one
    analysis copy with inferred shapes. ``options.input_shapes`` is applied to the copy, as a fixing run would.

    ``prepared``: ``model`` comes out of the pass manager (named nodes, frozen inputs, fresh inferred shapes),
    so it is read as is instead of copied and inferred again — it is still not modified.
    ``memory=False`` skips the activation estimate (a walk with liveness over every node) unless an SRAM budget
    needs it for a verdict. ``index``: with ``prepared``, an index of ``model`` built already (the run's own).
    """
    if prepared:
        light, inference_error = model, None
    else:
        light, inference_error = analysis_copy(model, options.input_shapes)
    # Every tensor's shape and every node's record stay alive to the end: the collector's full passes over
    # them would walk every one of them again and again for nothing.
    with paused_gc():
        index = index if prepared and index is not None and index.model is light else GraphIndex(light)
        ctx = _Context(index, options, constant_names(index))
        if inference_error:
            ctx.found.append(Violation("(graph)", "(model)", "shape-inference", inference_error, "consistent shapes",
                                       None, "onnx shape inference fails; the vendor compiler will likely fail too"))
        if options.batch_one:
            ctx.batch_sources, ctx.batch = batch_tensors(index)
        ctx.dynamic_in = _check_graph_inputs(ctx)
        if options.align > 0:
            ctx.input_fixed = channels_follow_inputs(light.graph.node, index.graph_inputs, ctx.const.__contains__)
        for node in light.graph.node:
            _check_node(ctx, node)
        if not options.allow_qdq:
            _check_quantized(ctx)
        _check_graph_outputs(ctx)
        if ctx.ask and _ask:
            _ask_passes(model, light, index, options, ctx.ask)
        estimate = None
        if memory or options.sram_bytes is not None:
            estimate = estimate_index(index, options.act_bytes, options.sram_bytes, constants=ctx.const,
                                      search_budget=options.schedule_budget)
            if estimate.sram_bytes is not None and not estimate.fits:
                ctx.found.append(_memory_violation(estimate))
                if not estimate.floor_fits:
                    ctx.found.append(_floor_violation(estimate, light))
        return CheckReport(ctx.found, estimate, _listing(index, ctx.const) if shapes else None, ctx.exempt)


@dataclass
class _Context:
    index: GraphIndex
    options: FixOptions
    const: set[str]
    dynamic_in: bool = False
    input_fixed: set[str] = field(default_factory=set)
    batch_sources: set[str] = field(default_factory=set)
    """Graph inputs whose axis 0 is the batch, and every tensor it is traced to (batch-one; batch_axis.py)."""
    batch: set[str] = field(default_factory=set)
    found: list[Violation] = field(default_factory=list)
    exempt: list[Violation] = field(default_factory=list)
    ask: list[Violation] = field(default_factory=list)
    """Violations whose fixed_by is the responsible pass's until its find confirms it (:func:`_ask_passes`)."""

    def add(self, node: onnx.NodeProto, constraint: str, value: Any, limit: Any, fixed_by: str | None,
            message: str = "") -> None:
        self.found.append(Violation(node.name, node.op_type, constraint, value, limit, fixed_by, message))

    def add_fixable(self, node: onnx.NodeProto, constraint: str, value: Any, limit: Any, message: str) -> None:
        """A violation of a constraint a pass is responsible for (``RESPONSIBLE``): whether it fixes this node is
        asked from the pass's find once every violation is known."""
        fixed_by = RESPONSIBLE.get((constraint, node.op_type)) or RESPONSIBLE[constraint]
        self.add(node, constraint, value, limit, fixed_by, message)
        self.ask.append(self.found[-1])


def _static(shape: Shape | None) -> bool:
    if shape is None:
        return False
    for d in shape:  # a plain loop: called for every tensor, a generator costs more
        if not isinstance(d, int) or d < 0:
            return False
    return True


def _find_model(model: onnx.ModelProto, light: onnx.ModelProto) -> onnx.ModelProto:
    """What the pass manager hands a pass (frozen input shapes, named nodes, inferred shapes: ``light``), with the
    initializer data the light copy left out put back from ``model``: for a find that reads weight values other
    than through ``GraphIndex.const_value`` (``Pass.find_reads_stubs``), and for the rewrites of
    :func:`_remaining_after`."""
    if light is model:
        return model
    full = onnx.ModelProto()
    full.CopyFrom(light)
    originals = {t.name: t for t in model.graph.initializer}
    for t in full.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL and t.name in originals:
            t.CopyFrom(originals[t.name])
    return full


def _remaining_after(name: str, full: onnx.ModelProto, options: FixOptions) -> set[tuple[str, str]]:
    """The (node, constraint) violations left once pass ``name`` has run (all its rounds: fold-constants
    converges in rounds of find and rewrite) on a copy of what the finds read. How a constraint fixed upstream
    of its node (_JUDGED_BY_RESULT) is judged; only asked when such a violation exists."""
    from onnx_npu_fix.passes import PASSES

    work = onnx.ModelProto()
    work.CopyFrom(full)
    try:
        PASSES[name]().run(work, options)
    except Exception:  # noqa: BLE001 - a pass that fails leaves every violation in place
        work = full
    return {(v.node, v.constraint) for v in check_model(work, options, memory=False, _ask=False).violations}


def _ask_passes(model: onnx.ModelProto, light: onnx.ModelProto, index: GraphIndex, options: FixOptions,
                asked: list[Violation]) -> None:
    """Confirm each violation's responsible pass with that pass's own find: it stays ``fixed_by`` only when the
    violating node is in the find's plans; otherwise no pass fixes it and the message says why (the pass's
    rejection reason). Each pass's find runs once, and only when a violation of its constraint exists. The finds
    run on the model as given (each pass alone, not after the passes before it in the order)."""
    from onnx_npu_fix.passes import PASSES

    full: onnx.ModelProto | None = None
    answers: dict[str, tuple[set[str], Found | None, str]] = {}
    left: dict[str, set[tuple[str, str]]] = {}  # per pass: what its plans say they leave violated
    remaining: dict[str, set[tuple[str, str]]] = {}
    for violation in asked:
        name = violation.fixed_by
        assert name is not None
        if name not in answers:
            the_pass = PASSES[name]()
            try:
                if the_pass.find_reads_stubs:
                    with values_from(light, model, index):
                        found = the_pass.find(light, options)
                else:
                    full = _find_model(model, light) if full is None else full
                    found = the_pass.find(full, options)
                answers[name] = (found.planned(), found, "")
                left[name] = found.left_violated()
            except Exception as exc:  # noqa: BLE001 - a find that fails answers "not fixed", with why
                answers[name] = (set(), None, f"its find failed: {type(exc).__name__}: {exc}".splitlines()[0])
        planned, found, failure = answers[name]
        if violation.constraint in _JUDGED_BY_RESULT and found is not None:
            if name not in remaining:
                full = _find_model(model, light) if full is None else full
                remaining[name] = _remaining_after(name, full, options)
            if (violation.node, violation.constraint) not in remaining[name]:
                continue
            reason: str | None = "rewrites it, but the violation remains"
        elif violation.node in planned:
            # A plan may touch a node without fixing every constraint on it (a Concat the padding crosses): the
            # find says so in the plan (Plan.leaves).
            if (violation.node, violation.constraint) not in left.get(name, ()):
                continue
            reason = "rewrites it, but the violation remains"
        else:
            reason = failure or (found.reason(violation.node) if found is not None else None)
        violation.fixed_by = None
        violation.message = f"{violation.message}; {name}: {reason or 'finds no rewrite for it'}"
        if violation.constraint == "leftover-op":
            node = next((n for n in light.graph.node if n.name == violation.node), None)
            producer = index.producer.get(node.input[0]) if node is not None and node.input else None
            if producer is not None and producer.op_type in CONTROL_FLOW_OPS and is_default_domain(producer):
                # Behind an If / Loop output: cleanup (re-run by fold-constants) removes it once that folds.
                violation.fixed_by = _control_flow_fix(index, producer)[0]
                violation.message += f"; it goes once {producer.name} ({producer.op_type}) is folded"


def _check_graph_inputs(ctx: _Context) -> bool:
    dynamic = False
    options = ctx.options
    for name in ctx.index.graph_inputs:
        shape = ctx.index.shape(name)
        if not _static(shape):
            dynamic = True
            ctx.found.append(Violation(
                name, "graph input", "dynamic-shape", format_shape(shape), "static", "--input-shape",
                f"freeze it with --input-shape {name}:<dims>; NPU compilers need static shapes"))
            continue
        assert shape is not None
        if options.max_rank is not None and len(shape) > options.max_rank:
            ctx.found.append(Violation(name, "graph input", "max-rank", len(shape), options.max_rank, None,
                                       f"graph input {name} {format_shape(shape)}"))
        if options.batch_one and name in ctx.batch_sources and shape[0] > 1:
            ctx.found.append(Violation(name, "graph input", "batch-one", shape[0], 1, None,
                                       f"graph input {name} {format_shape(shape)}; if the model allows it, "
                                       f"--input-shape {name}:1,... runs it with batch 1"))
    return dynamic


def _check_graph_outputs(ctx: _Context) -> None:
    # Judged on the inferred shape: an output declared without a shape (or with a symbolic dim) that inference
    # resolves is written static by any fixing run, and compilers infer it the same way.
    for name in ctx.index.graph_outputs:
        shape = ctx.index.shape(name)
        if _static(shape):
            continue
        if ctx.dynamic_in:
            ctx.found.append(Violation(name, "graph output", "dynamic-shape", format_shape(shape), "static",
                                       "--input-shape", "follows from the dynamic graph inputs"))
            continue
        producer = ctx.index.producer.get(name)
        if producer is None or any(i and i not in ctx.const and not _static(ctx.index.shape(i))
                                   for i in producer.input):
            continue  # the unknown shape starts upstream, where it is reported
        origin = _unknown_shape(ctx.index, producer, name, shape, ctx.const)
        ctx.found.append(Violation(name, "graph output", "dynamic-shape", format_shape(shape), "static",
                                   origin.fixed_by, f"{producer.name} ({producer.op_type}): {origin.message}"))
        if origin.fixed_by == RESPONSIBLE["unknown-shape"] and producer.op_type not in CONTROL_FLOW_OPS:
            ctx.ask.append(ctx.found[-1])


def _check_node(ctx: _Context, node: onnx.NodeProto) -> None:
    op, options = node.op_type, ctx.options
    standard = is_default_domain(node)
    if standard and op in ("Conv", "ConvTranspose"):
        _check_conv(ctx, node)
    elif op in ("QLinearConv", "ConvInteger"):
        _check_qoperator_conv(ctx, node)
    elif standard and op == "BatchNormalization" and not options.allow_batchnorm:
        ctx.add_fixable(node, "batchnorm", "present", "not allowed", "a BatchNormalization")
    elif standard and op in ("Resize", "Upsample") and options.require_nearest_resize:
        mode = get_attr(node, "mode", "nearest") or "nearest"
        if mode != "nearest":
            ctx.add_fixable(node, "resize-mode", mode, "nearest",
                            "--resize-mode nearest approximates it (bounded by --max-approx-error); exact keeps it "
                            "exact where an exact form exists")
    elif standard and op == "Concat" and options.concat_align > 0:
        _check_concat(ctx, node)
    elif standard and op in ("Dropout", "Identity"):
        ctx.add_fixable(node, "leftover-op", "present", "removed",
                        "an inference no-op; vendor compilers may reject or mis-handle it")
    if standard and op == "Resize" and (options.resize_factors is not None
                                        or options.linear_half_pixel_factors is not None):
        _check_resize_factor(ctx, node)
    if standard and op in CONTROL_FLOW_OPS and not options.allow_control_flow:
        _check_control_flow(ctx, node)
    if op in options.forbidden_ops and not _reported_as_op(op, options):
        why = "the target cannot run this op type"
        if standard and ("forbidden-op", op) in RESPONSIBLE:
            ctx.add_fixable(node, "forbidden-op", op, sorted(options.forbidden_ops), why)
        else:
            ctx.add(node, "forbidden-op", op, sorted(options.forbidden_ops), None, why)
    if op in options.initializer_inputs and standard:
        _check_constant_node_inputs(ctx, node)
    if op == "Squeeze" and options.squeeze_axes_ignored and standard and len(node.input) > 1 and node.input[1]:
        _check_squeeze_axes(ctx, node)
    if op == "Resize" and options.resize_scales_only and standard and given_sizes(ctx.index, node):
        ctx.add_fixable(node, "resize-sizes", f"sizes {node.input[3]}", "scales",
                        "the target's importer reads a Resize's size from its scales input only")
    _check_outputs(ctx, node)


def _check_constant_node_inputs(ctx: _Context, node: onnx.NodeProto) -> None:
    for name in node.input[1:]:
        producer = ctx.index.producer.get(name) if name else None
        if producer is not None and producer.op_type == "Constant":
            ctx.add_fixable(node, "constant-node-input", f"{name} from Constant {producer.name}", "an initializer",
                            f"the target's importer reads {node.op_type}'s inputs after the first from initializers "
                            "only")


def _check_squeeze_axes(ctx: _Context, node: onnx.NodeProto) -> None:
    before, after = ctx.index.static_shape(node.input[0]), ctx.index.static_shape(node.output[0])
    if before is not None and after is not None and keeps_a_size_one_axis(tuple(before), tuple(after)):
        ctx.add_fixable(node, "squeeze-axes", f"{format_shape(before)} -> {format_shape(after)}",
                        "every size-1 axis removed",
                        "the target's importer ignores the axes input and removes every size-1 axis")


def _reported_as_op(op: str, options: FixOptions) -> bool:
    """Already reported by a more specific check (avoid two lines for one node)."""
    return (op in ("Dropout", "Identity") or (op == "BatchNormalization" and not options.allow_batchnorm)
            or (op in CONTROL_FLOW_OPS and not options.allow_control_flow))




def _check_control_flow(ctx: _Context, node: onnx.NodeProto) -> None:
    """An If / Loop / Scan the target cannot run, with what would let fold-constants fold it."""
    fixed_by, message = _control_flow_fix(ctx.index, node)
    ctx.add(node, "control-flow", node.op_type, "no control flow", fixed_by, message)


def _control_flow_fix(index: GraphIndex, node: onnx.NodeProto) -> tuple[str | None, str]:
    """(what folds this onnx If / Loop / Scan — fold-constants, "--freeze-input sr=<value>", ... or None, why)."""
    from onnx_npu_fix.passes.fold_constants import control_flow_fix

    return control_flow_fix(index, node)


def _check_conv(ctx: _Context, node: onnx.NodeProto) -> None:
    index, options, op = ctx.index, ctx.options, node.op_type
    w_shape = index.shape(node.input[1]) if len(node.input) > 1 else None
    if not _static(w_shape) or len(w_shape) < 3:  # type: ignore[arg-type]
        return  # unknown weight shape: reported as unknown-shape where it matters
    assert w_shape is not None
    kernel = list(w_shape[2:])
    # Attributes are read only for the limits that are set (most runs set none): 33k reads each otherwise.
    dilations = (list(get_attr(node, "dilations") or [1] * len(kernel))
                 if options.max_dilation is not None or options.allowed_dilations is not None
                 or options.max_kernel is not None else [])
    strides = (list(get_attr(node, "strides") or [1] * len(kernel))
               if options.max_stride is not None or options.max_stride_quantized is not None else [])
    group = int(get_attr(node, "group", 1) or 1)
    if options.max_dilation is not None and max(dilations, default=1) > options.max_dilation:
        ctx.add_fixable(node, "dilation", dilations, options.max_dilation,
                        f"{op} dilation above the limit")
    elif options.allowed_dilations is not None:
        allowed = set(options.allowed_dilations) | {1}
        if any(d not in allowed for d in dilations):
            ctx.add_fixable(node, "dilation-allowed", dilations, sorted(allowed), f"{op} dilation not allowed")
    if options.max_kernel is not None and max(kernel, default=1) > options.max_kernel:
        ctx.add(node, "max-kernel", kernel, options.max_kernel, None,
                f"dilated extent {[(k - 1) * d + 1 for k, d in zip(kernel, dilations)]}")
    if options.max_stride is not None and max(strides, default=1) > options.max_stride:
        why = _stride_problem(ctx, node, group, w_shape)
        if why is not None:
            ctx.add(node, "max-stride", strides, options.max_stride, None, why)
    elif (options.max_stride_quantized is not None and op == "Conv"
          and max(strides, default=1) > options.max_stride_quantized
          and is_dequantized_const(ctx.index, node.input[1])):
        # Conv only: the rknn refusal it stands for is of its split of a Conv (a ConvTranspose was not measured)
        ctx.add(node, "max-stride", strides, options.max_stride_quantized, None,
                "a quantized Conv (max_stride_quantized): the target's limit for QDQ Convs")
    if options.allowed_kernels is not None and (len(set(kernel)) > 1 or kernel[0] not in options.allowed_kernels):
        ctx.add(node, "kernel-allowed", kernel, list(options.allowed_kernels), None,
                f"{op} kernel {'x'.join(map(str, kernel))}: the target runs only "
                f"{', '.join(f'{k}x{k}' for k in options.allowed_kernels)} kernels on its accelerator")
    if options.symmetric_pads and op == "Conv":
        _check_symmetric_pads(ctx, node, kernel)
    if options.align > 0:
        _check_conv_channels(ctx, node, w_shape, group)


def _stride_problem(ctx: _Context, node: onnx.NodeProto, group: int, w_shape: Shape) -> str | None:
    """None when ``stride_limit_depthwise_only`` exempts this stride above ``max_stride`` (an ordinary Conv), else
    what to add to the finding ("" or why it still counts)."""
    if not ctx.options.stride_limit_depthwise_only:
        return ""
    if node.op_type != "Conv":
        return "a ConvTranspose (Vela: TRANSPOSE_CONV strides 1x1 / 2x2 only)"
    if group > 1 and group == conv_channels(node.op_type, w_shape, group)[0]:
        return "a depthwise Conv: the stride limit applies (Vela 5.2: depthwise stride 4 on the CPU)"
    return None


def _check_symmetric_pads(ctx: _Context, node: onnx.NodeProto, kernel: list[int]) -> None:
    in_shape = ctx.index.shape(node.input[0])
    geometry = ConvGeometry(node, kernel, list(in_shape[2:]) if in_shape is not None else None)
    if not geometry.resolved:
        return
    pairs = [geometry.pad_pair(axis) for axis in range(geometry.rank)]
    if any(begin != end for begin, end in pairs):
        ctx.add(node, "asymmetric-pads", geometry.pads, "equal begin and end", None,
                f"pads (begin, end) per axis {pairs}: the target pads symmetrically only")


def _check_resize_factor(ctx: _Context, node: onnx.NodeProto) -> None:
    in_shape, out_shape = ctx.index.static_shape(node.input[0]), ctx.index.static_shape(node.output[0])
    if in_shape is None or out_shape is None:
        return
    opset = opset_version(ctx.index.model)
    coord = (get_attr(node, "coordinate_transformation_mode", "half_pixel") or "half_pixel") if opset >= 11 \
        else "asymmetric"
    mode = get_attr(node, "mode", "nearest") or "nearest"
    why = resize_factor_problem(in_shape, out_shape, mode, coord, ctx.options.resize_factors,
                                ctx.options.linear_half_pixel_factors)
    if why is None:
        return
    factors, half_pixel = ctx.options.resize_factors, ctx.options.linear_half_pixel_factors
    limit = "; ".join(([f"x{'/'.join(map(str, factors))}"] if factors is not None else [])
                      + ([f"half-pixel linear x{'/'.join(map(str, half_pixel))}"] if half_pixel is not None else []))
    ctx.add_fixable(node, "resize-factor", why, limit, f"{mode} Resize {why}")


def _check_quantized(ctx: _Context) -> None:
    """One finding for the whole model, at its first quantized op (the compiler refuses the model, not a node)."""
    quantized = [n for n in ctx.index.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                 or is_qoperator(n)]
    if quantized:
        first = quantized[0]
        ctx.add(first, "quantized-input", f"{len(quantized)} quantized ops", "float model", None,
                "the target's compiler takes float models and quantizes them with its own calibration; give it "
                "the float export")


def _check_qoperator_conv(ctx: _Context, node: onnx.NodeProto) -> None:
    """QLinearConv / ConvInteger: channels and dilation checked like a Conv's (the passes say they refuse them)."""
    slot = 3 if node.op_type == "QLinearConv" else 1
    options = ctx.options
    if options.max_dilation is not None or options.allowed_dilations is not None:
        dilations = [int(d) for d in (get_attr(node, "dilations") or [])]
        allowed = set(options.allowed_dilations or ()) | {1}
        too_large = options.max_dilation is not None and max(dilations, default=1) > options.max_dilation
        if too_large or (options.allowed_dilations is not None and any(d not in allowed for d in dilations)):
            ctx.add_fixable(node, "dilation" if too_large else "dilation-allowed", dilations,
                            options.max_dilation if too_large else sorted(allowed), f"{node.op_type} dilation")
    w_shape = ctx.index.shape(node.input[slot]) if len(node.input) > slot else None
    if _static(w_shape) and len(w_shape) >= 3:  # type: ignore[arg-type]
        if options.align > 0:
            _check_conv_channels(ctx, node, w_shape, int(get_attr(node, "group", 1) or 1))  # type: ignore[arg-type]


def _check_conv_channels(ctx: _Context, node: onnx.NodeProto, w_shape: Shape, group: int) -> None:
    align = ctx.options.align
    c_in, c_out = conv_channels(node.op_type, w_shape, group)
    per_group = group > 1 and group != c_in  # depthwise (group == C) is aligned on C and M
    what = f" per group (group {group})" if per_group else ""
    n_in, n_out = (c_in // group, c_out // group) if per_group else (c_in, c_out)
    if n_in % align:
        x = node.input[0]
        if x in ctx.input_fixed and not ctx.options.align_io:
            # The graph input's channel count is the user's interface (issue: "except the channel count of a
            # graph input"): reported, but not a violation unless --align-io asks npufix to pad it.
            ctx.exempt.append(Violation(
                node.name, node.op_type, "in-channels-align", n_in, align, None,
                f"input channels{what} follow a graph input (via {x}); --align-io pads them inside the graph"))
        else:
            ctx.add_fixable(node, "in-channels-align", n_in, align, f"input channels{what}")
    if n_out % align:
        depthwise = group > 1 and group == c_in
        if depthwise and node.input[0] in ctx.input_fixed and not ctx.options.align_io:
            # A depthwise conv's output count follows its input count, which a graph input fixes here.
            ctx.exempt.append(Violation(
                node.name, node.op_type, "out-channels-align", n_out, align, None,
                f"depthwise output channels follow a graph input (via {node.input[0]}); --align-io pads them"))
            return
        ctx.add_fixable(node, "out-channels-align", n_out, align, f"output channels{what}")


def _check_concat(ctx: _Context, node: onnx.NodeProto) -> None:
    index, align = ctx.index, ctx.options.concat_align
    channels: list[Any] = []
    bad: list[str] = []
    for inp in node.input:
        if not inp or inp in ctx.const:
            continue
        shape = index.shape(inp)
        if shape is None or len(shape) < 3:
            return  # shape vectors and [N, F] concats are not feature maps
        axis = get_attr(node, "axis", 1)
        if (axis + len(shape) if axis < 0 else axis) != 1:
            return  # a concat along batch or space: its channel count is the inputs', not their sum
        c = shape[1]
        channels.append(c if isinstance(c, int) else "?")
        if isinstance(c, int) and c % align:
            bad.append(f"{inp} ({c})")
    if not bad:
        return
    ctx.add_fixable(node, "concat-align", channels, align, f"inputs {', '.join(bad)} are not multiples of {align}")


def _check_outputs(ctx: _Context, node: onnx.NodeProto) -> None:
    index, options, const = ctx.index, ctx.options, ctx.const
    for out in node.output:
        if not out or out in const:
            continue
        shape = index.shape(out)
        if not _static(shape):
            used = bool(index.consumers_of(out)) or out in index.output_set
            # Report where an unknown shape starts (with static graph inputs), not everything downstream.
            if used and not ctx.dynamic_in and out not in index.output_set and not any(
                    i and i not in const and not _static(index.shape(i)) for i in node.input):
                ctx.found.append(_unknown_shape(index, node, out, shape, const))
                if ctx.found[-1].fixed_by == RESPONSIBLE["unknown-shape"] and node.op_type not in CONTROL_FLOW_OPS:
                    ctx.ask.append(ctx.found[-1])
            if shape is None:
                continue
        assert shape is not None
        if options.max_rank is not None and len(shape) > options.max_rank:
            ctx.add(node, "max-rank", len(shape), options.max_rank, None, f"{out} {format_shape(shape)}")
        if (options.batch_one and out in ctx.batch and out not in ctx.batch_sources and isinstance(shape[0], int)
                and shape[0] > 1):
            # Report where batch > 1 starts (Expand, Tile, a broadcast), not every tensor downstream of it.
            traced_in = [index.shape(i) for i in node.input if i in ctx.batch]
            if traced_in and all(s and isinstance(s[0], int) and s[0] <= 1 for s in traced_in):
                hint = "; --s2b-layout spatial or channel keeps batch 1" if options.s2b_layout == "batch" else ""
                ctx.add(node, "batch-one", shape[0], 1, None,
                        f"{out} {format_shape(shape)}: batch > 1 starts here{hint}")


def _unknown_shape(index: GraphIndex, node: onnx.NodeProto, out: str, shape: Shape | None,
                   const: set[str]) -> Violation:
    # A node that reads a computed constant (a Shape -> ... chain that inference could not see through) gets a
    # static shape once fold-constants turns that chain into an initializer; anything else is data-dependent.
    if node.op_type in CONTROL_FLOW_OPS and is_default_domain(node):
        # The output of an If / Loop: static once fold-constants folds it, which may need a graph input frozen.
        fixed_by, why = _control_flow_fix(index, node)
        return Violation(node.name, node.op_type, "unknown-shape", format_shape(shape), "static", fixed_by,
                         f"shape of {out} is decided at run time by the {node.op_type}: {why}")
    if is_default_domain(node):
        # Whether folding makes it static (a Shape chain inference could not see through) is fold-constants'
        # call: its find is asked (_ask_passes, judged by the result), not a copy of its rule here.
        return Violation(node.name, node.op_type, "unknown-shape", format_shape(shape), "static",
                         RESPONSIBLE["unknown-shape"], f"shape of {out} is not known before run time")
    return Violation(node.name, node.op_type, "unknown-shape", format_shape(shape), "static", None,
                     f"shape of {out} depends on an op without shape inference ({node.domain})")


def _memory_violation(memory: MemoryEstimate) -> Violation:
    live = ", ".join(f"{t.name} {format_bytes(t.bytes)} ({t.producer} -> {t.last_consumer})"
                     for t in memory.live_at_peak[:4])
    more = f" and {len(memory.live_at_peak) - 4} more" if len(memory.live_at_peak) > 4 else ""
    message = f"estimated activation peak (no tiling), misses by {format_bytes(memory.miss_bytes)}; " \
              f"live: {live}{more}"
    if memory.unknown:
        message += f"; {len(memory.unknown)} tensors of unknown size not counted"
    fixed_by = "reorder-memory" if memory.reorder_fits else ("--split" if memory.floor_fits else None)
    if memory.reordered_peak is not None:
        message += f"; the memory-aware order peaks at {format_bytes(memory.reordered_peak)}"
    message += _floor_text(memory)
    return Violation(memory.peak_node or "(graph)", memory.peak_op or "(graph)", "sram", memory.peak_bytes,
                     memory.sram_bytes, fixed_by, message)


def _floor_text(memory: MemoryEstimate) -> str:
    """What the largest single layer says about the budget (docs/memory.md)."""
    if memory.floor_node is None or memory.sram_bytes is None:
        return ""
    if memory.floor_fits:
        return (f"; every layer fits (largest {memory.floor_node}: {format_bytes(memory.floor_bytes)}): "
                "--split DIR cuts the model into segments that fit")
    return (f"; layer {memory.floor_node} ({memory.floor_op}) alone needs {format_bytes(memory.floor_bytes)} "
            "(inputs + outputs): no order or split fits it (sram-layer)")


def _floor_violation(memory: MemoryEstimate, model: onnx.ModelProto) -> Violation:
    """The largest layer alone is above the budget: name it and what input size (or tiling) would fit."""
    from onnx_npu_fix.analysis.split import resolution_hint

    hint = resolution_hint(model, memory.sram_bytes, memory.act_bytes)
    return Violation(memory.floor_node or "(graph)", memory.floor_op or "(graph)", "sram-layer", memory.floor_bytes,
                     memory.sram_bytes, None, f"inputs + outputs of one layer; would fit: {hint.text()}")


# --- shapes ----------------------------------------------------------------------------------------


def _dtype(index: GraphIndex, name: str) -> str:
    elem = index.elem_type(name)
    return onnx.TensorProto.DataType.Name(elem).lower() if elem else "?"


def _listing(index: GraphIndex, const: set[str]) -> list[NodeShapes]:
    listing: list[NodeShapes] = []
    for node in index.graph.node:
        entry = NodeShapes(node.name, node.op_type)
        for name in node.input:
            if name:
                entry.inputs.append(TensorShape(name, index.shape(name), _dtype(index, name), name in const))
        for name in node.output:
            if name:
                entry.outputs.append(TensorShape(name, index.shape(name), _dtype(index, name), name in const))
        listing.append(entry)
    return listing


def shape_listing(model: onnx.ModelProto,
                  input_shapes: dict[str, Sequence[int]] | None = None) -> list[NodeShapes]:
    """Every node with its input and output shapes, after shape inference on a copy (``--dump-shapes``)."""
    light, _ = analysis_copy(model, input_shapes)
    index = GraphIndex(light)
    return _listing(index, constant_names(index))


def render_shapes(listing: Sequence[NodeShapes]) -> str:
    """One line per node: ``name (op): in [shape], w [shape] (const) -> out [shape]``."""
    return "\n".join(entry.text() for entry in listing)


# --- text ------------------------------------------------------------------------------------------


def render_violations(violations: Sequence[Violation]) -> str:
    """One line per violation, then a summary line; 'no violations' when clean."""
    if not violations:
        return "no violations"
    return "\n".join([*(v.text() for v in violations), violations_summary(violations)])


def violations_summary(violations: Sequence[Violation]) -> str:
    """The last line of :func:`render_violations`: how many, and which pass fixes how many."""
    if not violations:
        return "no violations"
    by_fix: dict[str, int] = {}
    for v in violations:
        if v.fixed_by:
            by_fix[v.fixed_by] = by_fix.get(v.fixed_by, 0) + 1
    unfixable = sum(1 for v in violations if not v.fixed_by)
    fixable = len(violations) - unfixable
    parts = []
    if fixable:
        parts.append(f"{fixable} fixable (" + ", ".join(f"{k} {n}" for k, n in by_fix.items()) + ")")
    if unfixable:
        parts.append(f"{unfixable} that no pass fixes")
    noun = "violation" if len(violations) == 1 else "violations"
    return f"{len(violations)} {noun}: " + "; ".join(parts)


def render_check(report: CheckReport) -> str:
    """Violations, then the memory estimate: the text output of ``--check``."""
    parts = [render_violations(report.violations)]
    if report.exempt:
        parts.append("\n".join(f"exempt: {v.text()} ({v.message})" for v in report.exempt))
    if report.memory is not None:
        parts.append(render_memory(report.memory))
    if report.shapes is not None:
        parts.append(render_shapes(report.shapes))
    return "\n\n".join(parts)


# --- which constraints count --------------------------------------------------------------------------

# A constraint counts when one of its ``asked_by`` fields was requested (FixOptions.requested: by a target or an
# explicit option); the ones without a field of their own count under any target. Built-in defaults (align 8,
# nearest Resize, no BatchNormalization) drive the passes but are not constraints unless asked for.


def judge_violation(node: str, op: str, signature: str | None, tried: int) -> Violation:
    """The ``judge`` constraint: ``--judge`` rejects the output (``signature``) and the ``tried`` other forms;
    ``node``: the first node of the region it was reduced to. It is asked for by ``--judge`` itself (the caller
    counts it; no FixOptions field asks for it)."""
    return Violation(node, op, "judge", signature, "accepted by --judge", None,
                     f"no form npufix knows was accepted ({tried} tried)")


def split_requested(violations: Sequence[Violation], options: FixOptions,
                    passes: Sequence[str] | None = None) -> tuple[list[Violation], list[tuple[Violation, str]]]:
    """(the violations that count, the others with why they do not).

    With ``options.requested`` None every violation counts. Otherwise one counts when a target or an explicit
    option asked for its constraint (``ASKED_BY``), except that the constraint of a pass left out of ``passes``
    (--skip / --passes: a pass of the default order that is not in ``passes``) is only a warning, unless the target
    asked for it. An opt-in pass (reorder-memory) that was not asked for skips nothing: its constraint counts."""
    if options.requested is None:
        return list(violations), []
    requested = options.requested
    counted: list[Violation] = []
    others: list[tuple[Violation, str]] = []
    from onnx_npu_fix.passes import DEFAULT_ORDER

    default_passes = {cls.name for cls in DEFAULT_ORDER}
    for violation in violations:
        fields = ASKED_BY.get(violation.constraint, ())
        asked = {requested[f] for f in fields if f in requested}
        if not fields and options.target is not None:
            asked.add("target")
        if not asked:
            others.append((violation, "not requested"))
        elif (passes is not None and violation.fixed_by in default_passes and violation.fixed_by not in passes
              and "target" not in asked):
            others.append((violation, f"pass {violation.fixed_by} was not run"))
        else:
            counted.append(violation)
    return counted, others
