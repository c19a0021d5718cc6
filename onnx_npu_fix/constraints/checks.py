"""The checks of ``--check`` (and of the re-check after a fixing run): one walk over the nodes, every violation
of the constraints the options describe, each with the passes that may fix it, asked from their finds once every
violation is known (constraints/fixed_by.py).

Each check is driven by a :class:`~onnx_npu_fix.config.options.FixOptions` field. Channel counts come from the
weight shape (:func:`onnx_npu_fix.ir.ops.conv_channels`). A plain or depthwise conv must have C and M aligned; a
grouped conv (1 < group < C) must have its per-group counts aligned, since NPUs run it as ``group`` convs. Shape
findings (unknown-shape, batch-one) are reported where they start, not again on every tensor downstream.

Everything runs on a light copy with inferred shapes (:func:`onnx_npu_fix.analysis.memory.analysis_copy`); the
caller's model is never modified. One pass over the nodes with a GraphIndex, O(nodes + edges), plus the memory
estimate, plus the candidate passes' finds when there is something to ask them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix.analysis.batch_axis import batch_tensors
from onnx_npu_fix.analysis.memory import MemoryEstimate, analysis_copy, estimate_index
from onnx_npu_fix.analysis.schedule import constant_names
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.constraints.fixed_by import Asked, ask_passes, control_flow_fix
from onnx_npu_fix.constraints.report import CheckReport, Violation, listing
from onnx_npu_fix.constraints.table import responsible
from onnx_npu_fix.ir.graph import (
    ConvGeometry,
    GraphIndex,
    Shape,
    format_bytes,
    format_shape,
    get_attr,
    opset_version,
    paused_gc,
)
from onnx_npu_fix.ir.ops import (
    CONTROL_FLOW_OPS,
    channels_follow_inputs,
    conv_channels,
    is_default_domain,
    resize_factor_problem,
)
from onnx_npu_fix.ir.qdq import is_dequantized_const, is_qoperator
from onnx_npu_fix.passes.resize_scales import given_sizes
from onnx_npu_fix.passes.squeeze_reshape import keeps_a_size_one_axis


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
            ask_passes(model, light, index, options, ctx.ask, _recheck)
        estimate = None
        if memory or options.sram_bytes is not None:
            estimate = estimate_index(index, options.act_bytes, options.sram_bytes, constants=ctx.const,
                                      search_budget=options.schedule_budget)
            if estimate.sram_bytes is not None and not estimate.fits:
                ctx.found.append(_memory_violation(estimate))
                if not estimate.floor_fits:
                    ctx.found.append(_floor_violation(estimate, light))
        return CheckReport(ctx.found, estimate, listing(index, ctx.const) if shapes else None, ctx.exempt)


def _recheck(model: onnx.ModelProto, options: FixOptions) -> list[Violation]:
    """The violations of ``model``, no pass asked: how an upstream fix is judged (fixed_by.remaining_after)."""
    return check_model(model, options, memory=False, _ask=False).violations


def _folding_decides(node: onnx.NodeProto) -> bool:
    """Whether a pass's find decides if an unknown shape starting at ``node`` becomes static (a default-domain
    node that is no If / Loop / Scan: those are control_flow_fix's)."""
    return is_default_domain(node) and node.op_type not in CONTROL_FLOW_OPS


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
    ask: list[Asked] = field(default_factory=list)
    """Violations whose fixed_by is their first candidate's until the candidates' finds settle it
    (fixed_by.ask_passes)."""

    def add(self, node: onnx.NodeProto, constraint: str, value: Any, limit: Any, fixed_by: str | None,
            message: str = "") -> None:
        self.found.append(Violation(node.name, node.op_type, constraint, value, limit, fixed_by, message))

    def add_fixable(self, node: onnx.NodeProto, constraint: str, value: Any, limit: Any, message: str) -> None:
        """A violation of a constraint passes declare they fix (table.responsible): which of them fixes this node
        is asked from their finds once every violation is known."""
        self.add(node, constraint, value, limit, None, message)
        self.ask_later(self.found[-1], responsible(constraint, node.op_type))

    def ask_later(self, violation: Violation, candidates: tuple[str, ...]) -> None:
        """``violation`` is fixed by the first of ``candidates`` whose find fixes it (asked at the end)."""
        if candidates:
            violation.fixed_by = candidates[0]
            self.ask.append(Asked(violation, candidates))


def _static(shape: Shape | None) -> bool:
    if shape is None:
        return False
    for d in shape:  # a plain loop: called for every tensor, a generator costs more
        if not isinstance(d, int) or d < 0:
            return False
    return True


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
        if _folding_decides(producer):
            ctx.ask_later(ctx.found[-1], responsible("dynamic-shape", producer.op_type))


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
        if standard and responsible("forbidden-op", op):
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
    fixed_by, message = control_flow_fix(ctx.index, node)
    ctx.add(node, "control-flow", node.op_type, "no control flow", fixed_by, message)


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
                if _folding_decides(node):
                    ctx.ask_later(ctx.found[-1], responsible("unknown-shape", node.op_type))
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
        fixed_by, why = control_flow_fix(index, node)
        return Violation(node.name, node.op_type, "unknown-shape", format_shape(shape), "static", fixed_by,
                         f"shape of {out} is decided at run time by the {node.op_type}: {why}")
    if is_default_domain(node):
        # Whether folding makes it static (a Shape chain inference could not see through) is the call of the
        # passes that declare they fix it: their finds are asked (judged by the result), not a copy of a rule here.
        return Violation(node.name, node.op_type, "unknown-shape", format_shape(shape), "static", None,
                         f"shape of {out} is not known before run time")
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
    # The estimate ran the order search reorder-memory runs (Fixes.asked False): its answer is the pass's.
    reorder = next(iter(responsible("sram")), None)
    fixed_by = reorder if memory.reorder_fits else ("--split" if memory.floor_fits else None)
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
