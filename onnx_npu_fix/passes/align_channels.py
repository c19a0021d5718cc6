"""align-channels: every Conv / ConvTranspose channel count a multiple of ``--align``; outputs unchanged.

Before -> after (``--align 8``)::

    x[1,4,L] -> Conv(W[60,4,3], b[60]) -> Relu -> Conv(W[16,60,3]) -> y
    x[1,4,L] -> Conv(W[64,4,3], b[64]) -> Relu -> Conv(W[16,64,3]) -> y      (W/b rows 60..63 and W[:,60:64] zero)

    x -> Conv(60) -> Flatten -> Gemm          becomes   x -> Conv(64) -> Slice(ch 0..60) -> Flatten -> Gemm
    Conv(36) -> Concat(., u[64]) -> Conv      becomes   Conv(40) -> Concat(., u) [104 ch] -> Conv(C_in 104)

The math. A padded tensor X' holds the C real channels of X at positions ``cmap`` of P >= C channels (the
*layout*): X'[:, cmap[c]] = X[:, c]; the other P - C channels are "pad channels".

- Producer Conv: W'[cmap[o]] = W[o], b'[cmap[o]] = b[o], every other filter and bias 0, so X'[:, cmap[o]] =
  X[:, o] and the pad channels are exactly 0.
- Channel-local op f (Relu, Sigmoid, pooling, Resize, per-channel Mul/Add/Div with constants padded through the
  same map, BatchNormalization with padded parameters, ...): f(X')[:, cmap[c]] = f(X)[:, c]. The pad channels
  may stop being 0 (sigmoid(0) = 0.5, a bias Add), so nothing downstream may rely on their value; padded
  constants use values that keep them finite (1 for divisors and variances), because a later 0 * inf = NaN would
  poison a real channel.
- Consumer Conv: y[o] = sum_c W[o, c] * X[c] = sum_p W'[o, p] * X'[p] with W'[o, cmap[c]] = W[o, c] and
  W'[o, p] = 0 on pad channels, so whatever the pad channels hold never reaches a real output. Grouped convs
  keep the real channels of group j inside new block j; a depthwise conv grows its group count with C.
- Concat on the channel axis: the output map is the inputs' maps shifted by the inputs' padded offsets.
- Anything else (Reshape, Flatten, Transpose, MatMul, Gemm, reductions or normalisations over channels, graph
  outputs, unknown ops) reads the real tensor: Slice(cmap[0] .. cmap[0]+C) on axis 1 when the map is one
  contiguous block, else Gather(cmap, axis=1). The restored tensor keeps the original name, so those consumers
  and the graph outputs are untouched; the padded tensor gets a new name.

Cheapest padding: a Conv grows its output only when its own output count (per group) is unaligned or a grouped
consumer asks for its block layout; the padded layout is carried through a channel-local op only when that op's
result reaches a Conv (else the real tensor is restored right after the producer); a Conv input that arrives
unaligned from a non-Conv producer gets a Pad node. Channels fixed by a graph input are reported (non-blocking)
unless ``align_io`` asks for a Pad inside the graph. The extra MACs and weight bytes go into the metrics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import (
    GraphEditor,
    GraphIndex,
    get_attr,
    has_subgraphs,
    opset_version,
    private_initializer,
    set_attr,
)
from onnx_npu_fix.ir.ops import channels_follow_inputs, conv_channels, is_default_domain
from onnx_npu_fix.ir.ops import conv_aligned as _conv_aligned
from onnx_npu_fix.ir.qdq import (
    QuantizedConst,
    dequantizer_of,
    is_qoperator,
    qdq_conv_weight_problem,
    qoperator_reason,
    quant_params,
    quantized_const,
    store_quantized,
    wrap_chain,
)
from onnx_npu_fix.passes.base import Change, Fact, Fixes, Form, Found, Pass, PassResult, Plan, Rejection

# Elementwise ops that map every finite input to a finite output, channel by channel.
_UNARY = frozenset({
    "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Elu", "Selu", "Celu",
    "Softplus", "Softsign", "Gelu", "Erf", "Mish", "ThresholdedRelu", "Neg", "Abs", "Identity", "Dropout",
})
_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean"})
_REDUCE = frozenset({"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceSumSquare", "ReduceL1",
                     "ReduceL2"})
_SOFTMAX = frozenset({"Softmax", "LogSoftmax", "Hardmax"})


def _ceil_to(value: int, align: int) -> int:
    return -(-value // align) * align


@dataclass(frozen=True)
class Layout:
    """Where the real channels of a tensor sit in its padded form: real channel c at position ``cmap[c]``."""

    size: int
    cmap: tuple[int, ...]

    @classmethod
    def prefix(cls, channels: int, size: int) -> Layout:
        return cls(size, tuple(range(channels)))

    @classmethod
    def blocks(cls, groups: int, per_group: int, new_per_group: int) -> Layout:
        """Group j's ``per_group`` real channels at the start of block j of ``new_per_group`` positions."""
        return cls(groups * new_per_group,
                   tuple(j * new_per_group + i for j in range(groups) for i in range(per_group)))

    @property
    def channels(self) -> int:
        return len(self.cmap)

    @cached_property
    def block_start(self) -> int | None:
        """First position of the real channels when they form one contiguous run, else None."""
        start = self.cmap[0] if self.cmap else 0
        return start if self.cmap == tuple(range(start, start + len(self.cmap))) else None

    def fits_groups(self, groups: int, per_group: int, new_per_group: int) -> bool:
        """True when group j's real channels all sit in block j of a ``groups * new_per_group`` layout."""
        if self.size != groups * new_per_group:
            return False
        positions = np.asarray(self.cmap).reshape(groups, per_group)
        return bool((positions // new_per_group == np.arange(groups)[:, None]).all())

    def __str__(self) -> str:
        start = self.block_start
        where = "scattered" if start is None else f"at {start}" if start else "first"
        return f"{self.channels} of {self.size} ({where})"


@dataclass
class _Conv:
    """A Conv / ConvTranspose with constant weights, in the NPU's view (dense, depthwise or grouped).

    The weight and bias values are loaded only when the conv is rewritten (most convs of a big model are not).
    """

    node: onnx.NodeProto
    transpose: bool
    shape: tuple[int, ...]
    group: int
    c_in: int
    c_out: int
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None
    weight_q: QuantizedConst | None = None
    """QDQ weight: ``DequantizeLinear(W_q, scale, zp)``; ``weight`` then holds the integers W_q."""
    bias_q: QuantizedConst | None = None
    """QDQ bias: ``DequantizeLinear(b_q int32, in_scale * w_scale, 0)``; ``bias`` then holds b_q."""

    @property
    def kind(self) -> str:
        if self.group == 1:
            return "dense"
        return "depthwise" if self.group == self.c_in else "grouped"

    @property
    def cg(self) -> int:
        return self.c_in // self.group

    @property
    def mg(self) -> int:
        return self.c_out // self.group

    def load(self, index: GraphIndex) -> None:
        if self.weight_q is not None:
            self.weight = self.weight_q.q
        else:
            self.weight = index.const_value(self.node.input[1])
        if self.bias_q is not None:
            self.bias = self.bias_q.q
        elif len(self.node.input) > 2 and self.node.input[2]:
            self.bias = index.const_value(self.node.input[2])

    def canonical_scale(self) -> np.ndarray | None:
        """A per-channel weight scale (and zero point) per output channel m, as [2, c_out]; None if per-tensor."""
        params = self.weight_q.params if self.weight_q is not None else None
        if params is None or params.axis is None:
            return None
        both = np.stack([params.scale.astype(np.float64), params.zero_point.astype(np.float64)])
        if not self.transpose:
            return both
        return np.tile(both, (1, self.group))  # ConvTranspose: axis 1 holds j of m = grp * M/g + j

    def canonical_weight(self) -> np.ndarray:
        """The weight as a Conv's [c_out, c_in / group, k...] (ConvTranspose stores [c_in, c_out / group, k...])."""
        assert self.weight is not None
        if not self.transpose:
            return self.weight
        kernel = self.weight.shape[2:]
        return (self.weight.reshape(self.group, self.cg, self.mg, *kernel).swapaxes(1, 2)
                .reshape(self.c_out, self.cg, *kernel))


def _is_prefix(channel_map: np.ndarray) -> bool:
    """Whether a channel map sends channel i to position i (real channels first, padding after)."""
    return bool((channel_map == np.arange(len(channel_map))).all())


def _from_canonical(weight: np.ndarray, transpose: bool, groups: int, cg: int, mg: int) -> np.ndarray:
    if not transpose:
        return weight
    kernel = weight.shape[2:]
    return weight.reshape(groups, mg, cg, *kernel).swapaxes(1, 2).reshape(groups * cg, mg, *kernel)


@dataclass
class _Carrier:
    """How a channel-local node carries a padded layout from its inputs to its outputs."""

    slots: list[int]
    """Inputs that carry the channel layout (the data inputs with the full channel axis at axis 1)."""
    kind: str = "same"
    """same: every carried input in one layout, outputs in it too; concat: layouts stacked on the channel axis."""
    consts: list[tuple[int, int, float]] = field(default_factory=list)
    """(input slot, axis of that constant holding the channels, value for pad channels)."""
    rank: int | None = None
    channels: int | None = None
    """The node's real output channel count (where known)."""
    broadcast: bool = False
    """Whether inputs broadcast (elementwise): a real input with channel dim 1 then needs no padding."""
    in_channels: dict[int, int] = field(default_factory=dict)
    """concat: real channel count of every input slot."""
    sizes: tuple[int, int] | None = None
    """Resize: (sizes input slot, index of the channel entry) to rewrite to the padded count."""


@dataclass(kw_only=True)
class PadConvPlan(Plan):
    """pad-channels: the Conv at ``position`` of ``graph.node`` reads its input in ``target`` (None: the real
    tensor) and emits ``out`` (None: real channels), as ``groups`` groups of ``cg_new`` inputs / ``mg_new``
    outputs. The weights and bias are padded to match (zero filters, zero taps on pad input channels)."""

    position: int
    target: Layout | None
    out: Layout | None
    groups: int
    cg_new: int
    mg_new: int


@dataclass(kw_only=True)
class CarryPlan(Plan):
    """carry: the channel-local node at ``position`` of ``graph.node`` passes the padding through, every output
    in layout ``out``. ``inputs`` (Concat on the channel axis) holds the layout each input slot arrives in
    (None: real)."""

    position: int
    out: Layout
    carrier: _Carrier
    inputs: tuple[Layout | None, ...] = ()


UNALIGNED_TRY = 8
"""The alignment the form search tries for an unaligned conv when the run aligns nothing (``align`` 0)."""


def _alignments(current: int, region: Sequence[onnx.NodeProto]) -> list[int]:
    """``align`` values worth trying: UNALIGNED_TRY when the run aligns nothing, else none, then twice as much."""
    return [UNALIGNED_TRY] if current == 0 else [0, 2 * current]


def _unaligned(index: GraphIndex, node: onnx.NodeProto, options: FixOptions) -> str | None:
    """What is unaligned about a Conv / ConvTranspose's channels at the run's alignment (UNALIGNED_TRY when it
    aligns nothing), or None."""
    if len(node.input) < 2:
        return None
    weight = index.shape(node.input[1])
    if weight is None:
        return None
    align = options.align or UNALIGNED_TRY
    group = get_attr(node, "group", 1)
    c_in, c_out = conv_channels(node.op_type, weight, group)
    if _conv_aligned(align, group, c_in, c_out):
        return None
    return f"{node.op_type} channels {c_in} -> {c_out} not multiples of {align}"

class AlignChannelsPass(Pass):
    """Channel alignment. ``find`` decides every layout read-only: it walks the graph in order and propagates the
    planned layouts in its own table (the layout a Conv's input arrives in is the one its producer's plan
    emits); ``rewrite`` applies the plans, inserting the Pad / Gather / Slice each layout change needs."""
    name = "align-channels"
    summary = ("pad Conv/ConvTranspose channel counts to a multiple of --align with zero filters, carry the "
               "padding through channel-local ops and slice it off where channels mix")
    exact = True
    fixes = (
        Fixes("in-channels-align", note="channels a graph input fixes, even through Relu / pooling, are *exempt* "
              "unless `--align-io`; weights neither constant nor a QDQ weight it pads, and QOperator convs: none, "
              "with its reason"),
        Fixes("out-channels-align", note="padded, sliced back where the real tensor is read; a depthwise conv's "
              "that follow a graph input are *exempt* unless `--align-io`"),
        Fixes("concat-align", note="where its padding makes them multiples"),
    )
    forms = (Form("align", ("Conv", "ConvTranspose", "Pad", "Slice", "Concat"), "the channel alignment: how many "
                  "zero channels each conv is padded with", cost=100, values=_alignments,
                  facts=(Fact("Conv", "{}", _unaligned), Fact("ConvTranspose", "{}", _unaligned))),)
    find_reads_stubs = True

    def find(self, model: onnx.ModelProto, options: FixOptions) -> Found:
        if options.align <= 1:
            return Found()
        if opset_version(model) < 11:
            return Found(rejections=_opset_rejections(model, options.align))
        if _all_convs_aligned(model, options.align):
            return AlignFound(all_aligned=True)  # one cheap scan of weight dims instead of planning over the graph
        finder = _Finder(model, options)
        return AlignFound(finder.plan(), finder.rejections)

    def rewrite(self, model: onnx.ModelProto, options: FixOptions, found: Found) -> PassResult:
        result = PassResult(rejections=list(found.rejections))
        # The same test as find's: the metrics (zero figures included) appear whenever find planned over the graph.
        # find's answer when it gave one (the same model): the scan walks the whole graph.
        if options.align > 1 and opset_version(model) >= 11 and not (
                found.all_aligned if isinstance(found, AlignFound) else _all_convs_aligned(model, options.align)):
            _Rewriter(model, options, result).apply(found.plans)
        return result


@dataclass
class AlignFound(Found):
    """What align-channels' find saw, with whether every conv was aligned already (then it planned nothing)."""

    all_aligned: bool = False


def _opset_rejections(model: onnx.ModelProto, align: int) -> list[Rejection]:
    """Before opset 11 Pad and Slice take no tensor parameters: every unaligned (or unknown) conv is refused."""
    index = GraphIndex(model)
    rejections = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose") or len(node.input) < 2:
            continue
        shape = index.static_shape(node.input[1])
        group = int(get_attr(node, "group", 1))
        if shape is not None and len(shape) > 2:
            c_in, c_out = conv_channels(node.op_type, shape, group)
            if _conv_aligned(align, group, c_in, c_out):
                continue
        rejections.append(Rejection(node.name, node.op_type, "opset < 11 is not supported by align-channels "
                                    "(convert the model to opset 11+)", blocking=True))
    return rejections


def _all_convs_aligned(model: onnx.ModelProto, align: int) -> bool:
    """True when every Conv / ConvTranspose has constant weights whose channel counts are already aligned."""
    dims = {t.name: t.dims for t in model.graph.initializer}
    for node in model.graph.node:  # a QDQ weight DQ(W_q): the dims of W_q
        if node.op_type == "DequantizeLinear" and node.input and node.input[0] in dims:
            dims[node.output[0]] = dims[node.input[0]]
    for node in model.graph.node:
        if node.op_type in ("QLinearConv", "ConvInteger"):
            return False  # refused with a reason in find
        if node.op_type not in ("Conv", "ConvTranspose"):
            continue
        shape = dims.get(node.input[1]) if len(node.input) > 1 else None
        if shape is None or len(shape) < 3:
            return False
        group = int(get_attr(node, "group", 1))
        c_in, c_out = conv_channels(node.op_type, shape, group)
        if not _conv_aligned(align, group, c_in, c_out):
            return False
    return True


def _read_conv(index: GraphIndex, node: onnx.NodeProto, align: int) -> _Conv | str:
    """The conv in the NPU's view, or why its channels cannot be padded ("" when they need not be)."""
    transpose = node.op_type == "ConvTranspose"
    group = int(get_attr(node, "group", 1))
    shape = index.static_shape(node.input[1]) if len(node.input) > 1 else None
    if shape is None or len(shape) < 3:
        return "the weight shape is unknown"
    c_in, c_out = conv_channels(node.op_type, shape, group)
    aligned = _conv_aligned(align, group, c_in, c_out)
    weight_q = bias_q = None
    if not index.is_const(node.input[1]):
        weight_q = quantized_const(index, node.input[1])
        problem = qdq_conv_weight_problem(weight_q, transpose, group) if weight_q is not None else (
            "weights are not constant (nor a DequantizeLinear of a constant)")
        if problem is not None:
            return "" if aligned else f"{problem}: cannot pad channels (in {c_in}, out {c_out}, group {group})"
    if len(node.input) > 2 and node.input[2] and not index.is_const(node.input[2]):
        bias_q = quantized_const(index, node.input[2])
        if bias_q is None or np.any(bias_q.params.zero_point != 0):
            return "" if aligned else ("bias is not constant (nor a DequantizeLinear of a constant with zero point "
                                       "0): cannot pad channels")
    return _Conv(node, transpose, tuple(shape), group, c_in, c_out, weight_q=weight_q, bias_q=bias_q)


class _Finder:
    """One read-only look at the model: classify every Conv and channel-local node, then walk the graph in order
    and decide each plan from the layouts the earlier plans emit (kept in ``layout``, not in the model)."""

    def __init__(self, model: onnx.ModelProto, options: FixOptions) -> None:
        self.index = GraphIndex.of(model)
        self.align = options.align
        self.align_io = options.align_io
        self.concat_align = options.concat_align
        self.opset = opset_version(model)
        self.nodes = list(model.graph.node)
        self.rejections: list[Rejection] = []
        self.convs: dict[int, _Conv] = {}
        self.carriers: dict[int, _Carrier] = {}
        self.input_fixed: set[str] = set()
        self.useful: set[str] = set()
        self.request: dict[str, Layout] = {}
        self.layout: dict[str, Layout] = {}
        """The layout each padded tensor (by its original name) will hold once the plans so far are applied."""

    # --- classifying ---------------------------------------------------------------------------------

    def classify(self) -> None:
        for node in self.nodes:
            if not is_default_domain(node):
                continue
            if is_qoperator(node):
                if node.op_type in ("QLinearConv", "ConvInteger"):
                    self._reject(node, qoperator_reason(node), blocking=True)
                continue
            if node.op_type in ("Conv", "ConvTranspose"):
                conv = _read_conv(self.index, node, self.align)
                if isinstance(conv, _Conv):
                    self.convs[id(node)] = conv
                elif conv:
                    self._reject(node, conv, blocking=True)
            else:
                carrier = self._classify_carrier(node)
                if carrier is not None:
                    self.carriers[id(node)] = carrier
        self.input_fixed = channels_follow_inputs(self.nodes, self.index.graph_inputs, self.index.is_const)
        self._find_useful_and_requests()

    def _shape(self, name: str) -> tuple | None:
        if name in self.index.initializers:
            return tuple(self.index.initializers[name].dims)  # without decoding the data
        value = self.index.const_value(name)
        if value is not None:
            return value.shape
        return self.index.shape(name)

    def _rank(self, name: str) -> int | None:
        shape = self._shape(name)
        return None if shape is None else len(shape)

    def _channels(self, name: str) -> int | None:
        shape = self._shape(name)
        if shape is None or len(shape) < 2 or not isinstance(shape[1], int):
            return None
        return shape[1]

    def _const_ints(self, name: str) -> list[int] | None:
        value = self.index.const_value(name) if name else None
        return None if value is None else [int(v) for v in np.asarray(value).ravel()]

    @staticmethod
    def _norm_axes(axes: list[int], rank: int | None) -> list[int] | None:
        if any(a < 0 for a in axes):
            if rank is None:
                return None
            return [a + rank if a < 0 else a for a in axes]
        return list(axes)

    def _classify_carrier(self, node: onnx.NodeProto) -> _Carrier | None:
        """How ``node`` carries a channel layout, or None when it needs the real channels (a stop)."""
        op = node.op_type
        if op in _UNARY or op in _POOLS:
            return self._classify_unary(node)
        if op in ("QuantizeLinear", "DequantizeLinear"):
            return self._classify_quantizer(node)
        if op in _BINARY:
            return self._classify_elementwise(node)
        if op == "Concat":
            return self._classify_concat(node)
        if op in ("BatchNormalization", "InstanceNormalization"):
            return self._classify_norm(node)
        rank = self._rank(node.input[0]) if node.input else None
        if op in _REDUCE:
            return self._classify_reduce(node, rank)
        if op in ("Resize", "Upsample"):
            return self._classify_resize(node, rank)
        if op == "Pad":
            return self._classify_pad(node, rank)
        return self._classify_axis_op(node, rank)

    def _classify_unary(self, node: onnx.NodeProto) -> _Carrier | None:
        if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1] and (
                self.index.consumers_of(node.output[1]) or node.output[1] in self.index.output_set):
            return None  # Indices are flat positions that count channels
        if node.op_type == "PRelu":
            return self._classify_prelu(node)
        return _Carrier([0])

    def _classify_norm(self, node: onnx.NodeProto) -> _Carrier | None:
        """BatchNormalization (inference) and InstanceNormalization with constant parameters: padded with
        scale / variance 1 and bias / mean 0."""
        if node.op_type == "BatchNormalization":
            if int(get_attr(node, "training_mode", 0)) or any(o for o in node.output[1:]):
                return None
            if any(not self.index.has_value(node.input[s]) for s in range(1, 5)):
                return None
            return _Carrier([0], consts=[(1, 0, 1.0), (2, 0, 0.0), (3, 0, 0.0), (4, 0, 1.0)])
        if float(get_attr(node, "epsilon", 1e-5)) <= 0.0:
            return None  # a constant pad channel would divide 0 by 0
        if any(not self.index.has_value(node.input[s]) for s in (1, 2)):
            return None
        return _Carrier([0], consts=[(1, 0, 1.0), (2, 0, 0.0)])

    def _classify_axis_op(self, node: onnx.NodeProto, rank: int | None) -> _Carrier | None:
        """Ops that are channel-local unless their axis is the channel axis (LayerNorm, Softmax, Slice, Split)."""
        op = node.op_type
        if op == "LayerNormalization":
            axes = self._norm_axes([int(get_attr(node, "axis", -1))], rank)
            if axes is None or axes[0] < 2 or float(get_attr(node, "epsilon", 1e-5)) <= 0.0:
                return None
            return _Carrier([0])
        if op in _SOFTMAX:
            default = -1 if self.opset >= 13 else 1
            axes = self._norm_axes([int(get_attr(node, "axis", default))], rank)
            if axes is None:
                return None
            # Before opset 13 the op flattens axes [axis, rank) together, so axis 1 or 0 mixes channels.
            ok = axes[0] != 1 if self.opset >= 13 else axes[0] >= 2
            return _Carrier([0]) if ok else None
        if op == "Slice":
            axes = self._const_ints(node.input[3]) if len(node.input) > 3 and node.input[3] else None
            axes = self._norm_axes(axes, rank) if axes is not None else None
            return _Carrier([0]) if axes is not None and 1 not in axes else None
        if op == "Split":
            axes = self._norm_axes([int(get_attr(node, "axis", 0))], rank)
            return _Carrier([0]) if axes is not None and axes[0] != 1 else None
        return None

    def _classify_quantizer(self, node: onnx.NodeProto) -> _Carrier | None:
        """A Q / DQ of an activation is channel-local: per-tensor it carries the padding as it is (Q(0) = zp,
        DQ(zp) = 0); per-channel on axis 1 its scale and zero point are padded (1.0 and 0: finite, and the pad
        channels' values never reach a real output)."""
        if self.index.is_const(node.input[0]):
            return None  # a weight's DequantizeLinear: handled with its conv
        params = quant_params(self.index, node)
        if params is None:
            return None
        if params.axis is None:
            return _Carrier([0])
        rank = self._rank(node.input[0])
        if rank is None or params.axis % rank != 1:
            return None
        consts = [(1, 0, 1.0)] + ([(2, 0, 0.0)] if len(node.input) > 2 and node.input[2] else [])
        return _Carrier([0], consts=consts)

    def _classify_prelu(self, node: onnx.NodeProto) -> _Carrier | None:
        if len(node.input) < 2:
            return None
        rank = self._rank(node.input[0])
        channels = self._channels(node.input[0])
        slope_shape = self._shape(node.input[1])
        if slope_shape is None:
            return None
        if int(np.prod(slope_shape)) == 1:
            return _Carrier([0])
        if rank is None:
            return None
        axis = len(slope_shape) - rank + 1
        dim = slope_shape[axis] if axis >= 0 else 1
        if dim == 1:
            return _Carrier([0])
        if channels is None or dim != channels:
            return None
        if not self.index.has_value(node.input[1]):
            return None  # a per-channel slope computed at run time cannot be padded here
        return _Carrier([0], consts=[(1, axis, 0.0)])

    def _classify_elementwise(self, node: onnx.NodeProto) -> _Carrier | None:
        out_shape = self.index.shape(node.output[0])
        if out_shape is None or len(out_shape) < 2 or not isinstance(out_shape[1], int):
            return None
        rank, channels = len(out_shape), out_shape[1]
        carrier = _Carrier([], rank=rank, channels=channels, broadcast=True)
        for slot, name in enumerate(node.input):
            if not name:
                continue
            shape = self._shape(name)
            if shape is None:
                return None
            axis = len(shape) - rank + 1
            dim = shape[axis] if axis >= 0 else 1
            if not isinstance(dim, int):
                return None
            divisor = node.op_type == "Div" and slot == 1
            if self.index.has_value(name):
                if dim == channels and channels != 1:
                    carrier.consts.append((slot, axis, 1.0 if divisor else 0.0))
                continue
            if dim == 1 and channels != 1:
                continue  # broadcast over channels: the same for pad channels
            if len(shape) != rank:
                return None  # the channels of this input sit on another axis
            if divisor:
                if channels != 1:
                    return None  # pad channels of a divisor may hold 0: x / 0 = inf, and 0 * inf = NaN later
                continue
            carrier.slots.append(slot)
        return carrier if carrier.slots else None

    def _classify_concat(self, node: onnx.NodeProto) -> _Carrier | None:
        rank = self._rank(node.output[0]) or next((self._rank(i) for i in node.input if self._rank(i)), None)
        axes = self._norm_axes([int(get_attr(node, "axis", 0))], rank)
        if axes is None:
            return None
        if axes[0] == 1:
            carrier = _Carrier([], kind="concat")
            for slot, name in enumerate(node.input):
                if not name:
                    continue
                channels = self._channels(name)
                if channels is None:
                    return None
                carrier.in_channels[slot] = channels
                if not self.index.has_value(name):
                    carrier.slots.append(slot)
            return carrier if carrier.slots else None
        # Concat along time / space: every input needs the same channel layout (no broadcasting).
        channels = self._channels(node.output[0])
        if channels is None or rank is None:
            return None
        carrier = _Carrier([], rank=rank, channels=channels)
        for slot, name in enumerate(node.input):
            if self.index.has_value(name):
                carrier.consts.append((slot, 1, 0.0))
            else:
                carrier.slots.append(slot)
        return carrier if carrier.slots else None

    def _classify_reduce(self, node: onnx.NodeProto, rank: int | None) -> _Carrier | None:
        if len(node.input) > 1 and node.input[1]:
            axes = self._const_ints(node.input[1])
        else:
            axes = get_attr(node, "axes")
        if not axes:
            # No axes: reduce everything, unless noop_with_empty_axes makes it an identity.
            return _Carrier([0]) if int(get_attr(node, "noop_with_empty_axes", 0)) and axes is not None else None
        axes = self._norm_axes(list(axes), rank)
        if axes is None or 1 in axes:
            return None
        if not int(get_attr(node, "keepdims", 1)) and 0 in axes:
            return None  # dropping the batch axis moves the channel axis
        return _Carrier([0])

    def _classify_resize(self, node: onnx.NodeProto, rank: int | None) -> _Carrier | None:
        mode = get_attr(node, "mode", "nearest") or "nearest"
        if mode != "nearest" and dequantizer_of(self.index, node.input[0]) is not None:
            # Interpolating values on a quantization grid lands on exact ties (weights k/4, k/16); a padded
            # tensor changes how onnxruntime vectorizes the op, which rounds those ties the other way at the next
            # QuantizeLinear. The Resize reads the real tensor instead, bit for bit as before.
            return None
        if node.op_type == "Upsample" or (self.opset < 11):
            scales_slot, sizes_slot = 1, None
        else:
            scales_slot, sizes_slot = 2, 3
        axes = get_attr(node, "axes")
        if axes is not None:
            axes = self._norm_axes(list(axes), rank)
            if axes is None:
                return None
            if 1 not in axes:
                return _Carrier([0])
            position = axes.index(1)
        else:
            position = 1
        if (get_attr(node, "coordinate_transformation_mode") == "tf_crop_and_resize" and len(node.input) > 1
                and node.input[1]):
            # The crop of the channel axis is a fraction of its length: the spec samples roi * (C - 1), which
            # moves with the padded C; onnxruntime happens to keep the real channels, onnx.reference does not.
            self._reject(node, "tf_crop_and_resize with a roi on the channel axis: its crop depends on the channel "
                               "count, so the padding is sliced off before this Resize", blocking=False)
            return None
        if sizes_slot is not None and len(node.input) > sizes_slot and node.input[sizes_slot]:
            sizes = self._const_ints(node.input[sizes_slot])
            channels = self._channels(node.input[0])
            if sizes is None or channels is None or len(sizes) <= position or sizes[position] != channels:
                return None
            return _Carrier([0], sizes=(sizes_slot, position))
        if len(node.input) > scales_slot and node.input[scales_slot]:
            scales = self.index.const_value(node.input[scales_slot])
            if scales is None or scales.size <= position or float(np.ravel(scales)[position]) != 1.0:
                return None
            return _Carrier([0])
        scales_attr = get_attr(node, "scales")
        if scales_attr is not None and len(scales_attr) > position and float(scales_attr[position]) == 1.0:
            return _Carrier([0])
        return None

    def _classify_pad(self, node: onnx.NodeProto, rank: int | None) -> _Carrier | None:
        if len(node.input) > 1 and node.input[1]:
            pads = self._const_ints(node.input[1])
        else:
            pads = get_attr(node, "pads")
        if pads is None:
            return None
        axes = self._const_ints(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        n = len(pads) // 2
        if axes is None:
            axes = list(range(n))
        axes = self._norm_axes(axes, rank)
        if axes is None:
            return None
        if 1 in axes:
            position = axes.index(1)
            if pads[position] != 0 or pads[position + n] != 0:
                return None
        return _Carrier([0])

    def _find_useful_and_requests(self) -> None:
        """Backward: which tensors a padded layout should reach (a Conv consumes them, maybe through channel-local
        ops), and which layout a grouped Conv would like its producer to emit."""
        a = self.align
        for node in reversed(self.nodes):
            conv = self.convs.get(id(node))
            if conv is not None:
                x = node.input[0]
                if conv.kind in ("dense", "depthwise"):
                    self.useful.add(x)
                    wanted = self.request.get(node.output[0])
                    if conv.kind == "depthwise" and conv.c_out == conv.c_in and wanted is not None:
                        # A depthwise conv (multiplier 1) emits its input's layout: pass the wish upstream.
                        self.request.setdefault(x, wanted)
                elif conv.cg % a and not (x in self.input_fixed and not self.align_io):
                    self.useful.add(x)
                    self.request.setdefault(x, Layout.blocks(conv.group, conv.cg, _ceil_to(conv.cg, a)))
                continue
            carrier = self.carriers.get(id(node))
            if carrier is None:
                continue
            outputs = [o for o in node.output if o]
            if any(o in self.useful for o in outputs):
                self.useful.update(node.input[s] for s in carrier.slots)
            if carrier.kind == "same":
                wanted = next((self.request[o] for o in outputs if o in self.request), None)
                if wanted is not None:
                    for s in carrier.slots:
                        self.request.setdefault(node.input[s], wanted)

    def _reject(self, node: onnx.NodeProto, reason: str, *, blocking: bool) -> None:
        self.rejections.append(Rejection(node.name, node.op_type, reason, blocking))

    # --- planning ------------------------------------------------------------------------------------

    def plan(self) -> list[Plan]:
        self.classify()
        plans: list[Plan] = []
        for position, node in enumerate(self.nodes):
            conv = self.convs.get(id(node))
            carrier = self.carriers.get(id(node)) if conv is None else None
            plan: Plan | None = None
            if conv is not None:
                plan = self._plan_conv(position, conv)
            elif carrier is not None:
                plan = self._plan_carry(position, node, carrier)
            if plan is not None:
                plans.append(plan)
        return plans

    def _dense_target(self, current: Layout | None, channels: int, fixed: bool) -> Layout | None:
        """The input layout a dense / depthwise Conv reads: the arriving one, grown to a multiple of align."""
        a = self.align
        if current is None:
            if channels % a == 0 or fixed:
                return None
            return Layout.prefix(channels, _ceil_to(channels, a))
        if current.size % a == 0:
            return current
        return Layout(_ceil_to(current.size, a), current.cmap)

    def _plan_conv(self, position: int, conv: _Conv) -> PadConvPlan | None:
        node, a = conv.node, self.align
        x, y = node.input[0], node.output[0]
        current = self.layout.get(x)
        fixed = x in self.input_fixed and not self.align_io
        m_total = conv.c_out
        if conv.kind == "dense":
            target = self._dense_target(current, conv.c_in, fixed)
            wanted = self.request.get(y)
            if wanted is not None and wanted.channels == m_total:
                out_layout: Layout | None = wanted
            elif m_total % a:
                out_layout = Layout.prefix(m_total, _ceil_to(m_total, a))
            else:
                out_layout = None
            groups, cg_new = 1, (target.size if target else conv.c_in)
            mg_new = out_layout.size if out_layout else m_total
            if fixed and conv.c_in % a:
                self._reject(node, f"input channels {conv.c_in} are fixed by a graph input (use --align-io to "
                             "pad them inside the graph)", blocking=False)
        elif conv.kind == "depthwise":
            target = self._dense_target(current, conv.c_in, fixed)
            multiplier = m_total // conv.c_in
            cg_new, mg_new = 1, multiplier
            if target is None:
                groups, out_layout = conv.group, None
            else:
                groups = target.size
                cmap = (np.asarray(target.cmap)[:, None] * multiplier + np.arange(multiplier)[None, :]).ravel()
                out_layout = Layout(groups * multiplier, tuple(int(c) for c in cmap))
            if fixed and conv.c_in % a:
                self._reject(node, f"depthwise channels {conv.c_in} are fixed by a graph input (use "
                             "--align-io to pad them inside the graph)", blocking=False)
        else:
            groups, cg, mg = conv.group, conv.cg, conv.mg
            cg_new = _ceil_to(cg, a) if cg % a and not fixed else cg
            mg_new = _ceil_to(mg, a)
            arriving = current or Layout.prefix(conv.c_in, conv.c_in)
            if arriving.fits_groups(groups, cg, cg_new):
                target = current
            else:
                target = Layout.blocks(groups, cg, cg_new) if cg_new != cg else None
            out_layout = Layout.blocks(groups, mg, mg_new) if mg_new != mg else None
            if fixed and cg % a:
                self._reject(node, f"input channels per group {cg} are fixed by a graph input (use --align-io "
                             "to pad them inside the graph)", blocking=False)
        if target is None and out_layout is None:
            return None  # aligned already (a padded input that must arrive real is restored by name)
        if out_layout is not None:
            self.layout[y] = out_layout
        return PadConvPlan(nodes=(node.name,), action="pad-channels", position=position, target=target,
                           out=out_layout, groups=groups, cg_new=cg_new, mg_new=mg_new)

    def _plan_carry(self, position: int, node: onnx.NodeProto, carrier: _Carrier) -> CarryPlan | None:
        padded = [s for s in carrier.slots if node.input[s] in self.layout]
        if not padded or not any(o in self.useful for o in node.output if o):
            return None  # the node reads the real tensors (restored under their names)
        inputs: tuple[Layout | None, ...] = ()
        leaves: frozenset[str] = frozenset()
        if carrier.kind == "concat":
            inputs = tuple(self.layout.get(name) if slot in carrier.slots else None
                           for slot, name in enumerate(node.input))
            offset, cmap = 0, []
            for slot, name in enumerate(node.input):
                if not name:
                    continue
                current = inputs[slot]
                if current is not None:
                    cmap.extend(offset + c for c in current.cmap)
                    count = current.size
                else:
                    count = carrier.in_channels[slot]
                    cmap.extend(range(offset, offset + count))
                offset += count
                if self.concat_align > 0 and slot in carrier.slots and count % self.concat_align:
                    leaves = frozenset({"concat-align"})  # the padded inputs still miss --concat-align
            out_layout = Layout(offset, tuple(cmap))
        else:
            out_layout = self.layout[node.input[padded[0]]]
        for name in node.output:
            if name:
                self.layout[name] = out_layout
        return CarryPlan(nodes=(node.name,), action="carry", leaves=leaves, position=position, out=out_layout,
                         carrier=carrier, inputs=inputs)

class _Rewriter:
    """Applies a Found's plans in order. The layouts the applied plans emit are tracked under the tensors'
    original names; every input a plan reads gets converted (Pad / Gather) from what actually arrives to the
    plan's layout, so a Found whose plans were filtered still gives a correct model."""

    def __init__(self, model: onnx.ModelProto, options: FixOptions, result: PassResult) -> None:
        self.model = model
        self.index = GraphIndex(model)
        self.editor = GraphEditor(self.index)
        self.align = options.align
        self.result = result
        self.opset = opset_version(model)
        self.nodes = list(model.graph.node)
        self.layout: dict[str, Layout] = {}
        self.padded_name: dict[str, str] = {}
        self.padded_producer: dict[str, onnx.NodeProto] = {}
        self.restored: set[str] = set()
        self.conversions: dict[tuple[str, Layout], str] = {}
        self.int_consts: dict[tuple[int, ...], str] = {}
        self.inserted: dict[str, int] = {}
        # Counted before any edit, and here rather than in find: --check never needs them.
        self.macs = {id(n): _conv_macs(self.index, n) for n in self.nodes
                     if n.op_type in ("Conv", "ConvTranspose") and is_default_domain(n)}
        self.macs_before = sum(self.macs.values())
        self.extra_macs = 0
        self.extra_weight_bytes = 0

    def apply(self, plans: list[Plan]) -> None:
        for plan in plans:
            node = self.nodes[plan.position] if isinstance(plan, (PadConvPlan, CarryPlan)) else None
            if node is None or node.name != plan.nodes[0]:
                raise ValueError(f"align-channels: plan {plan.action} {plan.nodes} was not found on this model")
            if isinstance(plan, PadConvPlan):
                self._rewrite_conv(node, plan)
            elif isinstance(plan, CarryPlan):
                self._rewrite_carry(node, plan)
        # Restore the real tensor (under its original name) wherever something still reads it.
        dropped = set()
        for name in self.layout:
            readers = self.index.consumers_of(name)
            if name in self.index.output_set or any(name in c.input or has_subgraphs(c) for c in readers):
                self._restore(name)
            else:
                dropped.add(name)
        self.editor.commit()
        if dropped:
            keep = [vi for vi in self.model.graph.value_info if vi.name not in dropped]
            if len(keep) != len(self.model.graph.value_info):
                copies = [_copy(vi) for vi in keep]
                del self.model.graph.value_info[:]
                self.model.graph.value_info.extend(copies)
        self.result.metrics.update({
            "align": self.align,
            "padded_convs": sum(1 for c in self.result.changes if c.action == "pad-channels"),
            "macs_before": self.macs_before,
            "extra_macs": self.extra_macs,
            "extra_macs_pct": round(100.0 * self.extra_macs / self.macs_before, 2) if self.macs_before else 0.0,
            "extra_weight_bytes": self.extra_weight_bytes,
            "inserted_nodes": dict(sorted(self.inserted.items())),
        })

    def _rewrite_conv(self, node: onnx.NodeProto, plan: PadConvPlan) -> None:
        conv = _read_conv(self.index, node, self.align)
        assert isinstance(conv, _Conv), conv  # find planned it: its weights are paddable
        target, out_layout, groups, cg_new, mg_new = plan.target, plan.out, plan.groups, plan.cg_new, plan.mg_new
        conv.load(self.index)
        assert conv.weight is not None
        if target is not None:
            node.input[0] = self._as_layout(node.input[0], target, conv.weight.ndim)
        in_map = np.asarray(target.cmap) if target is not None else np.arange(conv.c_in)
        out_map = np.asarray(out_layout.cmap) if out_layout is not None else np.arange(conv.c_out)
        new_weight, new_scale = _padded_weight(conv, in_map, out_map, groups, cg_new, mg_new)
        if conv.weight_q is not None:
            self._store_quantized_weight(conv, new_weight, new_scale, mg_new)
        else:
            private_initializer(self.index, self.editor, node, 1, new_weight)
        added = new_weight.nbytes - conv.weight.nbytes
        if conv.bias is not None and out_layout is not None:
            added += self._pad_bias(conv, out_layout, out_map)
        if groups != conv.group:
            set_attr(node, "group", groups)
        p_in, p_out = groups * cg_new, groups * mg_new
        output_shape = get_attr(node, "output_shape")
        if conv.transpose and output_shape and len(output_shape) == conv.weight.ndim:
            set_attr(node, "output_shape", [output_shape[0], p_out, *output_shape[2:]])
        if out_layout is not None:
            self._set_padded(node, 0, out_layout)
        old_macs = self.macs[id(node)]
        if conv.transpose:
            new_macs = old_macs // (conv.c_in * conv.mg) * (p_in * mg_new) if old_macs else 0
        else:
            new_macs = old_macs // (conv.c_out * conv.cg) * (p_out * cg_new) if old_macs else 0
        self.extra_macs += new_macs - old_macs
        self.extra_weight_bytes += added
        self.result.changes.append(Change(
            node.name, node.op_type, "pad-channels",
            old={"in": conv.c_in, "out": conv.c_out, "group": conv.group},
            new={"in": p_in, "out": p_out, "group": groups},
            detail={"extra_macs": new_macs - old_macs, "extra_weight_bytes": added,
                    "input": str(target) if target is not None else "real",
                    "output": str(out_layout) if out_layout is not None else "real"}))

    def _pad_bias(self, conv: _Conv, out_layout: Layout, out_map: np.ndarray) -> int:
        """The bias scattered into ``out_layout`` (pad channels 0); returns the bytes added."""
        assert conv.bias is not None
        bias = np.zeros(out_layout.size, dtype=conv.bias.dtype)
        bias[out_map] = conv.bias
        if conv.bias_q is not None:
            # int32 bias: pads are 0 (zero point 0); a per-channel scale (in_scale * w_scale) is padded
            # with its first entry, as the weight scale is.
            params = conv.bias_q.params
            scale = params.scale
            if params.axis is not None:
                scale = np.full(out_layout.size, scale[0], dtype=scale.dtype)
                scale[out_map] = params.scale
            store_quantized(self.index, self.editor, conv.node, 2, conv.bias_q, bias, scale,
                            np.zeros(scale.shape, dtype=params.zero_point.dtype))
        else:
            private_initializer(self.index, self.editor, conv.node, 2, bias)
        return bias.nbytes - conv.bias.nbytes

    def _store_quantized_weight(self, conv: _Conv, new_weight: np.ndarray, new_scale: np.ndarray | None,
                                mg_new: int) -> None:
        """The padded integer weight into the conv's DequantizeLinear, with its per-channel scale / zero point
        (back on the DequantizeLinear's axis: 0 for Conv, 1 = j of m = grp * M/g + j for ConvTranspose)."""
        assert conv.weight_q is not None
        params = conv.weight_q.params
        scale, zero_point = params.scale, params.zero_point
        if new_scale is not None:
            per_axis = new_scale[:, :mg_new] if conv.transpose else new_scale
            scale = per_axis[0].astype(params.scale.dtype)
            zero_point = per_axis[1].astype(params.zero_point.dtype)
        store_quantized(self.index, self.editor, conv.node, 1, conv.weight_q, new_weight, scale, zero_point)

    def _rewrite_carry(self, node: onnx.NodeProto, plan: CarryPlan) -> None:
        carrier, out_layout = plan.carrier, plan.out
        if not any(node.input[s] in self.layout for s in carrier.slots):
            return  # only with a filtered Found: no producer's plan was applied, so no padding arrives to carry
        if carrier.kind == "concat":
            for slot, layout in enumerate(plan.inputs):
                if layout is not None:
                    name = node.input[slot]
                    node.input[slot] = self._as_layout(name, layout, self._rank(name))
        else:
            for slot in carrier.slots:
                name = node.input[slot]
                if name not in self.layout and carrier.broadcast and carrier.channels == 1:
                    continue  # a real single channel broadcasts onto the pad channels
                rank = carrier.rank if carrier.rank is not None else self._rank(name)
                node.input[slot] = self._as_layout(name, out_layout, rank)
            for slot, axis, fill in carrier.consts:
                value = self.index.const_value(node.input[slot])
                private_initializer(self.index, self.editor, node, slot, _pad_const(value, axis, out_layout, fill))
            if carrier.sizes is not None:
                slot, position = carrier.sizes
                sizes = np.array(self.index.const_value(node.input[slot]), dtype=np.int64)
                sizes[position] = out_layout.size
                private_initializer(self.index, self.editor, node, slot, sizes)
        for k, name in enumerate(node.output):
            if name:
                self._set_padded(node, k, out_layout)
        self.result.changes.append(Change(node.name, node.op_type, "carry", old=out_layout.channels,
                                          new=out_layout.size))

    def _rank(self, name: str) -> int | None:
        shape = self.index.shape(name)
        return None if shape is None else len(shape)

    # --- tensors and conversions ---------------------------------------------------------------------

    def _set_padded(self, node: onnx.NodeProto, k: int, layout: Layout) -> None:
        """Output ``k`` of ``node`` now holds ``layout``: it gets a new name, the old name stays the real tensor."""
        name = node.output[k]
        padded = self.index.unique_name(f"{name}_aligned")
        node.output[k] = padded
        self.layout[name] = layout
        self.padded_name[name] = padded
        self.padded_producer[name] = node

    def _restore(self, name: str) -> str:
        """Make ``name`` hold the real channels again: Slice (one block) or Gather from the padded tensor."""
        if name not in self.layout or name in self.restored:
            return name
        layout = self.layout[name]
        padded = self.padded_name[name]
        producer = self.padded_producer[name]
        start = layout.block_start
        if start is not None:
            node = self.editor.make_node(
                "Slice", [padded, self._ints("align_slice_start", [start]),
                          self._ints("align_slice_end", [start + layout.channels]),
                          self._ints("align_channel_axis", [1])],
                [name], f"{producer.name}_unpad")
        else:
            node = self.editor.make_node("Gather", [padded, self._ints("align_real_channels", layout.cmap)], [name],
                                         f"{producer.name}_unpad", axis=1)
        self._insert(producer, [node], name, f"{layout.size} -> {layout.channels} channels")
        self.restored.add(name)
        return name

    def _as_layout(self, name: str, layout: Layout, rank: int | None) -> str:
        """A tensor holding ``name``'s channels in ``layout`` (Pad / Gather nodes where needed, cached)."""
        current = self.layout.get(name)
        if current == layout:
            return self.padded_name[name]
        key = (name, layout)
        if key in self.conversions:
            return self.conversions[key]
        producer = self.padded_producer.get(name)
        if producer is None:
            producer = self.index.producer.get(name)
        base = producer.name if producer is not None else name
        source = self.padded_name.get(name, name)
        nodes: list[onnx.NodeProto] = []
        if current is None and layout.block_start is not None:
            start = layout.block_start
            nodes.append(self._pad_node(source, rank, start, layout.size - start - layout.channels, base, name))
        elif current is None:
            # Real -> scattered: append one zero channel, then gather it into every pad position.
            extra = self._pad_node(source, rank, 0, 1, base, name)
            nodes.append(extra)
            indices = np.full(layout.size, layout.channels, dtype=np.int64)
            indices[list(layout.cmap)] = np.arange(layout.channels)
            nodes.append(self._gather_node(extra.output[0], indices, base, name))
        elif current.cmap == layout.cmap and layout.size > current.size:
            nodes.append(self._pad_node(source, rank, 0, layout.size - current.size, base, name))
        else:
            pad_positions = sorted(set(range(current.size)) - set(current.cmap))
            indices = np.full(layout.size, pad_positions[0] if pad_positions else current.cmap[0], dtype=np.int64)
            indices[list(layout.cmap)] = current.cmap
            nodes.append(self._gather_node(source, indices, base, name))
        out = nodes[-1].output[0]  # before _insert: in QDQ form the last op's output is renamed, its DQ keeps this
        self._insert(producer, nodes, name, f"{current or 'real'} -> {layout}")
        self.conversions[key] = out
        return out

    def _pad_node(self, source: str, rank: int | None, begin: int, end: int, base: str,
                  name: str) -> onnx.NodeProto:
        if rank is None:
            if self.opset < 18:
                raise ValueError(f"rank of {name} unknown")  # callers only convert tensors of known rank
            pads, inputs = [begin, end], [self._ints("align_channel_axis", [1])]
        else:
            pads = [0] * (2 * rank)
            pads[1], pads[rank + 1] = begin, end
            inputs = []
        out = self.index.unique_name(f"{name}_padc")
        pads_name = self._ints("align_pads", pads)
        ins = [source, pads_name] + (["", inputs[0]] if inputs else [])
        return self.editor.make_node("Pad", ins, [out], f"{base}_align_pad")

    def _gather_node(self, source: str, indices: np.ndarray, base: str, name: str) -> onnx.NodeProto:
        out = self.index.unique_name(f"{name}_perm")
        return self.editor.make_node("Gather", [source, self._ints("align_gather_indices", indices)], [out],
                                     f"{base}_align_gather", axis=1)

    def _insert(self, producer: onnx.NodeProto | None, nodes: list[onnx.NodeProto], tensor: str,
                what: str) -> None:
        nodes = wrap_chain(self.index, self.editor, tensor, nodes)  # on a quantized tensor: DQ -> op -> Q -> DQ
        if producer is not None:
            self.editor.insert_after(producer, nodes)
        else:
            self.editor.prepend(nodes)
        for node in nodes:
            self.inserted[node.op_type] = self.inserted.get(node.op_type, 0) + 1
            self.result.changes.append(Change(node.name, node.op_type, "insert", detail={"tensor": tensor,
                                                                                        "channels": what}))

    def _ints(self, base: str, values: Any) -> str:
        """An int64 initializer (shared between nodes that need the same values)."""
        key = tuple(int(v) for v in np.asarray(values).ravel())
        if key not in self.int_consts:
            self.int_consts[key] = self.editor.add_initializer(base, np.asarray(key, dtype=np.int64))
        return self.int_consts[key]


def _conv_macs(index: GraphIndex, node: onnx.NodeProto) -> int:
    """graph.node_macs in plain integers (numpy's prod is costly per call, which adds up over a long graph)."""
    w_shape = index.static_shape(node.input[1]) if len(node.input) > 1 else None
    counted = index.static_shape(node.output[0] if node.op_type == "Conv" else node.input[0])
    if w_shape is None or counted is None:
        return 0
    return math.prod(counted) * math.prod(w_shape[1:])


def _pad_const(value: np.ndarray, axis: int, layout: Layout, fill: float) -> np.ndarray:
    """``value`` with its channel ``axis`` scattered into ``layout`` and ``fill`` in the pad channels."""
    shape = list(value.shape)
    shape[axis] = layout.size
    out = np.full(shape, fill, dtype=value.dtype)
    where: list[Any] = [slice(None)] * value.ndim
    where[axis] = np.asarray(layout.cmap)
    out[tuple(where)] = value
    return out


def _copy(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(vi)
    return copy



def _padded_weight(conv: _Conv, in_map: np.ndarray, out_map: np.ndarray, groups: int, cg_new: int,
                   mg_new: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The conv's weight with real input channel c at ``in_map[c]`` and real filter o at ``out_map[o]`` of
    ``groups`` blocks (zero elsewhere; a QDQ weight's pads are its zero point), in the conv's own layout; and the
    per-channel [scale, zero point] rows of the padded filters (None for a per-tensor or float weight)."""
    weight = conv.canonical_weight()
    new = np.zeros((groups * mg_new, cg_new, *weight.shape[2:]), dtype=weight.dtype)
    per_channel = conv.canonical_scale()
    new_scale = None
    if per_channel is not None:
        # Pad filters get the first channel's scale and zero point (positive, finite); every pad weight
        # (pad filters and the taps on pad input channels) is its row's zero point, so it dequantizes to 0.
        new_scale = np.repeat(per_channel[:, :1], groups * mg_new, axis=1)
        new_scale[:, out_map] = per_channel
        new[...] = new_scale[1].reshape(-1, *([1] * (new.ndim - 1))).astype(weight.dtype)
    elif conv.weight_q is not None:
        new[...] = conv.weight_q.params.zero_point.reshape(()).astype(weight.dtype)
    if groups == 1 and conv.group == 1:
        # Dense: output row out_map[r] reads the input channels in_map. Both maps are usually the identity on
        # a prefix: then a block copy, far cheaper than scattering each element of a large weight.
        if _is_prefix(out_map) and _is_prefix(in_map):
            new[:len(out_map), :len(in_map)] = weight
        else:
            new[np.ix_(out_map, in_map)] = weight
    else:
        rows = np.arange(conv.c_out)
        cols = in_map[((rows // conv.mg) * conv.cg)[:, None] + np.arange(conv.cg)[None, :]]
        local = cols - ((out_map // mg_new) * cg_new)[:, None]
        assert ((local >= 0) & (local < cg_new)).all(), "input layout does not fit the conv's groups"
        new[np.broadcast_to(out_map[:, None], local.shape), local] = weight
    return _from_canonical(new, conv.transpose, groups, cg_new, mg_new), new_scale
