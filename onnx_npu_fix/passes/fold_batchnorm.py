"""Pass ``fold-batchnorm``: no BatchNormalization left — folded into a neighbouring layer, else lowered.

At inference a BatchNormalization is a per-channel affine map on axis 1::

    BN(x)[:, c] = gamma[c] * (x[:, c] - mean[c]) / sqrt(var[c] + eps) + beta[c] = a[c] * x[:, c] + b[c]
    a = gamma / sqrt(var + eps)        b = beta - mean * a

``a`` and ``b`` are computed in float64; every rewritten weight is computed in float64 from the original and
rounded once to its own dtype. Rules, in order of preference:

1. Fold into the producer (its output feeds only this BN and is not a graph output; its weight is a float
   constant — never a DequantizeLinear output, a quantized weight is not rescaled)::

       Conv(W, bias) -> BN            =>  Conv(W[m] * a[m], bias * a + b)          W is [M, C/g, k...]
       ConvTranspose(W, bias) -> BN   =>  ConvTranspose(W', bias * a + b)          W is [C, M/g, k...]: output
                                          channel m = grp*M/g + j is W[grp*C/g:(grp+1)*C/g, j], scaled by a[m]
       Gemm(A, B, C) -> BN            =>  Gemm(A, B', C' = a * beta * C + b, beta = 1), B' = column m of op(B)
                                          scaled by a[m] (row m of B when transB=1); alpha is untouched
       MatMul(X, W) -> BN, out [N, C] =>  MatMul(X, W[:, m] * a[m]) -> Add(b)  (BN normalises axis 1, so this
                                          needs a 2-D output where axis 1 is the last axis)

2. Fold into the following Conv (the BN output feeds only that Conv's data input, and the Conv pads nothing:
   with padding the border taps would read BN(0) = b instead of 0)::

       BN -> Conv(W, bias)  =>  Conv(W[m, j] * a[c], bias[m] + sum_{j,k} W[m, j, k] * b[c])

   where c = grp(m)*C/g + j is the input channel tap j of output channel m reads.

   A Conv can take rule 1 and rule 2 at once (BN -> Conv -> BN); both edits are combined into one write.

3. Otherwise lower it: ``x -> Mul(a) -> Add(b)`` with constants shaped [C, 1, ...] for the input rank ([C] for
   rank 2), or with ``bn_standalone="conv"`` and a rank-3/4 input a 1x1 depthwise ``Conv(W = a, bias = b,
   group = C)``.

Left in place with a blocking Rejection (blocking unless ``allow_batchnorm``): training mode
(``training_mode=1``, or any training output: before opset 14 extra outputs select training mode),
non-constant or non-float parameters, var + eps <= 0, opset < 7 (the is_test / consumed_inputs forms;
convert the model first), an unknown input rank when lowering, and BNs inside If/Loop/Scan bodies.
Opset 7-8 ``spatial=0`` with per-activation parameters [C, D1, ...] is lowered by rule 3 with constants of
that shape.

Weights are rewritten in place when this layer is their only reader (one read, one float64-computed
multiply into a buffer of the weight's dtype, one write: no full float64 copy of a weight); a weight shared
with another node gets a private copy. The BN's own parameter initializers are left for ``cleanup`` to drop.

Graphs with thousands of small layers: ``(a, b)`` of every BN with the same parameter shape and dtypes, and the
new weights of plain ``Conv -> BN`` folds with the same weight shape (at most 4 MiB of weights at a time), are
computed in one numpy call each. The math is elementwise, so every layer gets bit for bit what it would alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import (
    GraphEditor,
    GraphIndex,
    conv_geometry,
    get_attr,
    opset_version,
    overwrite_tensor,
    paused_gc,
    private_initializer,
    set_attr,
    subgraphs,
)
from onnx_npu_fix.ir.ops import DEFAULT_DOMAINS, NUMPY_FLOAT_TYPES, SUBGRAPH_OPS, is_default_domain
from onnx_npu_fix.ir.qdq import (
    QuantizedConst,
    dequantizer_of,
    quant_params,
    quantized_const,
    store_quantized,
)
from onnx_npu_fix.passes.base import Change, Fixes, Form, Found, Pass, PassResult, Plan, Rejection

_FLOAT_TYPES = NUMPY_FLOAT_TYPES  # the types the fold computes in
_LE_DTYPES = {elem: np.dtype(t).newbyteorder("<") for elem, t in _FLOAT_TYPES.items()}
_PARAM_ROLES = ("scale", "B", "input_mean", "input_var")
_PRODUCERS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_SCANNED_OPS = SUBGRAPH_OPS | {"BatchNormalization"}


@dataclass
class _Affine:
    """One BN as ``y = a * x + b`` on axis 1 (float64)."""

    a: np.ndarray
    b: np.ndarray
    per_activation: bool = False
    """opset 7-8 ``spatial=0``: a and b are [C, D1, ...] instead of [C]."""

    @property
    def channels(self) -> int:
        return int(self.a.shape[0])


@dataclass
class _LayerEdit:
    """Every fold into one layer node, applied with a single weight write."""

    node: onnx.NodeProto
    out: _Affine | None = None
    """Fold of the BN reading this layer's output (rule 1)."""
    out_bn: onnx.NodeProto | None = None
    inp: _Affine | None = None
    """Fold of the BN feeding this Conv's data input (rule 2)."""
    inp_bn: onnx.NodeProto | None = None


@dataclass
class _Lowering:
    bn: onnx.NodeProto
    affine: _Affine
    rank: int | None
    dtype: type
    why_not_folded: str


@dataclass
class BatchNormPlan(Plan):
    """A fold-batchnorm plan. It holds the index of the model :meth:`FoldBatchNormPass.find` planned on: the
    plan's nodes are that model's, and the rewrite edits it through that index (a second index would cost a
    full walk of a 100k-node graph)."""

    index: GraphIndex
    order: dict[str, int]
    """Every float-rule BN's place among them, by name (shared by the pass's plans): its changes are reported in
    that order."""


@dataclass
class LayerFoldPlan(BatchNormPlan):
    """Rules 1 and 2: the BN(s) folded into one layer's weights (``nodes``: the BNs)."""

    edit: _LayerEdit


@dataclass
class LoweringPlan(BatchNormPlan):
    """Rule 3: a BN lowered to Mul+Add or a 1x1 depthwise Conv."""

    lowering: _Lowering


@dataclass
class QdqFoldPlan(BatchNormPlan):
    """A BN after a QDQ conv folded into its weight scale."""

    fold: _QdqFold


