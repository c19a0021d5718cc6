"""Pass ``fold-pad-conv``: fold a constant zero Pad on the spatial axes into the Conv that reads it.

    X -> Pad(pads p, constant 0) -> Y -> Conv(pads c)        becomes   X -> Conv(pads c + p)

A Conv pads its input with zeros before it convolves, so ``Conv(pads c)(Pad(p, 0)(X))`` pads X with ``p + c``
zeros on each spatial side and then convolves: the same sums over the same values, term for term (exact, bit for
bit). Conditions, each refused with its reason otherwise: the Pad's mode is ``constant`` and its value 0 (or
absent), its pads are constants >= 0 and 0 on the batch and channel axes, its output is read only by that Conv
(not a graph output), the Conv is a default-domain Conv whose ``auto_pad`` is NOTSET / VALID or resolvable
from the static input shape (``ConvGeometry``), and, under a target that pads symmetrically only
(``symmetric_pads``), the summed pads stay symmetric.

Quantized (QDQ) models, as onnxruntime's quantizer and exporters write them; each stays exact:

    X -> Pad(0) -> Q -> DQ -> Conv                 becomes   X -> Q -> DQ -> Conv(pads c + p)
    Xq -> Pad(zp) -> DQ(zp) -> Conv                becomes   Xq -> DQ -> Conv(pads c + p)

QuantizeLinear and DequantizeLinear act element by element and map 0 to 0 (``Q(0) = round(0 / s) + zp = zp``,
``DQ(zp) = (zp - zp) * s = 0``), so a zero Pad commutes with them: padding before them or letting the Conv pad
after them gives the same tensor. On the integer side the pad value must be the DequantizeLinear's zero point (a
per-channel zero point: every channel's), so that the padded elements dequantize to exactly 0. The quantizer's
own unit around a Pad, ``DQ -> Pad -> Q -> DQ -> Conv`` with one set of parameters, loses its Q -> DQ pair too:
``Q(DQ(q)) = q`` (qdq.py), so ``DQ -> Conv(pads c + p)`` is what is left. The Q / DQ between Pad and Conv must
have no other reader, since it would then read the unpadded tensor.

Why a pass for it: rknn-toolkit2 2.5.0 fuses such a Pad into the Conv itself and crashes when the pads are an
initializer npufix folded (``_p_fuse_pad_into_conv: ValueError: assignment destination is read-only``); the
Rockchip profiles set ``fold_pad_into_conv``, and ``--fold-pad-into-conv`` asks for it on any target. It runs right
after cleanup, once fold-constants has turned the exporters' Shape -> ... -> Pad chains into constant pads.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import (
    GraphIndex,
    conv_geometry,
    get_attr,
)
from onnx_npu_fix.ir.ops import is_default_domain
from onnx_npu_fix.ir.qdq import dequantizer_of, quant_params
from onnx_npu_fix.passes.base import Fact, Form
from onnx_npu_fix.passes.rules import Emit, Match, Rule, RulePass, View


def _pad_parts(index: GraphIndex, pad: onnx.NodeProto, opset: int) -> tuple[list[int] | None, object, str | None]:
    """(pads per axis as [begin..., end...], the constant pad value (None: absent), why not foldable)."""
    mode = get_attr(pad, "mode", "constant") or "constant"
    if mode != "constant":
        return None, None, f"mode {mode!r} pads with the input's own values, not zeros"
    if opset < 11:
        return [int(p) for p in get_attr(pad, "pads") or []], get_attr(pad, "value", 0.0), None
    pads = index.const_value(pad.input[1]) if len(pad.input) > 1 and pad.input[1] else None
    if pads is None:
        return None, None, "its pads are computed at run time"
    value = None
    if len(pad.input) > 2 and pad.input[2]:
        value = index.const_value(pad.input[2])
        if value is None:
            return None, None, "its pad value is computed at run time"
    pads_list = [int(p) for p in np.asarray(pads).reshape(-1)]
    if len(pad.input) > 3 and pad.input[3]:
        axes = index.const_value(pad.input[3])
        rank = len(index.shape(pad.input[0]) or ())
        if axes is None or not rank:
            return None, None, "its axes are computed at run time or its rank is unknown"
        full = [0] * (2 * rank)
        axes_list = [int(a) % rank for a in np.asarray(axes).reshape(-1)]
        for i, axis in enumerate(axes_list):
            full[axis], full[axis + rank] = pads_list[i], pads_list[i + len(axes_list)]
        pads_list = full
    return pads_list, value, None


def _spatial_pads(pads: list[int]) -> tuple[list[int] | None, str | None]:
    """The pads of the spatial axes ([begin..., end...]) when the batch and channel axes are not padded."""
    rank = len(pads) // 2
    if rank < 3 or len(pads) != 2 * rank:
        return None, "it does not pad a [N, C, spatial...] tensor"
    if any(p < 0 for p in pads):
        return None, "a negative pad crops, which a Conv's pads cannot express"
    if pads[0] or pads[1] or pads[rank] or pads[rank + 1]:
        return None, "it pads the batch or channel axis"
    return pads[2:rank] + pads[rank + 2:], None


def _constant_pad_before_conv(index: GraphIndex, node: onnx.NodeProto, options: FixOptions) -> str | None:
    """The Conv a Pad with constant pads feeds (every reader a Conv), or None: the form fold_pad_into_conv folds."""
    readers = index.consumers_of(node.output[0])
    pads = node.input[1] if len(node.input) > 1 else ""
    if pads and index.is_const(pads) and readers and all(r.op_type == "Conv" for r in readers):
        return readers[0].name
    return None


def _requantizes(index: GraphIndex, source: str, between: list[onnx.NodeProto]) -> bool:
    """``DQ(params) -> [Pad] -> Q(params) -> DQ(params)``: without the Pad, ``Q(DQ(q)) = q`` (qdq.py), so the
    pair after it returns its input and can go."""
    if [n.op_type for n in between] != ["QuantizeLinear", "DequantizeLinear"]:
        return False
    upstream = dequantizer_of(index, source)
    q_params, dq_params = quant_params(index, between[0]), quant_params(index, between[1])
    return (upstream is not None and q_params is not None and dq_params is not None
            and upstream[1].same_as(q_params) and q_params.same_as(dq_params))

def _chain_to_conv(index: GraphIndex, name: str
                   ) -> tuple[onnx.NodeProto, onnx.NodeProto, list[onnx.NodeProto]] | None:
    """(the reader of ``name``, the Conv, the Q / DQ nodes between) when ``name`` reaches a Conv's data input
    through at most a QuantizeLinear -> DequantizeLinear pair or one DequantizeLinear, each the only reader."""
    between: list[onnx.NodeProto] = []
    node = index.single_consumer(name)
    reader = node
    while node is not None and node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(between) < 2 \
            and node.input[0] == name and is_default_domain(node):
        between.append(node)
        name = node.output[0]
        node = index.single_consumer(name)
    if node is None or reader is None or node.op_type != "Conv" or not is_default_domain(node) \
            or node.input[0] != name:
        return None
    if [n.op_type for n in between] not in ([], ["QuantizeLinear", "DequantizeLinear"], ["DequantizeLinear"]):
        return None
    return reader, node, between

def _value_problem(index: GraphIndex, value: object, between: list[onnx.NodeProto]) -> str | None:
    """Why the padded elements would not reach the Conv as exact zeros, or None."""
    pad_value = np.asarray(0 if value is None else value).reshape(-1)
    if pad_value.size != 1:
        return "its pad value is not a scalar"
    if between and between[0].op_type == "DequantizeLinear":
        params = quant_params(index, between[0])
        if params is None:
            return "its DequantizeLinear's scale or zero point is not constant"
        if not np.all(params.zero_point.astype(np.int64) == int(pad_value[0])):
            return (f"it pads the quantized tensor with {pad_value[0]}, not the zero point "
                    f"{params.zero_point.reshape(-1)[:4].tolist()}: the pad does not dequantize to 0")
        return None
    if between and quant_params(index, between[0]) is None:
        return "its QuantizeLinear's scale or zero point is not constant"
    if float(pad_value[0]) != 0.0:
        return f"it pads with {float(pad_value[0])}, not 0"
    return None


class FoldPadIntoConv(Rule):
    """Pad (constant zeros, spatial axes) -> [Q -> DQ | DQ] -> Conv becomes [Q -> DQ | DQ] -> Conv(pads c + p)."""

    op = "Pad"
    name = "folded into conv pads"
    emits = ("QuantizeLinear", "DequantizeLinear", "Conv")

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        """The match for ``node``, or why not; None when no Conv reads it (not a candidate)."""
        index, pad = view.index, node
        chain = _chain_to_conv(index, pad.output[0])
        if chain is None:
            return None
        reader, conv, between = chain
        pads, value, why = _pad_parts(index, pad, view.opset)
        if why is None:
            assert pads is not None
            spatial, why = _spatial_pads(pads)
        if why is None:
            why = _value_problem(index, value, between)
        if why is None:
            geometry = conv_geometry(index, conv)
            if not geometry.resolved:
                why = f"{conv.name}'s auto_pad needs a static input shape"
            elif len(spatial) != 2 * geometry.rank:  # type: ignore[arg-type]
                why = f"its rank does not match {conv.name}'s"
        if why is not None:
            return why
        conv_pads = [c + p for c, p in zip(geometry.pads, spatial)]  # type: ignore[arg-type]
        rank = geometry.rank
        if view.options.symmetric_pads and any(conv_pads[a] != conv_pads[a + rank] for a in range(rank)):
            return (f"{conv.name} would pad asymmetrically {conv_pads}, which the target refuses "
                    "(symmetric_pads)")
        form = "+".join(n.op_type for n in between) or "float"
        requantize = _requantizes(index, pad.input[0], between)
        return Match((pad, *between, conv), conv=conv, between=[] if requantize else between, conv_pads=conv_pads,
                     form=form)

    def build(self, match: Match, out: Emit) -> None:
        # The Q / DQ between stay (reading the Pad's input), unless they only requantized (then they go); the
        # Conv keeps its name with the summed pads, explicit.
        source = match.anchor.input[0]
        for node in match.between:
            source = out.like(node, inputs=[source, *node.input[1:]])
        conv = match.conv
        explicit = {} if (get_attr(conv, "auto_pad", "NOTSET") or "NOTSET") == "NOTSET" else {"auto_pad": "NOTSET"}
        out.like(conv, inputs=[source, *conv.input[1:]], pads=match.conv_pads, **explicit)

    def record(self, match: Match, ops: list[str]) -> dict:
        return {"node": match.conv.name, "op": "Conv", "old": list(get_attr(match.conv, "pads") or []) or None,
                "new": match.conv_pads, "detail": {"pad": match.anchor.name, "form": match.form}}


class FoldPadConvPass(RulePass):
    """Constant zero Pad -> Conv becomes one Conv with the sum of the pads (float and QDQ forms; exact)."""

    name = "fold-pad-conv"
    summary = "fold a constant zero Pad on the spatial axes into the following Conv's pads (fold_pad_into_conv)"
    exact = True
    forms = (Form("fold_pad_into_conv", ("Pad", "Conv"), "whether a constant zero Pad before a Conv is folded into "
                  "the Conv's pads", cost=10,
                  facts=(Fact("Pad", "a Pad with constant pads before Conv {} (compilers fuse it into the Conv's pads; "
                              "rknn-toolkit2 2.5.0 crashes doing so; fold-pad-conv folds it first)",
                              _constant_pad_before_conv),)),)
    rules = (FoldPadIntoConv(),)

    def applies(self, options: FixOptions) -> bool:
        return options.fold_pad_into_conv
