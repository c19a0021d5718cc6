"""Op facts and Conv geometry, in one place: the passes and the constraint checks read them from here.

A Conv weight is [M, C/group, k...], a ConvTranspose weight [C, M/group, k...] (C input, M output channels).
An NPU runs a plain or depthwise conv on C and M, a grouped conv (1 < group < C) as ``group`` convs on the
per-group counts, so those are the counts that must be aligned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import onnx

# The default ONNX domain has two spellings; every "is this a standard op" test goes through is_default_domain.
DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})

# Ops that hold subgraphs (GraphProto attributes); If / Loop / Scan are ONNX's control flow, SequenceMap maps one.
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
SUBGRAPH_OPS = CONTROL_FLOW_OPS | {"SequenceMap"}

# Nodes that produce new data on every run (never constants, never folded).
RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})


def is_default_domain(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is an op of the default ONNX domain (``""`` or its other name ``"ai.onnx"``)."""
    return node.domain in DEFAULT_DOMAINS


# Every ONNX floating-point element type, and the ones numpy computes in (bfloat16 has no numpy type).
FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                         onnx.TensorProto.BFLOAT16})
NUMPY_FLOAT_TYPES: dict[int, type] = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.DOUBLE: np.float64,
}

# Ops whose output channel count their weights choose, not the graph input that feeds them.
WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "Gemm", "MatMul", "MatMulInteger",
                          "QLinearMatMul", "Einsum", "LSTM", "GRU", "RNN", "Attention"})


def conv_channels(op_type: str, weight_shape: Sequence[int], group: int) -> tuple[int, int]:
    """(input channels C, output channels M) of a Conv-like node from its weight shape."""
    if op_type == "ConvTranspose":
        return weight_shape[0], weight_shape[1] * group
    return weight_shape[1] * group, weight_shape[0]


def conv_aligned(align: int, group: int, c_in: int, c_out: int) -> bool:
    """Whether the channel counts the NPU sees are multiples of ``align`` (depthwise: C; grouped: per group)."""
    if group == 1 or group == c_in:
        return c_in % align == 0 and c_out % align == 0
    return (c_in // group) % align == 0 and (c_out // group) % align == 0


def channels_follow_inputs(nodes: Iterable[onnx.NodeProto], graph_inputs: Iterable[str],
                           is_const: Callable[[str], bool]) -> set[str]:
    """Tensors whose channel count the graph inputs fix: reached from one without passing a weighted op (every
    data input of the node is such a tensor). ``nodes`` in topological order."""
    fixed = set(graph_inputs)
    for node in nodes:
        if node.op_type in WEIGHTED_OPS:
            continue
        reads_data = False
        for i in node.input:  # a plain loop that stops at the first data input no graph input fixes
            if i and not is_const(i):
                if i not in fixed:
                    break
                reads_data = True
        else:
            if reads_data:
                fixed.update(o for o in node.output if o)
    return fixed


HALF_PIXEL_COORDS = frozenset({"half_pixel", "pytorch_half_pixel"})


def resize_factor_problem(in_shape: Sequence[int], out_shape: Sequence[int], mode: str, coord: str,
                          factors: Sequence[int] | None, half_pixel_linear: Sequence[int] | None) -> str | None:
    """Why a 4-D [N, C, H, W] Resize breaks a target's factor rule (FixOptions.resize_factors /
    linear_half_pixel_factors; Vela's RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR checks), or None when it keeps it.

    Kept: a 1x1 input, an unchanged size, or H and W scaled by one factor out of ``factors`` — out / in, or
    (out - 1) / (in - 1) with align_corners; a linear Resize with half-pixel coordinates only at a factor out of
    ``half_pixel_linear``. A mode other than nearest / linear breaks it (no such NPU resize)."""
    if len(in_shape) != 4 or len(out_shape) != 4:
        return None
    (ih, iw), (oh, ow) = in_shape[2:], out_shape[2:]
    if (ih == 1 and iw == 1) or (ih, iw) == (oh, ow):
        return None
    if mode not in ("nearest", "linear", "bilinear"):
        return f"{mode} resize"
    if coord == "align_corners" and ih > 1 and iw > 1:
        fh, fw = (oh - 1) / (ih - 1), (ow - 1) / (iw - 1)
    else:
        fh, fw = oh / ih, ow / iw
    where = f"{coord} {iw}x{ih} -> {ow}x{oh}: factor {fw:.4g} x {fh:.4g}"
    if factors is not None and (fh != fw or fh not in factors):
        return f"{where}, not one of {list(factors)} on both axes"
    if (half_pixel_linear is not None and mode != "nearest" and coord in HALF_PIXEL_COORDS
            and not (oh / ih == ow / iw and oh / ih in half_pixel_linear)):
        return f"{mode} {where}: half-pixel linear only at {list(half_pixel_linear)}"
    return None