class FoldBatchNormPass(Pass):
    """BatchNormalization folding. ``find`` is read-only: one plan per BN (folded into its producer or consumer,
    folded into a QDQ conv's scale, or lowered), a rejection for every BN it keeps; ``rewrite`` applies them."""
    name = "fold-batchnorm"
    summary = ("fold BatchNormalization into the adjacent Conv/ConvTranspose/Gemm/MatMul, "
               "else lower it to Mul+Add")
    exact = True
    fixes = (Fixes("batchnorm"), Fixes("forbidden-op", ops=("BatchNormalization",), note="for a BatchNormalization"))
    forms = (Form("bn_standalone", ("Mul", "Add", "Conv"), "how a BatchNormalization with no Conv to fold into is "
                  "lowered: a Mul and an Add, or a 1x1 depthwise Conv", cost=90),)
    keeps_shapes = True

    # find and rewrite run with the collector paused: tens of thousands of small arrays, records and protobuf
    # wrappers, none of them garbage before the pass ends; full collections over them would walk them all again
    # and again for nothing.

    def find(self, model: onnx.ModelProto, options: FixOptions) -> Found:
        with paused_gc():
            return self._find(model, options)

    def rewrite(self, model: onnx.ModelProto, options: FixOptions, found: Found) -> PassResult:
        with paused_gc():
            return self._rewrite(model, options, found)

    def _find(self, model: onnx.ModelProto, options: FixOptions) -> Found:
        result = PassResult()  # collects the rejections and warnings of finding; rewrite reports them
        index = GraphIndex.of(model)  # the pass manager's, when the passes before this one changed nothing
        opset = opset_version(model)
        blocking = not options.allow_batchnorm
        edits: dict[int, _LayerEdit] = {}
        lowerings: list[_Lowering] = []
        total = left = 0
        # The BNs' (a, b) are computed for all of them at once (per-BN numpy calls dominate at 33k BNs), so the
        # nodes that matter are listed first; the loop below then keeps the report in graph order.
        nodes = [n for n, op, domain in zip(index.nodes, index.ops, index.domains)
                 if op in _SCANNED_OPS or domain not in DEFAULT_DOMAINS]  # BNs, and what may hold subgraphs
        qdq_folds, nodes = _find_qdq_folds(index, nodes, result, blocking)
        total += len(qdq_folds)
        bns = [n for n in nodes if _is_batchnorm(n)]
        order = {bn.name: i for i, bn in enumerate(bns)}
        affines = _affines(index, bns, opset)
        for node in nodes:
            is_bn = _is_batchnorm(node)
            nested = 0 if is_bn else _nested_batchnorms(node)  # a standard BN holds no subgraph
            if nested:
                total += nested
                left += nested
                result.rejections.append(Rejection(
                    node.name, node.op_type,
                    f"{nested} BatchNormalization node(s) inside its subgraph(s) are not handled", blocking))
            if not is_bn:
                continue
            total += 1
            affine, problem = affines[id(node)]
            if affine is None:
                left += 1
                result.rejections.append(Rejection(node.name, node.op_type, problem, blocking))
                continue
            layer, back_reason = _backward_target(index, node, affine)
            if layer is not None:
                edit = edits.setdefault(id(layer), _LayerEdit(layer))
                edit.out, edit.out_bn = affine, node
                continue
            conv, fwd_reason = _forward_target(index, node, affine)
            if conv is not None:
                edit = edits.setdefault(id(conv), _LayerEdit(conv))
                edit.inp, edit.inp_bn = affine, node
                continue
            why = f"not folded into its producer: {back_reason}; not folded into its consumer: {fwd_reason}"
            rank, dtype, problem = _lowering_form(index, node, affine)
            if problem:
                left += 1
                result.rejections.append(Rejection(node.name, node.op_type, f"{problem} ({why})", blocking))
                continue
            lowerings.append(_Lowering(node, affine, rank, dtype, why))
        plans: list[Plan] = [
            LayerFoldPlan(_edit_bns(e), "fold", index, order, e) for e in edits.values()]
        plans += [LoweringPlan((low.bn.name,), "lower", index, order, low) for low in lowerings]
        plans += [QdqFoldPlan((fold.bn.name,), "fold into QDQ conv scale", index, order, fold)
                  for fold in qdq_folds]
        return Found(plans, result.rejections, warnings=result.warnings,
                     metrics={"batchnorm_before": total, "batchnorm_after": left})

    def _rewrite(self, model: onnx.ModelProto, options: FixOptions, found: Found) -> PassResult:
        result = found.report()
        edits = [p.edit for p in found.plans if isinstance(p, LayerFoldPlan)]
        lowerings = [p.lowering for p in found.plans if isinstance(p, LoweringPlan)]
        qdq_folds = [p.fold for p in found.plans if isinstance(p, QdqFoldPlan)]
        before, after = result.metrics.pop("batchnorm_before"), result.metrics.pop("batchnorm_after")
        if found.plans:
            plan = found.plans[0]
            assert isinstance(plan, BatchNormPlan)
            self._apply(plan.index, plan.order, edits, lowerings, qdq_folds, options, result)
        folded = sum(1 for c in result.changes if c.action.startswith("folded"))
        if qdq_folds:
            result.metrics["qdq_folded"] = len(qdq_folds)
        result.metrics.update({
            "batchnorm_before": before,
            "folded": folded,
            "lowered": len(lowerings),
            "batchnorm_after": after,
        })
        return result

    @staticmethod
    def _apply(index: GraphIndex, order: dict[str, int], edits: list[_LayerEdit], lowerings: list[_Lowering],
               qdq_folds: list[_QdqFold], options: FixOptions, result: PassResult) -> None:
        """Apply the plans through ``index`` and report their changes in graph order (``order``: the float-rule
        BNs' places, a QDQ fold's first)."""
        conv_mode = options.bn_standalone == "conv"
        editor = GraphEditor(index)
        batches = _ConvBatches(index, edits)
        for edit in edits:
            result.changes.extend(_apply_fold(index, editor, edit, batches.take(edit)))
        for low in lowerings:
            result.changes.append(_lower(index, editor, low, conv_mode))
        for fold in qdq_folds:
            result.changes.append(_apply_qdq_fold(index, editor, fold))
        if qdq_folds:
            result.quantized_tolerance = True  # one rounding step fewer: exact within quantization steps
        editor.commit()
        result.changes.sort(key=lambda change: order.get(change.node, 0))


# --- the BN itself ----------------------------------------------------------------------------------


def _edit_bns(edit: _LayerEdit) -> tuple[str, ...]:
    """The names of the BN(s) folded into one layer: the one after it, then the one before it."""
    if edit.inp_bn is None:
        return (edit.out_bn.name,)  # type: ignore[union-attr]
    if edit.out_bn is None:
        return (edit.inp_bn.name,)
    return edit.out_bn.name, edit.inp_bn.name


def _is_batchnorm(node: onnx.NodeProto) -> bool:
    return node.op_type == "BatchNormalization" and is_default_domain(node)


@dataclass
class _Params:
    """A BN's checked parameters before its ``(a, b)`` is computed, together with every BN of the same ``key``
    (parameter shape and dtypes). Either ``raw`` (the four raw initializers' bytes: read without a numpy call
    per tensor) or ``values`` (float64 arrays from any other kind of constant)."""

    key: tuple[Any, ...]
    eps: float
    per_activation: bool
    raw: tuple[bytes, ...] | None = None
    values: list[np.ndarray] | None = None


def _affines(index: GraphIndex, bns: list[onnx.NodeProto],
             opset: int) -> dict[int, tuple[_Affine | None, str]]:
    """``(a, b)`` of every inference-mode BN in ``bns`` (by node id), or None and the reason it must stay.

    The math is the one in the module docstring, elementwise in float64, so computing every BN with the same
    parameter shape and dtypes in one array gives each BN bit for bit what it would get alone.
    """
    found: dict[int, tuple[_Affine | None, str]] = {}
    groups: dict[tuple[Any, ...], list[tuple[int, _Params]]] = {}
    for bn in bns:
        params, problem = _bn_params(index, bn, opset)
        if params is None:
            found[id(bn)] = None, problem
        else:
            groups.setdefault(params.key, []).append((id(bn), params))
    for key, members in groups.items():
        shape = key[0]
        n = len(members)
        if key[1] is None:
            scale, beta, mean, var = (np.stack([p.values[r] for _, p in members]) for r in range(4))
        else:
            scale, beta, mean, var = (
                np.frombuffer(b"".join(p.raw[r] for _, p in members), dtype=dtype).reshape((n,) + shape)
                .astype(np.float64) for r, dtype in enumerate(key[1]))
        eps = np.array([p.eps for _, p in members]).reshape((n,) + (1,) * len(shape))
        denom = var + eps
        axes = tuple(range(1, len(shape) + 1))
        valid = np.all(denom > 0, axis=axes)
        rows = np.arange(n)
        if not valid.all():
            # Only the valid rows go on: the others would take the square root of a negative number.
            rows = np.flatnonzero(valid)
            scale, beta, mean, denom = scale[rows], beta[rows], mean[rows], denom[rows]
        a = scale / np.sqrt(denom)
        b = beta - mean * a
        finite = np.all(np.isfinite(a), axis=axes) & np.all(np.isfinite(b), axis=axes)
        for (node_id, _), ok in zip(members, valid):
            if not ok:
                found[node_id] = None, "var + epsilon <= 0 for some channel (the original output is NaN/inf there)"
        for i, row in enumerate(rows):
            node_id, params = members[row]
            if finite[i]:
                found[node_id] = _Affine(a[i], b[i], params.per_activation), ""
            else:
                found[node_id] = None, "its parameters are not finite"
    return found


def _bn_attributes(bn: onnx.NodeProto) -> dict[str, Any]:
    """The attributes of ``bn`` this pass reads (training_mode, epsilon, spatial) that it sets, as get_attr
    reads them, in one walk over its attributes (this runs for every BN)."""
    values: dict[str, Any] = {}
    for attr in bn.attribute:
        name = attr.name
        if name not in _BN_ATTRIBUTES or name in values:  # the first of a repeated name, as get_attr
            continue
        kind = attr.type
        if kind == onnx.AttributeProto.INT and not attr.ref_attr_name:
            values[name] = attr.i
        elif kind == onnx.AttributeProto.FLOAT and not attr.ref_attr_name:
            values[name] = attr.f
        else:
            values[name] = get_attr(bn, name)
    return values


_BN_ATTRIBUTES = frozenset({"training_mode", "epsilon", "spatial"})


def _inference_form_problem(attributes: dict[str, Any], inputs: list[str], outputs: list[str],
                            opset: int) -> str | None:
    """Why a BN (its ``attributes``, inputs and outputs) is not an inference-mode BN with its five inputs (None
    when it is)."""
    if opset < 7:
        return (f"BatchNormalization at opset {opset} (is_test / consumed_inputs form) is not handled; "
                "convert the model to opset >= 9 first (onnx.version_converter)")
    if len(inputs) < 5 or not all(inputs[:5]):
        return "it does not have its five inputs"
    if attributes.get("training_mode", 0):
        return "training_mode=1: it normalises with batch statistics, which no constant map reproduces"
    if len(outputs) > 1:
        if opset < 14:
            # Before opset 14 the output count selects the mode: extra outputs mean training (batch statistics),
            # which is also how onnxruntime reads it, even when nothing reads them.
            return (f"it has training outputs {outputs[1:]}: before opset 14 that form normalises with batch "
                    "statistics")
        extra = [o for o in outputs[1:] if o]
        if extra:
            return f"it has running-statistics outputs {extra}, which only training mode defines"
    return None


def _bn_params(index: GraphIndex, bn: onnx.NodeProto, opset: int) -> tuple[_Params | None, str]:
    """The parameters of an inference-mode BN, or None and the reason it must stay."""
    inputs, outputs = bn.input[:], bn.output[:]  # plain lists: each field access builds a Python object
    attributes = _bn_attributes(bn)
    problem = _inference_form_problem(attributes, inputs, outputs, opset)
    if problem is not None:
        return None, problem
    raws = _raw_floats(index, inputs[1:5])
    params: list[np.ndarray] | None = None
    if raws is not None:
        shapes: list[Any] = raws[1]
    else:
        params = []
        for role, name in zip(_PARAM_ROLES, inputs[1:5]):
            value = _const(index, name)
            if value is None:
                return None, f"its {role} {name} {_not_constant(index, name)}"
            if value.dtype not in (np.float16, np.float32, np.float64):
                return None, f"its {role} {name} has dtype {value.dtype}, not a float type this pass handles"
            params.append(value.astype(np.float64))
        shapes = [list(p.shape) for p in params]
    first = shapes[0]
    if shapes.count(first) != len(shapes) or len(first) == 0:
        return None, f"its parameters have inconsistent shapes {[list(s) for s in shapes]}"
    shape = tuple(first)
    per_activation = False
    if opset < 9 and attributes.get("spatial", 1) == 0:
        if len(shape) >= 2:
            per_activation = True
        else:
            x_shape = index.shape(inputs[0]) or index.shape(outputs[0])
            if x_shape is None or len(x_shape) != 2:
                return None, ("spatial=0 with per-channel parameters on an input that is not [N, C] "
                              "(per-activation parameters [C, D1, ...] expected)")
    elif len(shape) != 1:
        return None, f"its parameters have shape {list(shape)}, not [C]"
    eps = float(attributes.get("epsilon", 1e-5))
    if raws is not None:
        return _Params((shape, raws[2]), eps, per_activation, raw=raws[0]), ""
    return _Params((shape, None), eps, per_activation, values=params), ""


# --- finding targets ----------------------------------------------------------------------------------


def _backward_target(index: GraphIndex, bn: onnx.NodeProto,
                     affine: _Affine) -> tuple[onnx.NodeProto | None, str]:
    """The Conv / ConvTranspose / Gemm / MatMul the BN folds into (rule 1), or None and why not."""
    if affine.per_activation:
        return None, "spatial=0 (per-activation parameters)"
    x = bn.input[0]
    layer = index.producer.get(x)
    if layer is None:
        kind = "a graph input" if x in index.graph_inputs else "constant"
        return None, f"its input {x} is {kind}"
    op = layer.op_type
    if op not in _PRODUCERS or not is_default_domain(layer):
        return None, (f"its input comes from {op} {layer.name}, "
                      "not a Conv/ConvTranspose/Gemm/MatMul")
    if x in index.output_set:
        return None, f"{op} {layer.name} output {x} is also a graph output"
    readers = len(index.consumers_of(x))
    if readers != 1:
        return None, f"{op} {layer.name} output {x} also feeds {readers - 1} other node(s)"
    inputs = layer.input[:]  # one read of the repeated field (this runs for every BN)
    problem = _weights_problem(index, layer, inputs)
    if problem:
        return None, problem
    w_shape = _const_shape(index, inputs[1])
    c = affine.channels
    if op == "Conv":
        m = w_shape[0] if w_shape else None
    elif op == "ConvTranspose":
        m = w_shape[1] * int(get_attr(layer, "group", 1)) if w_shape and len(w_shape) > 1 else None
    else:
        if not w_shape or len(w_shape) != 2:
            return None, f"{op} {layer.name} weight is not 2-D"
        if op == "MatMul":
            shape = index.shape(x) or index.shape(inputs[0])
            rank = len(shape) if shape is not None else "unknown"
            if rank != 2:
                return None, (f"{op} {layer.name} output rank is {rank}: BN normalises axis 1, which is the "
                              "weight's output axis only for a 2-D [N, C] output")
            m = w_shape[1]
        else:
            m = w_shape[0] if get_attr(layer, "transB", 0) else w_shape[1]
    if m != c:
        return None, f"{op} {layer.name} has {m} output channels, the BN {c}"
    return layer, ""


def _weights_problem(index: GraphIndex, layer: onnx.NodeProto, inputs: list[str]) -> str | None:
    """Why ``layer``'s weight (and bias, when present) cannot be folded into, or None when both are constants
    (``inputs``: its inputs, as read)."""
    if len(inputs) < 2:
        return f"{layer.op_type} {layer.name} has no weight input"
    problem = _const_problem(index, inputs[1], layer, "weight")
    if not problem and len(inputs) > 2 and inputs[2]:
        problem = _const_problem(index, inputs[2], layer, "bias")
    return problem


def _forward_target(index: GraphIndex, bn: onnx.NodeProto,
                    affine: _Affine) -> tuple[onnx.NodeProto | None, str]:
    """The Conv the BN folds into from the front (rule 2), or None and why not."""
    if affine.per_activation:
        return None, "spatial=0 (per-activation parameters)"
    y = bn.output[0]
    if y in index.output_set:
        return None, f"its output {y} is a graph output"
    users = index.consumers_of(y)
    if len(users) != 1:
        return None, f"its output feeds {len(users)} nodes"
    conv = users[0]
    where = f"{conv.op_type} {conv.name}"
    if conv.op_type != "Conv" or not is_default_domain(conv):
        return None, f"its output feeds {where}, not a Conv"
    if conv.input[0] != y or y in list(conv.input[1:]):
        return None, f"its output is not only the data input of {where}"
    problem = _weights_problem(index, conv, conv.input[:])
    if problem:
        return None, problem
    w_shape = _const_shape(index, conv.input[1])
    group = int(get_attr(conv, "group", 1))
    if not w_shape or len(w_shape) < 3 or w_shape[1] * group != affine.channels:
        return None, (f"{where} weight {list(w_shape or [])} (group {group}) does not read "
                      f"{affine.channels} channels")
    try:
        geometry = conv_geometry(index, conv)
    except ValueError as exc:
        return None, str(exc)
    if not geometry.resolved:
        return None, f"{where} auto_pad={geometry.auto_pad} with an unknown input shape"
    if any(geometry.pads):
        return None, (f"{where} pads {geometry.pads}: the padded border would read BN(0) = b instead of 0")
    return conv, ""


def _lowering_form(index: GraphIndex, bn: onnx.NodeProto, affine: _Affine) -> tuple[int | None, type, str]:
    """Rank and dtype for rule 3, or the reason it cannot be lowered."""
    x, y = bn.input[0], bn.output[0]
    elem = index.elem_type(x) or index.elem_type(y)
    dtype = _FLOAT_TYPES.get(elem)
    if dtype is None:
        if elem:
            return None, np.float32, f"input type {onnx.TensorProto.DataType.Name(elem)} is not handled"
        dtype = np.dtype(_const(index, bn.input[1]).dtype).type  # unknown: the parameters' dtype
    shape = index.shape(x) or index.shape(y)
    rank = len(shape) if shape is not None else None
    if affine.per_activation:
        return rank, dtype, ""
    if rank is None:
        return None, dtype, ("its input rank is unknown, so per-channel constants cannot be shaped "
                             "(freeze the input shapes)")
    if rank < 2:
        return None, dtype, f"its input has rank {rank}, below [N, C]"
    return rank, dtype, ""


def _not_constant(index: GraphIndex, name: str) -> str:
    if name in index.overridable:
        return ("is an initializer also listed as a graph input, so only a default a caller may override (export "
                "without keep_initializers_as_inputs)")
    return "is not constant"


def _const_problem(index: GraphIndex, name: str, layer: onnx.NodeProto, role: str) -> str | None:
    """None when ``name`` (``layer``'s ``role``: weight or bias) is a float constant this pass may rewrite, else
    the reason it is not."""
    if name in index.graph_inputs:
        return f"{_what(layer, role)} {name} is a graph input"
    if name in index.overridable:
        return f"{_what(layer, role)} {name} {_not_constant(index, name)}"
    producer = index.producer.get(name)
    if name not in index.initializers and (producer is None or producer.op_type != "Constant"):
        if producer is not None and producer.op_type == "DequantizeLinear":
            return (f"{_what(layer, role)} {name} comes from DequantizeLinear {producer.name} (quantized): folding "
                    "would change the quantized weight")
        source = f"computed by {producer.op_type} {producer.name}" if producer is not None else "not constant"
        return f"{_what(layer, role)} {name} is {source}"
    elem = index.elem_type(name)
    if elem == onnx.TensorProto.UNDEFINED and producer is not None:
        value = _const(index, name)
        elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype) if value is not None else elem
    if elem not in _FLOAT_TYPES:
        return f"{_what(layer, role)} {name} has element type {onnx.TensorProto.DataType.Name(elem)}, not float"
    return None


def _what(layer: onnx.NodeProto, role: str) -> str:
    """How a reason names ``layer``'s weight or bias (built only for a reason: this pass asks for every BN)."""
    return f"{layer.op_type} {layer.name} {role}"


def _const_shape(index: GraphIndex, name: str) -> tuple[int, ...] | None:
    """Shape of a constant without reading its data when it is an initializer."""
    if name in index.initializers:
        return tuple(index.initializers[name].dims[:])  # a slice reads the repeated field in one call
    value = _const(index, name)  # a Constant node: small in practice
    return tuple(value.shape) if value is not None else None


# --- rewriting ----------------------------------------------------------------------------------------


_Folded = tuple[np.ndarray, "np.ndarray | None"]  # (new weight, new float64 bias or None)


class _ConvBatches:
    """The new weight and bias of plain rule-1 Conv folds (``Conv -> BN``, raw float initializers), computed for
    a batch of Convs with the same weight shape and dtypes at once.

    At 33k folds one numpy call per array costs more than the arithmetic; the arithmetic is :func:`_fold_conv`'s,
    elementwise, so each Conv gets bit for bit what it would get alone. A batch is computed when its first Conv
    is written and handed out in edit order, so at most one batch per weight shape is held (``_BATCH_BYTES``
    each), never a copy of every weight. Reading a batch ahead of earlier writes is safe: a tensor is only
    overwritten in place when its one reader is the layer being folded.
    """

    def __init__(self, index: GraphIndex, edits: list[_LayerEdit]) -> None:
        self.index = index
        groups: dict[tuple[Any, ...], list[_LayerEdit]] = {}
        for edit in edits:
            node = edit.node
            if node.op_type != "Conv" or edit.inp is not None or edit.out is None:
                continue  # the other folds are rare: _apply_fold computes them one by one
            weight = _raw_meta(index, node.input[1])
            bias_name = node.input[2] if len(node.input) > 2 else ""
            bias = _raw_meta(index, bias_name) if bias_name else None
            if weight is None or len(weight[1]) < 2 or (bias_name and bias is None):
                continue
            if bias is not None and math.prod(bias[1]) != weight[1][0]:
                continue  # malformed: _bias64's reshape raises, as it always did
            groups.setdefault((weight[1], weight[2], bias[2] if bias is not None else None), []).append(edit)
        self._batch: dict[int, tuple[list[_LayerEdit], tuple[Any, ...]]] = {}
        for key, group in groups.items():
            size = max(1, _BATCH_BYTES // max(1, math.prod(key[0]) * key[1].itemsize))
            for i in range(0, len(group), size):
                batch = group[i:i + size], key
                self._batch.update((id(edit), batch) for edit in batch[0])
        self._ready: dict[int, _Folded] = {}

    def take(self, edit: _LayerEdit) -> _Folded | None:
        """``edit``'s new weight and float64 bias, or None when it is not a batched fold."""
        batch = self._batch.pop(id(edit), None)
        if batch is not None and id(edit) not in self._ready:
            self._ready.update(self._compute(*batch))
        return self._ready.pop(id(edit), None)

    def _compute(self, edits: list[_LayerEdit], key: tuple[Any, ...]) -> dict[int, _Folded]:
        shape, dtype, bias_dtype = key
        index = self.index
        size = math.prod(shape) * dtype.itemsize
        members = []
        for edit in edits:
            node = edit.node
            weight = index.initializers[node.input[1]].raw_data
            bias = index.initializers[node.input[2]].raw_data if bias_dtype is not None else b""
            if len(weight) == size and (bias_dtype is None or len(bias) == shape[0] * bias_dtype.itemsize):
                members.append((edit, weight, bias))
            # else malformed: left to _apply_fold, whose reshape raises at that Conv, as it always did
        if not members:
            return {}
        n, m = len(members), shape[0]
        weights = np.frombuffer(b"".join(w for _, w, _ in members), dtype=dtype).reshape((n,) + shape)
        a = np.stack([edit.out.a for edit, _, _ in members])  # type: ignore[union-attr]
        b = np.stack([edit.out.b for edit, _, _ in members])  # type: ignore[union-attr]
        if bias_dtype is None:
            bias = np.zeros((n, m))
        else:
            bias = np.frombuffer(b"".join(c for _, _, c in members), dtype=bias_dtype).reshape(n, m)
            bias = bias.astype(np.float64)
        bias = bias * a + b
        new_weights = _scaled(weights, a.reshape((n, m) + (1,) * (len(shape) - 1)))
        return {id(edit): (new_weights[i], bias[i]) for i, (edit, _, _) in enumerate(members)}


_BATCH_BYTES = 4 << 20
"""Weights computed together take at most this much (plus as much again for the result): batching is for
many small layers, where numpy's per-call cost dominates; big weights still go one by one."""


def _apply_fold(index: GraphIndex, editor: GraphEditor, edit: _LayerEdit,
                folded: _Folded | None = None) -> list[Change]:
    """Write one layer's fold (``folded``: its new weight and bias when computed already) and rewire the BNs."""
    node = edit.node
    op = node.op_type
    inputs = node.input[:]  # one read of the repeated field (this runs for every fold)
    old_weight_name = inputs[1]
    bias_slot = 2
    if folded is not None:
        new_weight, bias = folded
    else:
        weight = _const(index, node.input[1])
        assert weight is not None  # checked while finding
        if op == "Conv":
            new_weight, bias = _fold_conv(index, node, weight, edit)
        elif op == "ConvTranspose":
            new_weight, bias = _fold_conv_transpose(index, node, weight, edit.out)
        elif op == "Gemm":
            new_weight, bias = _fold_gemm(index, node, weight, edit.out)
        else:  # MatMul
            new_weight = _scaled(weight, edit.out.a[None, :])
            bias = None
    dtype = new_weight.dtype  # the weight's own dtype (_scaled keeps it)
    weight_name = _store(index, editor, node, inputs, 1, new_weight)
    if bias is not None:
        _store(index, editor, node, inputs, bias_slot, bias.astype(dtype), base=f"{node.name}_bias")

    changes = []
    if edit.inp is not None:
        bn = edit.inp_bn
        node.input[0] = bn.input[0]
        editor.remove(bn)
        changes.append(Change(bn.name, bn.op_type, f"folded into {op}", new=node.name,
                              detail={"rule": "bn->conv", "target": node.name, "weight": weight_name,
                                      "old_weight": old_weight_name}))
    if edit.out is not None:
        bn = edit.out_bn
        if op == "MatMul":
            # MatMul has no bias: the shift stays as an Add on the BN's place, writing the BN's output.
            shift = editor.add_initializer(f"{bn.name}_shift", edit.out.b.astype(dtype))
            add = editor.make_node("Add", [bn.input[0], shift], [bn.output[0]], f"{bn.name}_add")
            editor.replace(bn, [add])
            action, new = f"folded into {op} (shift as Add)", [node.name, add.name]
        else:
            node.output[0] = bn.output[0]
            editor.remove(bn)
            action, new = f"folded into {op}", node.name
        changes.append(Change(bn.name, bn.op_type, action, new=new,
                              detail={"rule": f"{op.lower()}->bn", "target": node.name,
                                      "weight": weight_name, "old_weight": old_weight_name}))
    return changes


def _fold_conv(index: GraphIndex, node: onnx.NodeProto, weight: np.ndarray,
               edit: _LayerEdit) -> tuple[np.ndarray, np.ndarray]:
    m, cg = weight.shape[0], weight.shape[1]
    group = int(get_attr(node, "group", 1))
    bias = _bias64(index, node, m)
    factor = np.ones((m, 1))
    if edit.inp is not None:
        # Input channel of (m, j) is grp(m) * C/g + j; groups hold M/g consecutive output channels.
        a_in = np.repeat(edit.inp.a.reshape(group, cg), m // group, axis=0)
        b_in = np.repeat(edit.inp.b.reshape(group, cg), m // group, axis=0)
        taps = weight.reshape(m, cg, -1).sum(axis=2, dtype=np.float64)  # sum_k W[m, j, k], original W
        bias = bias + (taps * b_in).sum(axis=1)
        factor = a_in
    if edit.out is not None:
        factor = factor * edit.out.a[:, None]
        bias = bias * edit.out.a + edit.out.b
    factor = factor.reshape(factor.shape + (1,) * (weight.ndim - 2))
    return _scaled(weight, factor), bias


def _fold_conv_transpose(index: GraphIndex, node: onnx.NodeProto, weight: np.ndarray,
                         out: _Affine) -> tuple[np.ndarray, np.ndarray]:
    c_in, mg = weight.shape[0], weight.shape[1]
    group = int(get_attr(node, "group", 1))
    bias = _bias64(index, node, mg * group) * out.a + out.b
    # W is [C_in, M/g, k...]; group grp maps input rows grp*C_in/g.. onto output channels grp*M/g + j.
    grouped = weight.reshape(group, c_in // group, mg, -1)
    factor = out.a.reshape(group, 1, mg, 1)
    return _scaled(grouped, factor).reshape(weight.shape), bias


def _fold_gemm(index: GraphIndex, node: onnx.NodeProto, weight: np.ndarray,
               out: _Affine) -> tuple[np.ndarray, np.ndarray]:
    factor = out.a[:, None] if get_attr(node, "transB", 0) else out.a[None, :]
    beta = float(get_attr(node, "beta", 1.0))
    c_name = node.input[2] if len(node.input) > 2 else ""
    c = _const(index, c_name).astype(np.float64) * beta if c_name else np.zeros(())
    # a * (alpha*A*B' + beta*C) + b = alpha*A*(B' * a) + (a*beta*C + b): C broadcasts over [N, M] either way.
    new_c = c * out.a + out.b
    set_attr(node, "beta", None)  # default 1.0: beta is now inside C
    return _scaled(weight, factor), new_c


def _bias64(index: GraphIndex, node: onnx.NodeProto, channels: int) -> np.ndarray:
    if len(node.input) > 2 and node.input[2]:
        return _const(index, node.input[2]).astype(np.float64).reshape(channels)
    return np.zeros(channels)


def _scaled(weight: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """``weight * factor`` computed in float64 and rounded once to the weight's dtype, without a float64
    copy of the weight (the ufunc casts in small buffers)."""
    out = np.empty(np.broadcast_shapes(weight.shape, factor.shape), dtype=weight.dtype)
    np.multiply(weight, factor, out=out, casting="unsafe")
    return out


def _store(index: GraphIndex, editor: GraphEditor, node: onnx.NodeProto, inputs: list[str], slot: int,
           value: np.ndarray, base: str | None = None) -> str:
    """Give ``node`` input ``slot`` the value: in place when it is the initializer's only reader. ``inputs``: the
    node's inputs as read before the fold (the other slot's store leaves this one's name). The name the input
    has now."""
    name = inputs[slot] if slot < len(inputs) else ""
    if not name:
        new_name = editor.add_initializer(base or f"{node.name}_in{slot}", value)
        while len(node.input) <= slot:
            node.input.append("")
        node.input[slot] = new_name
        return new_name
    if (name in index.initializers and name not in index.graph_inputs and name not in index.output_set
            and len(index.consumers_of(name)) == 1):
        overwrite_tensor(index.initializers[name], value)
        return name
    private_initializer(index, editor, node, slot, value)  # shared (or a Constant): a private copy
    return node.input[slot]


def _lower(index: GraphIndex, editor: GraphEditor, low: _Lowering, conv_mode: bool) -> Change:
    bn, affine = low.bn, low.affine
    x, y = bn.input[0], bn.output[0]
    c = affine.channels
    detail = {"rule": "standalone", "why_not_folded": low.why_not_folded}
    if conv_mode and not affine.per_activation and low.rank in (3, 4):
        spatial = low.rank - 2
        weight = editor.add_initializer(f"{bn.name}_weight",
                                        affine.a.reshape((c, 1) + (1,) * spatial).astype(low.dtype))
        bias = editor.add_initializer(f"{bn.name}_bias", affine.b.astype(low.dtype))
        conv = editor.make_node("Conv", [x, weight, bias], [y], f"{bn.name}_dwconv", group=c,
                                kernel_shape=[1] * spatial)
        editor.replace(bn, [conv])
        return Change(bn.name, bn.op_type, "lowered to 1x1 depthwise Conv", new=[conv.name], detail=detail)
    if affine.per_activation:
        shape = affine.a.shape
    else:
        shape = (c,) + (1,) * (low.rank - 2)
    if conv_mode:
        detail["note"] = "bn_standalone=conv needs a rank-3/4 per-channel input; used Mul+Add"
    scale = editor.add_initializer(f"{bn.name}_scale", affine.a.reshape(shape).astype(low.dtype))
    shift = editor.add_initializer(f"{bn.name}_shift", affine.b.reshape(shape).astype(low.dtype))
    scaled = index.unique_name(f"{bn.name}_scaled")
    mul = editor.make_node("Mul", [x, scale], [scaled], f"{bn.name}_mul")
    add = editor.make_node("Add", [scaled, shift], [y], f"{bn.name}_add")
    editor.replace(bn, [mul, add])
    return Change(bn.name, bn.op_type, "lowered to Mul+Add", new=[mul.name, add.name], detail=detail)


# --- small helpers ------------------------------------------------------------------------------------


def _raw_meta(index: GraphIndex, name: str) -> tuple[onnx.TensorProto, tuple[int, ...], np.dtype] | None:
    """``(tensor, shape, little-endian dtype)`` when ``name`` is a raw float initializer, else None: the tensors
    :func:`_const` reads through its fast path. Ordered cheapest test first (33k BNs); the bytes are not read."""
    tensor = index.initializers.get(name)
    if tensor is None:
        return None
    dtype = _LE_DTYPES.get(tensor.data_type)
    if (dtype is None or tensor.data_location == onnx.TensorProto.EXTERNAL or not tensor.HasField("raw_data")
            or name in index.overridable):
        return None
    return tensor, tuple(tensor.dims[:]), dtype  # a slice reads the repeated field in one call


def _raw_floats(index: GraphIndex, names: list[str]) -> tuple[tuple[bytes, ...], list[list[int]],
                                                                tuple[np.dtype, ...]] | None:
    """The bytes, dims and little-endian dtypes of ``names`` when every one is a raw float initializer whose byte
    count matches its dims (:func:`_raw_meta`'s tensors), else None. One loop over the tensors, every field read
    once: it runs for the four parameters of every BN."""
    initializers, overridable, external = index.initializers, index.overridable, onnx.TensorProto.EXTERNAL
    datas, shapes, dtypes = [], [], []
    for name in names:
        tensor = initializers.get(name)
        if tensor is None:
            return None
        dtype = _LE_DTYPES.get(tensor.data_type)
        if (dtype is None or tensor.data_location == external or not tensor.HasField("raw_data")
                or name in overridable):
            return None
        dims = tensor.dims[:]
        data = tensor.raw_data
        if math.prod(dims) * dtype.itemsize != len(data):
            return None  # malformed: _const's reshape raises, as it always did
        datas.append(data)
        shapes.append(dims)
        dtypes.append(dtype)
    return tuple(datas), shapes, tuple(dtypes)


def _const(index: GraphIndex, name: str) -> np.ndarray | None:
    """``index.const_value`` with a fast path for the common raw float initializer (a read-only view of its
    bytes): at 100k nodes the generic converter costs more than the fold itself."""
    tensor = index.initializers.get(name)
    if (tensor is not None and tensor.data_type in _FLOAT_TYPES and tensor.HasField("raw_data")
            and tensor.data_location != onnx.TensorProto.EXTERNAL and name not in index.overridable):
        return np.frombuffer(tensor.raw_data, dtype=_LE_DTYPES[tensor.data_type]).reshape(tuple(tensor.dims))
    return index.const_value(name)


def _nested_batchnorms(node: onnx.NodeProto) -> int:
    """BatchNormalization nodes inside ``node``'s subgraphs (If/Loop/Scan bodies), which this pass leaves."""
    count = 0
    for g in subgraphs(node):
        for sub in g.node:
            count += sub.op_type == "BatchNormalization"
            count += _nested_batchnorms(sub)
    return count


# --- QDQ: Conv -> Q -> DQ -> BN -> Q folded into the conv's weight scale ---------------------------------------
#
#   DQ(W_q, s, zp) -> Conv -> Q(s1) -> DQ -> BN(a, b) -> Q(s2) -> DQ      (also ConvTranspose, group 1)
#   DQ(W_q', s', zp) -> Conv(bias DQ(b_q', s_x * s', 0)) -> Q(s2) -> DQ
#
# with s'[m] = s[m] * |a[m]|, W_q'[m] = W_q[m] where a[m] >= 0 and 2 zp - W_q[m] (the reflection about the zero
# point) where a[m] < 0, so DQ(W_q')[m] = a[m] * DQ(W_q)[m] exactly up to float32 rounding of the scale. A
# reflection that leaves the integer range (int8 -128 with zp 0) requantizes that channel on its own new
# symmetric scale (declared in the change). The bias a * bias + b is quantized on the conv's usual bias grid
# s_x * s' (round to nearest, int32 range checked). The middle Q(s1) -> DQ disappears: the conv's output is
# quantized once, by the BN's output quantizer. That removes one rounding step, so the result is exact within
# quantization steps, not bit for bit: PassResult.quantized_tolerance.


@dataclass
class _QdqFold:
    bn: onnx.NodeProto
    conv: onnx.NodeProto
    q1: onnx.NodeProto
    dq1: onnx.NodeProto
    weight: QuantizedConst
    bias: QuantizedConst | None
    x_scale: np.ndarray
    a: np.ndarray
    b: np.ndarray
    values: _QdqFolded | None = None


def _qdq_value(index: GraphIndex, name: str) -> np.ndarray | None:
    """A float constant, or the value of a DequantizeLinear of one (QDQ models quantize BN parameters too)."""
    value = _const(index, name)
    if value is not None:
        return value.astype(np.float64) if value.dtype.kind == "f" else None
    const = quantized_const(index, name)
    return None if const is None else const.dequantized().astype(np.float64)


def _qdq_fold_plan(index: GraphIndex, bn: onnx.NodeProto) -> tuple[_QdqFold | None, str | None]:
    """The QDQ fold of ``bn`` (None, None when the BN is not in that pattern; None, reason when it is but
    cannot be folded)."""
    dq1 = index.producer.get(bn.input[0])
    if dq1 is None or dq1.op_type != "DequantizeLinear":
        return None, None
    q1 = index.producer.get(dq1.input[0])
    if q1 is None or q1.op_type != "QuantizeLinear":
        return None, None
    conv = index.producer.get(q1.input[0])
    if conv is None or conv.op_type not in ("Conv", "ConvTranspose"):
        return None, None
    if (index.single_consumer(conv.output[0]) is not q1 or index.single_consumer(q1.output[0]) is not dq1
            or index.single_consumer(dq1.output[0]) is not bn):
        return None, "the Conv -> Q -> DQ -> BN chain is also read elsewhere"
    readers = index.consumers_of(bn.output[0])
    if (not readers or bn.output[0] in index.output_set
            or any(r.op_type != "QuantizeLinear" or quant_params(index, r) is None for r in readers)):
        return None, "its output is not quantized by a QuantizeLinear (the folded conv would lose its quantizer)"
    if any(o for o in bn.output[1:]) or get_attr(bn, "training_mode", 0):
        return None, "training mode"
    weight = quantized_const(index, conv.input[1]) if len(conv.input) > 1 else None
    if weight is None or weight.params.dtype not in (np.int8, np.uint8):
        return None, "its conv's weight is not an int8/uint8 DequantizeLinear of a constant"
    transpose = conv.op_type == "ConvTranspose"
    group = int(get_attr(conv, "group", 1))
    if transpose and group != 1:
        return None, "a grouped ConvTranspose cannot take a per-output-channel weight scale"
    if weight.params.axis is not None and weight.params.axis != (1 if transpose else 0):
        return None, f"its conv's weight is quantized per channel on axis {weight.params.axis}"
    bias = None
    if len(conv.input) > 2 and conv.input[2]:
        bias = quantized_const(index, conv.input[2])
        if bias is None and _const(index, conv.input[2]) is None:
            return None, "its conv's bias is neither constant nor a DequantizeLinear of a constant"
    x_dq = dequantizer_of(index, conv.input[0])
    if x_dq is None or x_dq[1].per_channel:
        return None, "its conv's input is not a per-tensor DequantizeLinear output (the bias scale needs it)"
    params = [_qdq_value(index, name) for name in bn.input[1:5]]
    if any(p is None for p in params):
        return None, "a parameter is neither constant nor a DequantizeLinear of a constant"
    gamma, beta, mean, var = params  # type: ignore[misc]
    eps = float(get_attr(bn, "epsilon", 1e-5))
    if np.any(var + eps <= 0):
        return None, "var + eps <= 0"
    a = gamma / np.sqrt(var + eps)
    b = beta - mean * a
    fold = _QdqFold(bn, conv, q1, dq1, weight, bias, x_dq[1].scale.astype(np.float64).reshape(()), a, b)
    fold.values, problem = _qdq_fold_values(index, fold)
    return (fold, None) if problem is None else (None, problem)


@dataclass
class _QdqFolded:
    """The new integers and scales of one QDQ fold (computed while finding, so a bias overflow is a reason)."""

    weight_q: np.ndarray
    weight_scale: np.ndarray
    weight_zero_point: np.ndarray
    bias_q: np.ndarray
    bias_scale: np.ndarray
    requantized: list[int]
    negated: int


def _qdq_fold_values(index: GraphIndex, fold: _QdqFold) -> tuple[_QdqFolded | None, str | None]:
    conv, weight = fold.conv, fold.weight
    transpose = conv.op_type == "ConvTranspose"
    axis = 1 if transpose else 0
    q = weight.q.astype(np.int16)  # int8/uint8 reflections 2 zp - q fit in int16 (a quarter of int64's memory)
    channels = q.shape[axis]
    a = fold.a
    if a.size != channels:
        a = np.broadcast_to(a, (channels,))
    params = weight.params
    scale = np.broadcast_to(params.scale.astype(np.float64).reshape(-1), (channels,)).copy()
    zp = np.broadcast_to(params.zero_point.astype(np.int16).reshape(-1), (channels,)).copy()
    info = np.iinfo(params.dtype)
    # Channel-major [M, rest] view, so every per-channel step is one vectorized numpy call.
    rows = np.moveaxis(q, axis, 0).reshape(channels, -1)
    new_rows = np.where((a < 0)[:, None], 2 * zp[:, None] - rows, rows)
    new_scale = scale * np.abs(a)
    zero = a == 0
    new_rows[zero] = zp[zero, None]  # the channel is 0: its weights are the zero point, any positive scale
    new_scale[zero] = scale[zero]
    overflow = ~zero & ((new_rows.min(axis=1, initial=0) < info.min) | (new_rows.max(axis=1, initial=0) > info.max))
    requantized = [int(m) for m in np.flatnonzero(overflow)]
    for m in requantized:
        # The reflection of -128 is 128: requantize this channel symmetrically on its own scale.
        real = (rows[m] - zp[m]) * scale[m] * a[m]
        new_scale[m] = float(np.abs(real).max()) / min(-info.min, info.max) if np.any(real) else scale[m]
        new_rows[m] = np.clip(np.round(real / new_scale[m]) + zp[m], info.min, info.max)
    moved = np.moveaxis(q, axis, 0).shape
    new_q = np.moveaxis(new_rows.reshape(moved), 0, axis)
    scale_dtype = params.scale.dtype
    new_scale32 = new_scale.astype(scale_dtype)
    if not np.all(np.isfinite(new_scale32)) or np.any(new_scale32 <= 0):
        return None, "a folded weight scale s * |a| is not a positive finite number in the scale's dtype"
    # Bias: a * bias + b on the grid s_x * s' (what the conv's int32 bias uses).
    old_bias = np.zeros(channels)
    if fold.bias is not None:
        old_bias = fold.bias.dequantized().astype(np.float64).reshape(-1)
    elif len(conv.input) > 2 and conv.input[2]:
        old_bias = np.asarray(_const(index, conv.input[2]), dtype=np.float64).reshape(-1)
    bias_value = a * old_bias + fold.b
    bias_scale = (fold.x_scale * new_scale32.astype(np.float64)).astype(scale_dtype)
    bias_q = np.round(bias_value / bias_scale.astype(np.float64))
    int32 = np.iinfo(np.int32)
    if not np.all(np.isfinite(bias_q)) or bias_q.min() < int32.min or bias_q.max() > int32.max:
        return None, "the folded bias does not fit int32 on its scale (input scale x new weight scale)"
    return _QdqFolded(new_q.astype(params.dtype), new_scale32, zp.astype(params.dtype), bias_q.astype(np.int32),
                      bias_scale, requantized, int(np.count_nonzero(a < 0))), None


def _apply_qdq_fold(index: GraphIndex, editor: GraphEditor, fold: _QdqFold) -> Change:
    conv, values = fold.conv, fold.values
    assert values is not None
    channels = values.bias_q.size
    axis = 1 if conv.op_type == "ConvTranspose" else 0
    params = fold.weight.params
    # A per-tensor scale becomes per-channel: the DequantizeLinear gets the output-channel axis.
    store_quantized(index, editor, conv, 1, fold.weight, values.weight_q, values.weight_scale,
                    values.weight_zero_point, axis=axis)
    names = [editor.add_initializer(f"{conv.name}_bias_quantized", values.bias_q),
             editor.add_initializer(f"{conv.name}_bias_scale", values.bias_scale),
             editor.add_initializer(f"{conv.name}_bias_zero_point", np.zeros(channels, np.int32))]
    bias_dq = editor.make_node("DequantizeLinear", names, [index.unique_name(f"{conv.name}_bias")],
                               f"{conv.name}_bias_dequantize", axis=0)
    editor.prepend([bias_dq])
    while len(conv.input) < 3:
        conv.input.append("")
    conv.input[2] = bias_dq.output[0]
    # The conv now writes the BN's output, quantized by the BN's quantizer; the middle Q -> DQ and the BN go.
    conv.output[0] = fold.bn.output[0]
    for node in (fold.q1, fold.dq1, fold.bn):
        editor.remove(node)
    q1 = quant_params(index, fold.q1)
    # "exact": False names this BN in --strict's refusal and counts it (alone, not the float folds of the same
    # run) on the APPROXIMATE line.
    detail: dict[str, Any] = {"exact": False,
                              "rounding": "one requantization removed (the conv's own output quantizer)",
                              "weight_scale": "per-tensor -> per-channel" if params.axis is None else "per-channel",
                              "negated_channels": values.negated}
    if q1 is not None and q1.axis is None:
        info = np.iinfo(q1.dtype)
        zero, step = int(q1.zero_point.reshape(-1)[0]), float(q1.scale.reshape(-1)[0])
        # The removed quantizer also saturated: the folded conv's output is no longer clipped to its range.
        detail["clip_removed"] = [round((info.min - zero) * step, 6), round((info.max - zero) * step, 6)]
    if values.requantized:
        detail["requantized_channels"] = values.requantized
    return Change(fold.bn.name, fold.bn.op_type, "folded into QDQ conv scale", old=None, new=conv.name,
                  detail=detail)


def _find_qdq_folds(index: GraphIndex, nodes: list[onnx.NodeProto], result: PassResult,
                    blocking: bool) -> tuple[list[_QdqFold], list[onnx.NodeProto]]:
    """The BNs of ``nodes`` in the QDQ conv pattern (folded into the weight scale) and the nodes left for the
    float rules; a BN in the pattern that cannot be folded gets its reason and stays (no float rule applies to
    parameters that are DequantizeLinear outputs either)."""
    folds: list[_QdqFold] = []
    rest: list[onnx.NodeProto] = []
    if "DequantizeLinear" not in index.ops:
        return folds, nodes  # the pattern starts at a DequantizeLinear: a float model has none
    for node in nodes:
        if not _is_batchnorm(node) or len(node.input) < 5:
            rest.append(node)
            continue
        fold, problem = _qdq_fold_plan(index, node)
        if fold is not None:
            folds.append(fold)
        elif problem is not None:
            rest.append(node)  # the float rules report it (with their own reason) or fold it
            result.warnings.append(f"{node.name}: not folded as a QDQ conv: {problem}")
        else:
            rest.append(node)
    return folds, rest
