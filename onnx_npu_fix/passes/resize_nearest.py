"""resize-nearest: every Resize / Upsample ends in nearest mode, in one canonical form where that is exact.

Chains (``s`` an integer factor, ``C`` the channel count)::

    canonical   Resize(nearest, any equivalent mode, scales|sizes) -> Resize(X, roi="", scales=[1,1,s,s],
                mode=nearest, coordinate_transformation_mode=asymmetric, nearest_mode=floor)        [exact]
    opset < 10  Upsample(X, scales) -> Resize-10(X, scales), opset 9 -> 10 when provably safe      [exact]
    nearest     Resize(linear|cubic, ctm) -> Resize(nearest, ctm, round_prefer_floor)   [approximate]
    exact       Resize(linear|cubic) -> [Pad(edge)] -> ConvTranspose(group=C, stride s)          [exact]
                Resize(linear|cubic) -> MatMul(A_H, X) -> MatMul(., A_W^T)                        [exact]

**The canonical nearest form** is ``y[i] = x[floor(i / s)]`` per axis (np.repeat), i.e. asymmetric +
floor with constant integer scales; it is what PyTorch's ``nn.Upsample(mode="nearest")`` exports and what
TFLite's RESIZE_NEAREST_NEIGHBOR (no align_corners / half_pixel) computes. With the sampling coordinate
``x(i)`` of each mode and ``i = k*s + r`` (``0 <= r < s``), a nearest Resize is equal to it when

- asymmetric, ``x = i/s = k + r/s``: floor -> k for every s; round_prefer_floor -> k only for s = 2 (r/s is
  0 or exactly 1/2, which rounds down); ceil and round_prefer_ceil differ.
- half_pixel / pytorch_half_pixel / half_pixel_symmetric (the latter with ``out = s*in``, so its offset is 0),
  ``x = (i+0.5)/s - 0.5 = k + (r+0.5)/s - 0.5`` whose fractional part lies strictly inside (-1/2, 1/2): both
  round modes give k for every s (never a tie); floor and ceil differ.
- align_corners, ``x = i(L-1)/(2L-1)`` for s = 2: ``x(2k) = k - k/(2L-1)`` and ``x(2k+1) = k + 1/2 -
  (k+1/2)/(2L-1)``, both within 1/2 of k: both round modes give k. Not for s >= 3.
- every mode except tf_crop_and_resize on an axis with s = 1 (``x = i``) or with one input element.

The rounding margins above are at least ``1/(2s)`` (``1/(2(2L-1))`` for align_corners); float32 keeps them
for output lengths up to 2^20 (align_corners: input lengths up to 1024), the limits this pass applies.
``sizes`` turn into constant ``scales`` when the static shapes give an integer ratio (onnxruntime then uses
``scale = out/in`` exactly). tf_half_pixel_for_nearest and tf_crop_and_resize are never canonicalised
(onnxruntime 1.32 cannot run the former; the latter reads ``roi`` and extrapolates).

**Upsample** (opset 7/9) computes ``floor(i/s)`` for nearest and asymmetric linear, exactly like Resize-10.
Resize needs opset >= 10, so the default-domain opset goes 9 -> 10 (ir_version >= 5) only when every other
default-domain node keeps its schema (same ``since_version`` at both opsets) or is MaxPool / AveragePool,
whose opset-10 versions only add attributes (ceil_mode, dilations) whose defaults keep the old result.
Otherwise the Upsample stays (its linear mode still becomes nearest) and a non-blocking Rejection names the
blocking ops.

**Nearest mode (default, approximate).** A linear / cubic Resize keeps its coordinate mode and takes
``nearest_mode=round_prefer_floor``: each output copies the input element nearest to the point the original
would have interpolated at. Measured against floor / ceil / the canonical form on N(0,1) and smooth inputs it
is the closest or tied in every mode (relative L2 for x2: 0.79 on N(0,1), 0.12 on a smooth field); for
half_pixel / pytorch_half_pixel (every s) and asymmetric / align_corners with s = 2 it *is* the canonical form
above, so that is what is written. When every sampling point of the original is an integer coordinate
(scale 1, half_pixel downsampling by an odd factor, asymmetric downsampling by an integer factor) linear and
cubic weights are (1, 0, ...) and the conversion is exact; the run reports it so. "Integer" is decided on the
coordinates evaluated in float32 step by step, as onnxruntime computes them.

**Its bound** (``ResizeNearestPass.bound``, checked by the fuzz test on every node it approximates). Along one
resized axis the original computes ``y = M x`` (``M`` the interpolation matrix of exact mode below) and the
nearest form ``y'[i] = x[n(i)]``, ``n(i)`` the clamped nearest index of the sampling point (rounding half down;
floor before opset 11). With ``D`` the largest difference between neighbouring elements of ``x`` along the axis,
``|x[j] - x[n]| <= |j - n| D``, so ``|y[i] - y'[i]| <= sum_j |M_ij| |j - n(i)| D <= C D`` with ``C = max_i
sum_j |M_ij| |j - n(i)|``: ``min(t, 1 - t) <= 1/2`` for linear, up to 1 with floor, more for cubic (its negative
taps count). The axes are resized one after another, and ``M_1 M_2 - N_1 N_2 = M_1 (M_2 - N_2) + (M_1 - N_1) N_2``
(``N`` the nearest selections, which keep neighbouring differences), so over the resized axes ``max |y - y'| <=
sum_a S_1 .. S_(a-1) C_a D_a`` with ``S = max_i sum_j |M_ij|`` (1 for linear). The bound is in units of the input's
local variation: on white noise ``D`` is several times the input's spread and the deviation is large (the relative
L2 above); on a smooth field both are small.

**Exact mode.** Resize is linear in X and separable: along one axis ``y = M x`` with ``M`` the
``[L_out, L_in]`` interpolation matrix (linear: weights ``1-t, t`` at ``floor(x), floor(x)+1`` with indices
clamped to the edge; cubic: Keys weights with ``cubic_coeff_a``, ``exclude_outside`` renormalising). The pass
builds ``M`` in float64 from the spec formulas (checked against onnxruntime for every mode in the tests) and

1. when every sampling point is an integer coordinate: nearest, exact;
2. when ``M`` is a transposed convolution of the edge-padded input for stride ``s`` on every resized spatial
   axis: Pad(edge) -> depthwise ConvTranspose. The kernel is read from one interior column of ``M`` and the
   whole ``M`` is then rebuilt from it and compared, so the form is used only where it is exact. This gives
   half_pixel / pytorch_half_pixel x2: edge pad 1, kernel [1,3,3,1]/4, pads 3; asymmetric x2: edge pad (0, 1),
   kernel [1,2,1]/2, pads (1, 2); align_corners with ``out = 2N-1``: kernel [1,2,1]/2, pads 1 — and the same
   for any integer factor and for cubic (edge pad 2) where it holds. When a stride exceeds
   ``max_convtranspose_stride`` (tpu-mlir aborts from stride 9) the ConvTranspose is split into stages with
   smaller strides, exactly: stride s with kernel W is ``Y(z) = W(z) X(z^s)``, and stages s1 (kernel a) then s2
   (kernel b) give ``B(z) A(z^s2)``, so a and b with ``W(z) = B(z) A(z^s2)`` are found by polynomial division
   (:func:`conv_transpose_stages`; x8 -> x4 x2, x16 -> x8 x2, x9 -> x3 x3); only the last stage crops. A prime
   stride above the limit has no stages: MatMul below. With ``allow_convtranspose`` off, MatMul is used instead;
3. else, when only the last two axes are resized: ``MatMul(A_H, X)`` then ``MatMul(., A_W^T)`` with the
   constant matrices (align_corners with ``out = 2N``, non-integer factors, downsampling, ConvTranspose
   forbidden), if each matrix has at most 2^22 elements;
4. else nearest as in nearest mode, with a warning and the node listed as approximate.

``forbidden_ops`` is respected (no ConvTranspose / Pad / MatMul emitted when listed). antialias=1 with
downsampling, tf_crop_and_resize and float16 / integer tensors have no exact form here.

**Downsampling and non-integer scales.** Nearest ones are left alone (no canonical form; non-blocking
Rejection). Linear / cubic ones become nearest like any other (or take an exact form in exact mode: MatMul)
since the target rejects them otherwise; the deviation check of the pass manager decides whether that is
acceptable. Nearest downsampling aliases: half_pixel x1/2 on N(0,1) inputs moves the output by a relative L2
of 1.7 (sqrt(3): one pixel of four instead of their mean), 0.24 on a smooth field.

``PassResult.metrics``: ``exact`` (True when every rewrite of this run is exact, so the pass manager may
validate it at the exact tolerance), ``approximate_nodes`` (names), ``opset`` (when bumped), ``forms``
(count per action). Every Resize / Upsample left non-nearest (only inside subgraphs or in a foreign domain)
gets a Rejection, blocking when ``options.require_nearest_resize``. With ``require_nearest_resize`` off (a
target that runs linear / cubic Resizes) those are kept as they are, with a non-blocking Rejection: do no harm —
unless the target's factor rule (``resize_factors`` / ``linear_half_pixel_factors``, ethos-u55: Vela keeps
half-pixel linear only at x2, nearest at x2/x4/x8) refuses the linear form and keeps the nearest one; then it is
rewritten as above (LR-ASPP's x8 linear Resize -> nearest moves it from Vela's CPU to its NPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import defs, helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import (
    GraphEditor,
    GraphIndex,
    get_attr,
    may_hold_subgraphs,
    opset_version,
    set_attr,
    subgraphs,
)
from onnx_npu_fix.ir.ops import is_default_domain, resize_factor_problem
from onnx_npu_fix.ir.qdq import (
    dequantizer_of,
    power_of_two_int8,
    quantize_new_weights,
    wrap_inserted,
    wrap_moves,
)
from onnx_npu_fix.ir.weights import tensor_value
from onnx_npu_fix.passes.base import Bound, Change, Fact, Fixes, Form, Found, Pass, PassResult, Plan, Rejection

_RESIZE_OPS = ("Resize", "Upsample")

# Coordinate modes whose interpolation matrix this pass can build (spec formulas, checked against ORT).
_MATRIX_COORDS = ("half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners", "half_pixel_symmetric")
# Nearest combinations equal to floor(i/s) for an integer factor s (module docstring): coordinate mode ->
# {nearest_mode: largest s for which the claim holds (None: every s)}.
_CANONICAL_EQUIV: dict[str, dict[str, int | None]] = {
    "asymmetric": {"floor": None, "round_prefer_floor": 2},
    "half_pixel": {"round_prefer_floor": None, "round_prefer_ceil": None},
    "pytorch_half_pixel": {"round_prefer_floor": None, "round_prefer_ceil": None},
    "half_pixel_symmetric": {"round_prefer_floor": None, "round_prefer_ceil": None},
    "align_corners": {"round_prefer_floor": 2, "round_prefer_ceil": 2},
}
_MAX_ROUNDING_LENGTH = 1 << 20  # float32 keeps the rounding margins of the equivalences up to here
_MAX_ALIGN_CORNERS_INPUT = 1024  # align_corners s=2: margin 1/(2(2L-1)) against float32 error ~L*6e-8
_MAX_MATMUL_ELEMENTS = 1 << 22  # a constant interpolation matrix above 16 MB (float32) is not worth it
_EDGE_PADS = ((0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (2, 0), (1, 2), (2, 1), (2, 2))
_WEIGHT_EPS = 1e-12
_MATCH_ATOL = 1e-9
_BUMP_TARGET = 10
# Ops whose opset-10 schema differs from the opset 7-9 one only by new attributes whose defaults reproduce
# the old behaviour (MaxPool-10: ceil_mode=0, dilations=1; AveragePool-10: ceil_mode=0).
_BUMP_COMPATIBLE = ("MaxPool", "AveragePool")
# Exact forms only where float rounding stays inside the exact tolerance: in float16 the MatMul form differs
# from onnxruntime's Resize by ~1 ulp (2e-3 relative), which no exact check accepts.
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)  # the exact forms' margins are shown for these


# --- interpolation matrices (float64, the spec's formulas) ------------------------------------------


def sampling_coordinates(coord_mode: str, l_in: int, l_out: int, scale: float) -> np.ndarray:
    """Input coordinate each output index of one axis samples at (before clamping), as onnxruntime
    computes it; ``scale`` is the float32 scale onnxruntime uses (the given one, or out/in from sizes)."""
    i = np.arange(l_out, dtype=np.float64)
    if coord_mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if coord_mode == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if l_out > 1 else np.zeros(l_out)
    if coord_mode == "asymmetric":
        return i / scale
    if coord_mode == "align_corners":
        return i * (l_in - 1) / (l_out - 1) if l_out > 1 else np.zeros(l_out)
    if coord_mode == "half_pixel_symmetric":
        adjustment = l_out / (scale * l_in)
        offset = l_in / 2 * (1 - adjustment)
        return offset + (i + 0.5) / scale - 0.5
    raise ValueError(f"no sampling formula for coordinate_transformation_mode {coord_mode!r}")


def _float32_coordinates(coord_mode: str, l_in: int, l_out: int, scale: float) -> np.ndarray:
    """:func:`sampling_coordinates` evaluated in float32 operation by operation, as onnxruntime does: whether
    a sampling point lands exactly on an integer (weights exactly (1, 0, ...)) is decided by this rounding."""
    i = np.arange(l_out, dtype=np.float32)
    s = np.float32(scale)
    half = np.float32(0.5)
    if coord_mode in ("half_pixel", "pytorch_half_pixel"):
        if coord_mode == "pytorch_half_pixel" and l_out <= 1:
            return np.zeros(l_out, dtype=np.float32)
        return (i + half) / s - half
    if coord_mode == "asymmetric":
        return i / s
    if coord_mode == "align_corners":
        if l_out <= 1:
            return np.zeros(l_out, dtype=np.float32)
        return i * np.float32(l_in - 1) / np.float32(l_out - 1)
    if coord_mode == "half_pixel_symmetric":
        adjustment = np.float32(l_out) / (s * np.float32(l_in))
        offset = np.float32(l_in) / np.float32(2) * (np.float32(1) - adjustment)
        return offset + (i + half) / s - half
    raise ValueError(f"no sampling formula for coordinate_transformation_mode {coord_mode!r}")


def _cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic weights of the taps at floor(x)-1 .. floor(x)+2 for fractional parts ``t``."""
    d = np.abs(np.stack([t + 1, t, 1 - t, 2 - t], axis=-1))
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def interpolation_triplets(kind: str, coord_mode: str, l_in: int, l_out: int, scale: float, *,
                           cubic_a: float = -0.75, exclude_outside: int = 0
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 1-D interpolation matrix ``M`` (``y = M x``) as (rows, cols, weights), duplicates merged."""
    x = sampling_coordinates(coord_mode, l_in, l_out, scale)
    rows = np.arange(l_out)
    if kind == "linear":
        # Clamping x or clamping the two indices gives the same value; onnxruntime clamps x.
        x = np.clip(x, 0, l_in - 1)
        x0 = np.floor(x)
        t = x - x0
        base = x0.astype(np.int64)
        cols = np.stack([base, base + 1], axis=1)
        weights = np.stack([1 - t, t], axis=1)
    elif kind == "cubic":
        x0 = np.floor(x)
        t = x - x0
        cols = x0.astype(np.int64)[:, None] + np.arange(-1, 3)[None, :]
        weights = _cubic_weights(t, cubic_a)
        if exclude_outside:
            weights = np.where((cols >= 0) & (cols < l_in), weights, 0.0)
            weights = weights / weights.sum(axis=1, keepdims=True)
    else:
        raise ValueError(f"no interpolation matrix for mode {kind!r}")
    cols = np.clip(cols, 0, l_in - 1)
    r = np.repeat(rows, cols.shape[1])
    return _merge(r, cols.ravel(), weights.ravel(), l_in)


def _merge(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, l_in: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = rows.astype(np.int64) * l_in + cols.astype(np.int64)
    uniq, inverse = np.unique(keys, return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=vals, minlength=len(uniq))
    keep = np.abs(sums) > _WEIGHT_EPS
    uniq, sums = uniq[keep], sums[keep]
    return uniq // l_in, uniq % l_in, sums


def _same_matrix(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> bool:
    return (len(a[0]) == len(b[0]) and np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
            and bool(np.allclose(a[2], b[2], rtol=0, atol=_MATCH_ATOL)))


def dense_matrix(triplets: tuple[np.ndarray, np.ndarray, np.ndarray], l_out: int, l_in: int) -> np.ndarray:
    m = np.zeros((l_out, l_in))
    m[triplets[0], triplets[1]] = triplets[2]
    return m


@dataclass
class AxisConvTranspose:
    """One axis of a ConvTranspose form: edge pad (begin, end), kernel, stride, ConvTranspose pads."""

    kernel: np.ndarray
    stride: int
    pads: tuple[int, int]
    edge: tuple[int, int]


def conv_transpose_form(triplets: tuple[np.ndarray, np.ndarray, np.ndarray], l_in: int, l_out: int,
                        stride: int) -> AxisConvTranspose | None:
    """The Pad(edge) -> ConvTranspose(stride) equal to ``M`` on this axis, or None.

    ``y[i] = sum_k P[k] w[i + pb - stride*k]`` with ``P[k] = x[clamp(k - eb)]``. The kernel is read from the
    column of ``M`` at the middle input (away from both borders), ``pb`` puts its first tap at that column's
    first row; the matrix rebuilt from (w, pb, edge pads) must equal ``M`` entry for entry.
    """
    rows, cols, vals = triplets
    if l_in < 3 or stride < 1:
        return None
    c0 = l_in // 2
    sel = cols == c0
    if not sel.any():
        return None
    r, v = rows[sel], vals[sel]
    lo = int(r.min())
    kernel = np.zeros(int(r.max()) - lo + 1)
    kernel[r - lo] = v
    k_len = len(kernel)
    for eb, ee in _EDGE_PADS:
        pb = stride * (c0 + eb) - lo
        lp = l_in + eb + ee
        pe = (lp - 1) * stride + k_len - pb - l_out
        if pb < 0 or pe < 0:
            continue
        k = np.arange(lp)
        out_idx = stride * k[:, None] + np.arange(k_len)[None, :] - pb
        src = np.broadcast_to(np.clip(k - eb, 0, l_in - 1)[:, None], out_idx.shape)
        w = np.broadcast_to(kernel[None, :], out_idx.shape)
        inside = (out_idx >= 0) & (out_idx < l_out)
        rebuilt = _merge(out_idx[inside], src[inside], w[inside], l_in)
        if _same_matrix(rebuilt, triplets):
            return AxisConvTranspose(kernel=kernel, stride=stride, pads=(pb, pe), edge=(eb, ee))
    return None


def _deconvolve(w: np.ndarray, d: np.ndarray) -> np.ndarray | None:
    """b with ``convolve(b, d) == w`` (polynomial division without remainder), or None when none exists."""
    n = len(w) - len(d) + 1
    if n < 1 or d[0] == 0:
        return None
    rest = np.array(w, dtype=np.float64)
    b = np.zeros(n)
    for i in range(n):
        b[i] = rest[i] / d[0]
        rest[i:i + len(d)] -= b[i] * d
    scale = max(float(np.abs(w).max()), 1e-300)
    if float(np.abs(rest).max()) > 1e-12 * scale or not np.allclose(np.convolve(b, d), w, rtol=0, atol=1e-12 * scale):
        return None
    return b


def _stage_kernels(stride: int) -> list[np.ndarray]:
    """First-stage kernels tried for a stride: the triangle (linear interpolation) and the box (nearest)."""
    box = np.ones(stride) / stride
    return [np.convolve(box, box) * stride, box * stride, np.array([1.0])]


def conv_transpose_stages(kernel: np.ndarray, stride: int, max_stride: int) -> list[tuple[np.ndarray, int]] | None:
    """ConvTranspose(stride s, kernel w) as stages (a, s1), (b, s2), ... each with a stride <= ``max_stride``.

    A ConvTranspose with stride s computes ``Y(z) = W(z) X(z^s)`` (z-transforms along the axis); two in a row,
    stride s1 with kernel a then s2 with kernel b, compute ``B(z) A(z^s2) X(z^(s1 s2))``. So stages exist when
    ``W(z) = B(z) A(z^s2)`` with s = s1*s2: b is W divided by a upsampled by s2, kept when the division
    leaves no remainder (checked in float64). The interpolation kernels of linear / cubic resizes factor this
    way (the half_pixel x8 triangle [1,3,...,15,15,...,1]/16 = (1+z) Box8(z)^2 / 16, Box8(z) = Box4(z)(1+z^4)).
    The stages' output before the last stage's pads is the full one-stage output; the caller puts the
    original crop pads on the last stage. Returns None when no factorisation is found."""
    if stride <= max_stride:
        return [(np.asarray(kernel, dtype=np.float64), stride)]
    for s1 in range(min(max_stride, stride - 1), 1, -1):
        if stride % s1:
            continue
        s2 = stride // s1
        for a in _stage_kernels(s1):
            up = np.zeros((len(a) - 1) * s2 + 1)
            up[::s2] = a
            b = _deconvolve(np.asarray(kernel, dtype=np.float64), up)
            if b is None:
                continue
            rest = conv_transpose_stages(b, s2, max_stride)
            if rest is not None:
                return [(a, s1), *rest]
    return None


# --- reading a node -------------------------------------------------------------------------------


@dataclass
class _Site:
    node: onnx.NodeProto
    opset: int
    mode: str
    coord: str
    nearest_mode: str
    cubic_a: float = -0.75
    exclude_outside: int = 0
    antialias: int = 0
    rank: int | None = None
    in_shape: tuple[int, ...] | None = None
    out_shape: tuple[int, ...] | None = None
    scales: np.ndarray | None = None
    """Full-rank scales when given as a constant."""
    sizes_given: bool = False
    """The node resizes by ``sizes`` (constant or not); ``out_shape`` then gives the sizes when static."""
    unknown: str | None = None
    """Why the per-axis factors are not known statically (None when they are)."""
    factors: list[float] = field(default_factory=list)
    """Per-axis float32 scale onnxruntime uses for the coordinates (when known)."""
    elem_type: int = onnx.TensorProto.UNDEFINED

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def known(self) -> bool:
        return self.unknown is None and self.in_shape is not None and self.out_shape is not None

    def resized_axes(self) -> list[int]:
        assert self.in_shape is not None and self.out_shape is not None
        return [a for a in range(len(self.in_shape))
                if self.in_shape[a] != self.out_shape[a] or self.factors[a] != 1.0]

    def integer_factors(self) -> list[int] | None:
        """Per-axis integer factors when every axis has ``out = s*in`` and uses scale exactly s."""
        if not self.known:
            return None
        assert self.in_shape is not None and self.out_shape is not None
        out: list[int] = []
        for l_in, l_out, f in zip(self.in_shape, self.out_shape, self.factors):
            if l_in <= 0 or l_out % l_in or f != l_out // l_in:
                return None
            out.append(l_out // l_in)
        return out

    def matrix(self, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        assert self.in_shape is not None and self.out_shape is not None
        return interpolation_triplets(self.mode, self.coord, self.in_shape[axis], self.out_shape[axis],
                                      self.factors[axis], cubic_a=self.cubic_a,
                                      exclude_outside=self.exclude_outside)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode}
        if self.opset >= 11 and self.node.op_type == "Resize":
            out["coordinate_transformation_mode"] = self.coord
            if self.mode == "nearest":
                out["nearest_mode"] = self.nearest_mode
        if self.scales is not None:
            out["scales"] = [float(s) for s in self.scales]
        elif self.sizes_given:
            out["sizes"] = list(self.out_shape) if self.out_shape is not None else "dynamic"
        return out


def _read_site(index: GraphIndex, node: onnx.NodeProto, opset: int) -> _Site:
    """Everything the pass needs about one Resize / Upsample, with the opset's defaults filled in."""
    legacy = node.op_type == "Upsample" or opset < 11
    site = _Site(
        node=node, opset=opset, mode=str(get_attr(node, "mode", "nearest")),
        # Upsample and Resize-10 sample at i/s and take floor for nearest (their only behaviour).
        coord="asymmetric" if legacy else str(get_attr(node, "coordinate_transformation_mode", "half_pixel")),
        nearest_mode="floor" if legacy else str(get_attr(node, "nearest_mode", "round_prefer_floor")),
        cubic_a=float(get_attr(node, "cubic_coeff_a", -0.75)),
        exclude_outside=int(get_attr(node, "exclude_outside", 0)),
        antialias=int(get_attr(node, "antialias", 0)),
        elem_type=index.elem_type(node.input[0]),
    )
    x_shape = index.shape(node.input[0])
    site.in_shape = index.static_shape(node.input[0])
    site.out_shape = index.static_shape(node.output[0])
    if x_shape is not None:
        site.rank = len(x_shape)
    axes = get_attr(node, "axes")
    scales_value = _read_scales(index, node, opset, site, axes)
    if scales_value is not None:
        if axes is not None:
            if site.rank is None:
                site.unknown = "rank unknown for the axes attribute"
            else:
                full = np.ones(site.rank, dtype=np.float32)
                full[[a % site.rank for a in axes]] = scales_value
                scales_value = full
        site.scales = scales_value
        site.rank = len(scales_value)
    if site.unknown is None:
        _derive_factors(site)
    return site


def _read_scales(index: GraphIndex, node: onnx.NodeProto, opset: int, site: _Site,
                 axes: list[int] | None) -> np.ndarray | None:
    """The node's constant scales (float32, as given: per axis of ``axes`` when set), or None — then the output
    sizes go to ``site.out_shape`` when they are constant, or ``site.unknown`` says why nothing is known."""
    scales_value: np.ndarray | None = None
    scales_name = sizes_name = ""
    if node.op_type == "Upsample" and opset < 9:
        attr = get_attr(node, "scales")
        scales_value = None if attr is None else np.asarray(attr, dtype=np.float32)
    elif node.op_type == "Upsample" or opset == 10:
        scales_name = node.input[1] if len(node.input) > 1 else ""
    else:
        scales_name = node.input[2] if len(node.input) > 2 else ""
        sizes_name = node.input[3] if len(node.input) > 3 else ""
    if scales_name:
        scales_value = index.const_value(scales_name)
        if scales_value is None:
            site.unknown = f"scales '{scales_name}' is computed at run time"
        elif scales_value.size == 0:
            scales_value = None  # Resize-11/12 pass an empty scales when sizes are given
        else:
            scales_value = scales_value.astype(np.float32).ravel()
    if scales_value is None and site.unknown is None:
        if sizes_name:
            _read_sizes(index, node, site, sizes_name, axes)
        else:
            site.unknown = "neither scales nor sizes is given"
    return scales_value


def _read_sizes(index: GraphIndex, node: onnx.NodeProto, site: _Site, sizes_name: str,
                axes: list[int] | None) -> None:
    """A node that resizes by ``sizes``: the output shape they give when it is not on record."""
    site.sizes_given = True
    policy = get_attr(node, "keep_aspect_ratio_policy", "stretch")
    sizes = index.const_value(sizes_name)
    if policy != "stretch":
        site.unknown = f"keep_aspect_ratio_policy={policy} derives the scale from the sizes"
    elif site.out_shape is None and sizes is not None and site.in_shape is not None:
        full_sizes = list(site.in_shape)
        for a, n in zip(axes if axes is not None else range(len(full_sizes)), sizes.ravel()):
            full_sizes[a % len(full_sizes)] = int(n)
        site.out_shape = tuple(full_sizes)


def _derive_factors(site: _Site) -> None:
    """The per-axis factors (and the output shape the scales give), or ``site.unknown`` saying why not."""
    if site.in_shape is None:
        site.unknown = "input shape is not static"
    elif site.scales is not None:
        site.factors = [float(s) for s in site.scales]
        if site.out_shape is None:
            # Same as onnxruntime: floor(in * scale) in float32.
            site.out_shape = tuple(int(np.float32(s) * np.float32(n)) for s, n in zip(site.scales,
                                                                                      site.in_shape))
    elif site.out_shape is None:
        site.unknown = "output shape is not static"
    else:
        site.factors = [float(np.float32(o) / np.float32(i)) if i else 1.0
                        for o, i in zip(site.out_shape, site.in_shape)]
    if site.unknown is None and site.in_shape is not None and site.out_shape is not None and (
            len(site.in_shape) != len(site.out_shape) or len(site.factors) != len(site.in_shape)):
        site.unknown = "rank of scales/sizes does not match the input"


def _equals_canonical(site: _Site, coord: str, nearest_mode: str) -> list[int] | None:
    """The integer factors when nearest with (coord, nearest_mode) on this site equals floor(i/s)."""
    factors = site.integer_factors()
    if factors is None:
        return None
    assert site.in_shape is not None and site.out_shape is not None
    allowed = _CANONICAL_EQUIV.get(coord, {})
    for s, l_in, l_out in zip(factors, site.in_shape, site.out_shape):
        if s == 1 or l_in == 1:
            if coord in _MATRIX_COORDS:
                continue
            return None
        if nearest_mode not in allowed or l_out > _MAX_ROUNDING_LENGTH:
            return None
        limit = allowed[nearest_mode]
        if limit is not None and s > limit:
            return None
        if coord == "align_corners" and l_in > _MAX_ALIGN_CORNERS_INPUT:
            return None
    return factors


def _integer_sampling(site: _Site) -> bool:
    """True when every output samples the original at an integer coordinate (linear/cubic == nearest)."""
    if not site.known or site.coord not in _MATRIX_COORDS:
        return False
    assert site.in_shape is not None and site.out_shape is not None
    for a, (l_in, l_out) in enumerate(zip(site.in_shape, site.out_shape)):
        if site.antialias and l_out < l_in:
            return False
        x = np.clip(_float32_coordinates(site.coord, l_in, l_out, site.factors[a]), 0, l_in - 1)
        if not np.array_equal(x, np.floor(x)):
            return False
    return True


# --- plans ------------------------------------------------------------------------------------------


@dataclass
class _Form:
    """What one Resize / Upsample becomes."""

    site: _Site
    action: str
    """canonical | nearest | conv-transpose | matmul"""
    exact: bool
    coord: str = "asymmetric"
    nearest_mode: str = "floor"
    factors: list[int] | None = None
    axis_forms: dict[int, AxisConvTranspose] = field(default_factory=dict)
    stages: list[dict[int, tuple[np.ndarray, int]]] = field(default_factory=list)
    """ConvTranspose stages (per stage: axis -> (kernel, stride)) when one stride exceeds the target's limit."""
    matrices: dict[int, np.ndarray] = field(default_factory=dict)
    note: str = ""


@dataclass
class ResizePlan(Plan):
    """One Resize / Upsample rewritten to ``form``. It holds the index of the model
    :meth:`ResizeNearestPass.find` planned on: the site's node is that model's, and the rewrite edits it through
    that index (a second index would cost a full walk of the graph)."""

    index: GraphIndex
    form: _Form


@dataclass
class OpsetBumpPlan(Plan):
    """Raise the default-domain opset ``old`` -> ``new`` so that ``upsamples`` Upsample nodes become Resize
    (applied before the ResizePlans, which are planned at the new opset). ``nodes`` is empty: the model's."""

    old: int
    new: int
    upsamples: int


def _non_nearest(index: GraphIndex, node: onnx.NodeProto, options: FixOptions) -> str | None:
    mode = get_attr(node, "mode", "nearest") or "nearest"
    return None if mode == "nearest" else mode


def _convtranspose_stride(index: GraphIndex, node: onnx.NodeProto, options: FixOptions) -> int | None:
    stride = max(get_attr(node, "strides", None) or [1])
    return stride if stride > 1 else None


def _stride_limits(current: int | None, region: Sequence[onnx.NodeProto]) -> list[int]:
    """``max_convtranspose_stride`` values worth trying: half of each ConvTranspose stride s in the region (the
    exact form then splits it into stages), largest first, below the current limit; then half the current limit."""
    strides = {max(get_attr(n, "strides", None) or [1]) for n in region if n.op_type == "ConvTranspose"}
    below = [s // 2 for s in sorted(strides, reverse=True) if s > 1 and (current is None or s // 2 < current)]
    halved = [current // 2] if current is not None and current > 1 else []
    return list(dict.fromkeys([*below, *halved]))

def nearest_deviation_limit(index: GraphIndex, node: onnx.NodeProto, x: np.ndarray) -> float | None:
    """The limit of :attr:`ResizeNearestPass.bound` for ``node`` (a linear / cubic Resize or Upsample of the model
    ``index`` reads) on input ``x``: ``sum_a S_1 .. S_(a-1) C_a D_a(x)`` over the resized axes (module docstring).
    None when the node's factors are not static or no interpolation matrix describes it here."""
    site = _read_site(index, node, opset_version(index.model))
    mode = "linear" if site.mode == "bilinear" else site.mode
    if not site.known or mode not in ("linear", "cubic") or site.coord not in _MATRIX_COORDS:
        return None
    assert site.in_shape is not None and site.out_shape is not None
    if site.antialias and any(o < i for o, i in zip(site.out_shape, site.in_shape)):
        return None
    site.mode = mode
    limit, spread = 0.0, 1.0
    for axis in site.resized_axes():
        rows, cols, weights = site.matrix(axis)
        l_in, l_out = site.in_shape[axis], site.out_shape[axis]
        coords = _float32_coordinates(site.coord, l_in, l_out, site.factors[axis])
        picked = np.floor(coords) if site.opset < 11 else np.ceil(coords - np.float32(0.5))
        nearest = np.clip(picked, 0, l_in - 1).astype(np.int64)
        step = float(np.abs(np.diff(x, axis=axis)).max()) if x.shape[axis] > 1 else 0.0
        away = np.bincount(rows, np.abs(weights) * np.abs(cols - nearest[rows]), minlength=l_out).max()
        limit += spread * float(away) * step
        spread *= float(np.bincount(rows, np.abs(weights), minlength=l_out).max())
    return limit


class ResizeNearestPass(Pass):
    """Linear / cubic Resize -> nearest (or exact ConvTranspose / MatMul forms); nearest -> canonical form.

    ``find`` is read-only: one :class:`ResizePlan` per Resize / Upsample it rewrites (its form: nearest,
    canonical, exact ConvTranspose / MatMul) and an :class:`OpsetBumpPlan` when the opset is raised, a rejection
    for every one it keeps; ``rewrite`` applies them."""

    name = "resize-nearest"
    summary = "every Resize/Upsample nearest: linear/cubic -> nearest (or exact forms), one canonical form"
    exact = False
    bound = Bound("max |y' - y| <= sum over the resized axes a of S_1 .. S_(a-1) C_a D_a, D_a the input's largest "
                  "neighbouring step along a (linear: half of it per axis; the module docstring)",
                  nearest_deviation_limit)
    fixes = (Fixes("resize-mode"),
             Fixes("resize-factor", note="when the nearest form keeps the rule (a half-pixel linear x8 on ethos-u55)"))
    forms = (
        Form("resize_mode", ("Resize", "ConvTranspose", "MatMul", "Reshape", "Transpose", "Pad", "Slice"),
             "a non-nearest Resize's form: nearest (approximate) or the exact ConvTranspose / MatMul forms", cost=75,
             facts=(Fact("Resize", "a {} Resize (resize-nearest: nearest approximates it, exact keeps it exact where "
                         "an exact form exists)", _non_nearest),)),
        Form("resize_separable", ("ConvTranspose", "Pad", "Slice"), "whether an exact ConvTranspose form of a 2-D "
             "Resize runs as one stage per axis with 1-D kernels", cost=64),
        Form("allow_convtranspose", ("ConvTranspose", "MatMul", "Reshape", "Transpose", "Pad", "Slice"),
             "whether the exact forms may use ConvTranspose (else the MatMul form)", cost=70),
        Form("max_convtranspose_stride", ("ConvTranspose",), "the largest ConvTranspose stride of an exact form: "
             "larger factors are split into stages", cost=62, values=_stride_limits,
             facts=(Fact("ConvTranspose", "ConvTranspose stride {} (exact Resize forms split larger strides into "
                         "stages)", _convtranspose_stride),)),
    )

    def may_change(self, model: onnx.ModelProto, options: FixOptions) -> bool:
        return any(node.op_type in _RESIZE_OPS for node in model.graph.node)

    def find(self, model: onnx.ModelProto, options: FixOptions) -> Found:
        result = PassResult()  # collects the rejections and warnings of finding
        candidates = self._candidates(model, options, result)
        if not candidates:
            return Found(rejections=result.rejections, warnings=result.warnings)
        index = GraphIndex(model)
        opset = opset_version(model)
        upsamples = [n for n in candidates if n.op_type == "Upsample" and is_default_domain(n)]
        bump_blockers = _bump_blockers(model, opset) if upsamples and opset < _BUMP_TARGET else []
        bump_allowed = bool(upsamples) and opset < _BUMP_TARGET and not bump_blockers
        forms = self._forms(index, candidates, _BUMP_TARGET if bump_allowed else opset, options, result)
        # The bump is only worth it when some Upsample becomes a Resize (not when exact forms replace them all).
        to_resize = [f.site.node for f in forms if f.site.node.op_type == "Upsample"
                     and f.action in ("canonical", "nearest")]
        bump = bump_allowed and bool(to_resize)
        if bump_allowed and not bump:
            for form in forms:
                form.site.opset = opset
        if opset < _BUMP_TARGET and not bump and bump_blockers:
            replaced = {id(f.site.node) for f in forms if f.action in ("conv-transpose", "matmul")}
            result.rejections.extend(Rejection(
                node.name, "Upsample", f"kept as Upsample: Resize needs opset {_BUMP_TARGET} and raising opset "
                f"{opset} is not provably safe ({'; '.join(bump_blockers)})")
                for node in upsamples if id(node) not in replaced)
        plans: list[Plan] = [OpsetBumpPlan((), "opset-bump", opset, _BUMP_TARGET, len(to_resize))] if bump else []
        plans += [ResizePlan((f.site.node.name,), f.action, index, f) for f in forms]
        return Found(plans, result.rejections, warnings=result.warnings)

    def rewrite(self, model: onnx.ModelProto, options: FixOptions, found: Found) -> PassResult:
        result = found.report()
        approximate: list[str] = []
        counts: dict[str, int] = {}
        result.metrics.update({"exact": True, "approximate_nodes": approximate, "forms": counts})
        editor: GraphEditor | None = None
        for plan in found.plans:
            if isinstance(plan, OpsetBumpPlan):
                _bump_opset(model, plan, result)
                continue
            assert isinstance(plan, ResizePlan)
            form = plan.form
            if editor is None:
                editor = GraphEditor(plan.index)
            if form.action in ("conv-transpose", "matmul") and dequantizer_of(plan.index, form.site.node.input[0]):
                # Interpolation weights k/16 on a quantization grid land on exact half steps: the exact form's
                # other summation order rounds those ties the other way (measured, not exact within k steps).
                result.quantized_tolerance = True
            result.changes.append(self._rewrite(form, editor))
            counts[form.action] = counts.get(form.action, 0) + 1
            if not form.exact:
                approximate.append(form.site.name)
        if editor is not None:
            editor.commit()
        result.metrics["exact"] = not approximate
        return result

    def _candidates(self, model: onnx.ModelProto, options: FixOptions, result: PassResult) -> list[onnx.NodeProto]:
        """The Resize / Upsample nodes of the main graph; those inside subgraphs get a rejection. One cheap scan:
        most graphs hold no Resize at all, and the index costs a full pass over them."""
        candidates: list[onnx.NodeProto] = []
        for node in model.graph.node:
            if node.op_type in _RESIZE_OPS:
                candidates.append(node)
            if not may_hold_subgraphs(node):
                continue  # no graph attribute possible: skip the attribute walk (100k nodes)
            if any(attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for attr in node.attribute):
                self._reject_in_subgraphs(node, options, result)
        return candidates

    def _forms(self, index: GraphIndex, candidates: list[onnx.NodeProto], target_opset: int, options: FixOptions,
               result: PassResult) -> list[_Form]:
        """What each candidate becomes at ``target_opset``; a rejection for each one left as it is."""
        forbidden = set(options.forbidden_ops)
        opset = opset_version(index.model)
        forms: list[_Form] = []
        for node in candidates:
            if not is_default_domain(node):
                if str(get_attr(node, "mode", "nearest")) != "nearest":
                    result.rejections.append(Rejection(
                        node.name, node.op_type, f"domain '{node.domain}' is not the ONNX one; not rewritten",
                        blocking=options.require_nearest_resize))
                continue
            site = _read_site(index, node, opset)
            site.opset = target_opset
            form = self._plan(site, options, forbidden, result)
            if form is not None and options.resize_separable:
                _make_separable(form, options.max_convtranspose_stride)
            problem = _qdq_weights_problem(index, form) if form is not None else ""
            if problem and form is not None and _make_separable(form, options.max_convtranspose_stride):
                problem = _qdq_weights_problem(index, form)
            if problem:
                result.rejections.append(Rejection(node.name, node.op_type, problem,
                                                   blocking=options.require_nearest_resize))
            elif form is not None:
                forms.append(form)
        return forms

    # --- planning ---------------------------------------------------------------------------------------

    def _plan(self, site: _Site, options: FixOptions, forbidden: set[str],
              result: PassResult) -> _Form | None:
        node = site.node
        as_upsample = node.op_type == "Upsample" and site.opset < _BUMP_TARGET
        if site.mode == "nearest":
            return self._plan_nearest(site, result, as_upsample)
        if site.mode not in ("linear", "cubic", "bilinear"):
            result.rejections.append(Rejection(node.name, node.op_type, f"unknown mode '{site.mode}'",
                                               blocking=options.require_nearest_resize))
            return None
        if not options.require_nearest_resize:
            refused = _factor_rule(site, options, site.mode)
            if refused is None or _factor_rule(site, options, "nearest") is not None:
                # Do no harm: the target runs linear / cubic Resizes as they are (bm1684x, Rockchip: rel L2 0.18 on
                # DeepLabV3+ for nothing), or its factor rule refuses the nearest form as well (ethos-u55: an
                # align_corners x4.05 stays on the CPU either way), so no replacement is wanted.
                reason = (f"{site.mode} kept: the target accepts it (require_nearest_resize = false)"
                          if refused is None else f"{site.mode} kept: {refused}, and the nearest form too")
                result.rejections.append(Rejection(node.name, node.op_type, reason, blocking=refused is not None))
                return None
        if site.mode == "bilinear":  # pre-opset-7 spelling of linear
            site.mode = "linear"
        if options.resize_mode == "exact":
            exact_plan, why = self._plan_exact(site, forbidden, options)
            if exact_plan is not None:
                return exact_plan
        plan = self._plan_approximate(site)
        if options.resize_mode == "exact":
            plan.note = f"no exact form: {why}"
            result.warnings.append(f"{node.name}: no exact form for {site.mode} {node.op_type} ({why}); "
                                   f"converted to nearest (approximate)")
        return plan

    def _plan_nearest(self, site: _Site, result: PassResult, as_upsample: bool) -> _Form | None:
        node = site.node
        if as_upsample:
            return None  # Upsample nearest is already floor(i/s); only the opset bump could change it
        factors = _equals_canonical(site, site.coord, site.nearest_mode)
        if factors is None:
            if node.op_type == "Upsample":  # opset >= 10: Upsample is deprecated, write the same as Resize
                return _Form(site, "nearest", exact=True, coord=site.coord, nearest_mode=site.nearest_mode,
                             note="Upsample -> Resize")
            if site.opset >= 11:
                reason = f"nearest Resize kept as is: {self._why_not_canonical(site)}"
                result.rejections.append(Rejection(node.name, node.op_type, reason))
            return None
        if site.opset == 10 and node.op_type == "Resize":
            return None  # Resize-10 has no attributes to normalise
        if (node.op_type == "Resize" and site.coord == "asymmetric" and site.nearest_mode == "floor"
                and site.scales is not None and get_attr(node, "axes") is None):
            return None  # already canonical
        return _Form(site, "canonical", exact=True, factors=factors)

    def _why_not_canonical(self, site: _Site) -> str:
        if not site.known:
            return f"factors unknown ({site.unknown})"
        assert site.in_shape is not None and site.out_shape is not None
        for a, (l_in, l_out, f) in enumerate(zip(site.in_shape, site.out_shape, site.factors)):
            if l_out < l_in:
                return f"downsampling on axis {a} ({l_in} -> {l_out}) has no integer-factor form"
            if l_in and (l_out % l_in or f != l_out // l_in):
                return f"non-integer factor on axis {a} ({l_in} -> {l_out}, scale {f:g})"
        return (f"coordinate_transformation_mode={site.coord} with nearest_mode={site.nearest_mode} is "
                f"not floor(i/s) for these factors")

    def _plan_approximate(self, site: _Site) -> _Form:
        """Linear / cubic -> nearest at the sampling point's nearest input (module docstring)."""
        coord = site.coord
        # Before opset 11 nearest has no rounding attribute: floor(i/s) is the only nearest there is.
        nearest_mode = "floor" if site.opset < 11 else "round_prefer_floor"
        exact = _integer_sampling(site)
        reason = "sampling points are integers" if exact else self._approx_reason(site)
        factors = _equals_canonical(site, coord, nearest_mode) if site.opset >= 11 else None
        if factors is not None:
            return _Form(site, "nearest", exact=exact, factors=factors, note=reason)
        return _Form(site, "nearest", exact=exact, coord=coord, nearest_mode=nearest_mode, note=reason)

    def _approx_reason(self, site: _Site) -> str:
        if not site.known:
            return f"factors unknown: {site.unknown}"
        if site.coord not in _MATRIX_COORDS:
            return f"coordinate_transformation_mode={site.coord}"
        if site.antialias and any(o < i for o, i in zip(site.out_shape or (), site.in_shape or ())):
            return "antialias downsampling"
        return f"samples between input elements (factors {[round(f, 6) for f in site.factors]})"

    def _plan_exact(self, site: _Site, forbidden: set[str], options: FixOptions | None = None
                    ) -> tuple[_Form | None, str]:
        """The exact form for a linear / cubic site, or None and why there is none."""
        if _integer_sampling(site):
            plan = self._plan_approximate(site)
            plan.note = "sampling points are integers"
            return plan, ""
        if not site.known:
            return None, f"factors unknown: {site.unknown}"
        if site.coord not in _MATRIX_COORDS:
            return None, f"coordinate_transformation_mode={site.coord}"
        if site.elem_type not in _FLOAT_TYPES:
            return None, f"element type {onnx.TensorProto.DataType.Name(site.elem_type)}"
        assert site.in_shape is not None and site.out_shape is not None
        if site.antialias and any(o < i for o, i in zip(site.out_shape, site.in_shape)):
            return None, "antialias downsampling"
        resized = site.resized_axes()
        matrices = {a: site.matrix(a) for a in resized}
        rank = len(site.in_shape)
        why: list[str] = []
        form = self._plan_conv_transpose(site, matrices, forbidden, options, why)
        if form is not None:
            return form, ""
        if "MatMul" in forbidden:
            why.append("MatMul is forbidden")
        elif any(a < rank - 2 for a in resized):
            why.append(f"MatMul covers only the last two axes, not {resized}")
        elif any(site.in_shape[a] * site.out_shape[a] > _MAX_MATMUL_ELEMENTS for a in resized):
            why.append(f"an interpolation matrix would exceed {_MAX_MATMUL_ELEMENTS} elements")
        else:
            dense = {a: dense_matrix(matrices[a], site.out_shape[a], site.in_shape[a]) for a in resized}
            return _Form(site, "matmul", exact=True, matrices=dense, note="constant interpolation matrices"), ""
        return None, "; ".join(why)

    def _plan_conv_transpose(self, site: _Site, matrices: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]],
                             forbidden: set[str], options: FixOptions | None, why: list[str]) -> _Form | None:
        """The depthwise ConvTranspose form of a linear / cubic site, or None with the reason added to ``why``."""
        assert site.in_shape is not None
        resized = list(matrices)
        max_stride = options.max_convtranspose_stride if options is not None else None
        if "ConvTranspose" in forbidden:
            why.append("ConvTranspose is forbidden")
            return None
        if options is not None and not options.allow_convtranspose:
            why.append("the target runs ConvTranspose on its CPU (allow_convtranspose = false)")
            return None
        if len(site.in_shape) < 3 or any(a < 2 for a in resized):
            why.append(f"axes {resized} are not all spatial")
            return None
        forms: dict[int, AxisConvTranspose] = {}
        for a in resized:
            form = self._conv_transpose_axis(site, a, matrices[a])
            if form is None:
                why.append(f"axis {a} is not a transposed convolution")
                return None
            forms[a] = form
        stages = _split_stages(forms, max_stride)
        if "Pad" in forbidden and any(f.edge != (0, 0) for f in forms.values()):
            why.append("the ConvTranspose form needs Pad, which is forbidden")
            return None
        if stages is None:
            why.append(f"stride {max(f.stride for f in forms.values())} exceeds max_convtranspose_stride "
                       f"{max_stride} and the kernel does not factor into stages")
            return None
        note = "depthwise ConvTranspose" + (
            f" in {len(stages)} stages (strides "
            f"{' x '.join(str(max(st for _, st in stage.values())) for stage in stages)}, "
            f"max_convtranspose_stride {max_stride})" if len(stages) > 1 else "")
        return _Form(site, "conv-transpose", exact=True, axis_forms=forms, stages=stages, note=note)

    @staticmethod
    def _conv_transpose_axis(site: _Site, axis: int, triplets: tuple[np.ndarray, ...]
                             ) -> AxisConvTranspose | None:
        assert site.in_shape is not None and site.out_shape is not None
        l_in, l_out = site.in_shape[axis], site.out_shape[axis]
        strides = set()
        if l_in and l_out % l_in == 0:
            strides.add(l_out // l_in)
        if l_in > 1 and (l_out - 1) % (l_in - 1) == 0:
            strides.add((l_out - 1) // (l_in - 1))
        for stride in sorted(strides):
            form = conv_transpose_form(triplets, l_in, l_out, stride)  # type: ignore[arg-type]
            if form is not None:
                return form
        return None

    def _reject_in_subgraphs(self, node: onnx.NodeProto, options: FixOptions, result: PassResult) -> None:
        for g in subgraphs(node):
            for sub in g.node:
                if sub.op_type in _RESIZE_OPS and str(get_attr(sub, "mode", "nearest")) != "nearest":
                    result.rejections.append(Rejection(
                        sub.name or sub.output[0], sub.op_type,
                        f"inside a subgraph of '{node.name}'; subgraphs are not rewritten",
                        blocking=options.require_nearest_resize))
                self._reject_in_subgraphs(sub, options, result)

    # --- rewriting ----------------------------------------------------------------------------------------

    def _rewrite(self, plan: _Form, editor: GraphEditor) -> Change:
        site = plan.site
        node = site.node
        old = site.describe()
        detail: dict[str, Any] = {"exact": plan.exact}
        if plan.note:
            detail["why"] = plan.note
        if plan.action in ("canonical", "nearest"):
            new_node = (self._canonical_node(plan, editor) if plan.factors is not None
                        else self._nearest_node(plan, editor))
            editor.replace(node, [new_node])
            new = _describe_node(new_node, plan)
            action = "canonicalise" if plan.action == "canonical" else f"{site.mode}->nearest"
            if node.op_type != new_node.op_type:
                action = (f"{node.op_type}->{new_node.op_type}" if action == "nearest->nearest"
                          else f"{node.op_type}->{new_node.op_type} ({action})")
            return Change(node.name, node.op_type, action, old=old, new=new, detail=detail)
        if plan.action == "conv-transpose":
            nodes = _replace_quantized(editor, node, self._conv_transpose_nodes(plan, editor))
            new = {"ops": [n.op_type for n in nodes], "nodes": [n.name for n in nodes],
                   "axes": {a: {"kernel": [round(float(w), 6) for w in f.kernel], "stride": f.stride,
                                "pads": list(f.pads), "edge_pad": list(f.edge)}
                            for a, f in plan.axis_forms.items()}}
            if len(plan.stages) > 1:
                new["stages"] = [{a: st for a, (_, st) in stage.items()} for stage in plan.stages]
            return Change(node.name, node.op_type, f"{site.mode}->conv-transpose", old=old, new=new,
                          detail=detail)
        nodes = _replace_quantized(editor, node, self._matmul_nodes(plan, editor))
        new = {"ops": [n.op_type for n in nodes], "nodes": [n.name for n in nodes],
               "matrices": {a: list(m.shape) for a, m in plan.matrices.items()}}
        return Change(node.name, node.op_type, f"{site.mode}->matmul", old=old, new=new, detail=detail)

    def _roi_input(self, site: _Site, editor: GraphEditor) -> list[str]:
        """The roi slot for the site's opset: none before 11, "" from 13, an empty tensor at 11/12."""
        if site.opset < 11:
            return []
        if site.opset >= 13:
            return [""]
        node = site.node
        if node.op_type == "Resize" and len(node.input) > 1 and node.input[1]:
            return [node.input[1]]  # roi is ignored outside tf_crop_and_resize
        return [editor.add_initializer(f"{node.name}_roi", np.zeros(0, dtype=np.float32))]

    def _canonical_node(self, plan: _Form, editor: GraphEditor) -> onnx.NodeProto:
        site = plan.site
        node = site.node
        assert plan.factors is not None and site.opset >= 10  # before 10 only Upsample exists; never planned
        scales = editor.add_initializer(f"{node.name}_scales", np.asarray(plan.factors, dtype=np.float32))
        inputs = [node.input[0], *self._roi_input(site, editor), scales]
        attrs: dict[str, Any] = {"mode": "nearest"}
        if site.opset >= 11:
            attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        return helper.make_node("Resize", inputs, list(node.output), name=node.name, **attrs)

    def _nearest_node(self, plan: _Form, editor: GraphEditor) -> onnx.NodeProto:
        """Same inputs, nearest mode with the plan's coordinate / rounding mode."""
        site = plan.site
        node = site.node
        if node.op_type == "Upsample" and site.opset < _BUMP_TARGET:
            new = onnx.NodeProto()
            new.CopyFrom(node)
            set_attr(new, "mode", "nearest")
            return new
        if node.op_type == "Upsample":  # -> Resize at this opset (10 after a bump, or a deprecated Upsample)
            if len(node.input) > 1 and node.input[1]:
                scales = node.input[1]
            else:
                scales = editor.add_initializer(f"{node.name}_scales",
                                                np.asarray(get_attr(node, "scales"), dtype=np.float32))
            inputs = [node.input[0], *self._roi_input(site, editor), scales]
            attrs: dict[str, Any] = {"mode": "nearest"}
            if site.opset >= 11:
                attrs.update(coordinate_transformation_mode=plan.coord, nearest_mode=plan.nearest_mode)
            return helper.make_node("Resize", inputs, list(node.output), name=node.name, **attrs)
        new = onnx.NodeProto()
        new.CopyFrom(node)
        set_attr(new, "mode", "nearest")
        if site.opset >= 11:
            set_attr(new, "coordinate_transformation_mode", plan.coord)
            set_attr(new, "nearest_mode", plan.nearest_mode)
            # Interpolation-only attributes mean nothing to nearest; drop them so no reader is confused.
            for attr in ("cubic_coeff_a", "exclude_outside", "antialias"):
                set_attr(new, attr, None)
        return new

    def _conv_transpose_nodes(self, plan: _Form, editor: GraphEditor) -> list[onnx.NodeProto]:
        site = plan.site
        node = site.node
        assert site.in_shape is not None
        rank = len(site.in_shape)
        channels = site.in_shape[1]
        dtype = helper.tensor_dtype_to_np_dtype(site.elem_type)
        spatial = list(range(2, rank))
        unit = AxisConvTranspose(kernel=np.ones(1), stride=1, pads=(0, 0), edge=(0, 0))
        per_axis = [plan.axis_forms.get(a, unit) for a in spatial]
        kernel = per_axis[0].kernel
        for f in per_axis[1:]:
            kernel = np.multiply.outer(kernel, f.kernel)
        weight = np.broadcast_to(kernel, (channels, 1, *kernel.shape)).astype(dtype)
        nodes: list[onnx.NodeProto] = []
        source = node.input[0]
        if any(f.edge != (0, 0) for f in per_axis):
            pads = [0, 0] + [f.edge[0] for f in per_axis] + [0, 0] + [f.edge[1] for f in per_axis]
            padded = editor.index.unique_name(f"{node.name}_edge_padded")
            if site.opset >= 11:
                pads_name = editor.add_initializer(f"{node.name}_edge_pads", np.asarray(pads, dtype=np.int64))
                nodes.append(editor.make_node("Pad", [source, pads_name], [padded], f"{node.name}_edge_pad",
                                              mode="edge"))
            else:
                nodes.append(editor.make_node("Pad", [source], [padded], f"{node.name}_edge_pad",
                                              mode="edge", pads=pads))
            source = padded
        if len(plan.stages) <= 1:
            w_name = editor.add_initializer(f"{node.name}_interp_kernel", np.ascontiguousarray(weight))
            nodes.append(editor.make_node(
                "ConvTranspose", [source, w_name], list(node.output), f"{node.name}_interp",
                group=channels, kernel_shape=[len(f.kernel) for f in per_axis],
                strides=[f.stride for f in per_axis],
                pads=[f.pads[0] for f in per_axis] + [f.pads[1] for f in per_axis]))
            return nodes
        nodes.extend(self._conv_transpose_stage_nodes(plan, editor, source, spatial, channels, dtype))
        return nodes

    @staticmethod
    def _conv_transpose_stage_nodes(plan: _Form, editor: GraphEditor, source: str, spatial: list[int],
                                    channels: int, dtype: Any) -> list[onnx.NodeProto]:
        """One depthwise ConvTranspose per stage; only the last one crops (the one-stage form's pads)."""
        node = plan.site.node
        unit = (np.ones(1), 1)
        pads_begin = [plan.axis_forms[a].pads[0] if a in plan.axis_forms else 0 for a in spatial]
        pads_end = [plan.axis_forms[a].pads[1] if a in plan.axis_forms else 0 for a in spatial]
        nodes: list[onnx.NodeProto] = []
        for i, stage in enumerate(plan.stages):
            per_axis = [stage.get(a, unit) for a in spatial]
            kernel = per_axis[0][0]
            for k, _ in per_axis[1:]:
                kernel = np.multiply.outer(kernel, k)
            weight = np.broadcast_to(kernel, (channels, 1, *kernel.shape)).astype(dtype)
            last = i == len(plan.stages) - 1
            out = node.output[0] if last else editor.index.unique_name(f"{node.name}_interp_stage{i}")
            w_name = editor.add_initializer(f"{node.name}_interp_kernel{i}", np.ascontiguousarray(weight))
            pads = pads_begin + pads_end if last else [0] * (2 * len(spatial))
            nodes.append(editor.make_node(
                "ConvTranspose", [source, w_name], [out], f"{node.name}_interp_stage{i}", group=channels,
                kernel_shape=[len(k) for k, _ in per_axis], strides=[st for _, st in per_axis], pads=pads))
            source = out
        return nodes

    def _matmul_nodes(self, plan: _Form, editor: GraphEditor) -> list[onnx.NodeProto]:
        site = plan.site
        node = site.node
        assert site.in_shape is not None and site.out_shape is not None
        rank = len(site.in_shape)
        dtype = helper.tensor_dtype_to_np_dtype(site.elem_type)
        order = sorted(plan.matrices)
        if len(order) == 2:
            # Resize the axis that shrinks the tensor most first: fewer multiply-adds in the second MatMul.
            h, w = order
            h_in, h_out = site.in_shape[h], site.out_shape[h]
            w_in, w_out = site.in_shape[w], site.out_shape[w]
            if h_in * w_in * w_out + h_out * h_in * w_out < h_out * h_in * w_in + h_out * w_in * w_out:
                order = [w, h]
        nodes: list[onnx.NodeProto] = []
        source = node.input[0]
        for i, axis in enumerate(order):
            matrix = plan.matrices[axis]
            last = i == len(order) - 1
            out = node.output[0] if last else editor.index.unique_name(f"{node.name}_interp_rows")
            # y = M x along one axis: the last axis multiplies from the right by M^T, the one before from
            # the left by M (MatMul broadcasts a 2-D left operand over the leading axes).
            if axis == rank - 1:
                m_name = editor.add_initializer(f"{node.name}_interp_w", matrix.T.astype(dtype))
                inputs = [source, m_name]
            else:
                m_name = editor.add_initializer(f"{node.name}_interp_h", matrix.astype(dtype))
                inputs = [m_name, source]
            nodes.append(editor.make_node("MatMul", inputs, [out], f"{node.name}_interp_axis{axis}"))
            source = out
        return nodes


def _replace_quantized(editor: GraphEditor, node: onnx.NodeProto, nodes: list[onnx.NodeProto]
                       ) -> list[onnx.NodeProto]:
    """Replace ``node`` by an exact form's ``nodes``; on a quantized input the data moves (Pad, ...) stay on the
    integer tensor (moves -> Q -> DQ) and the new weights become int8 with a 2^-p scale. The nodes written."""
    nodes = wrap_moves(editor.index, editor, node.input[0], nodes)
    if dequantizer_of(editor.index, node.input[0]):
        nodes = _requantize_stages(editor, node, nodes)
        nodes = [*quantize_new_weights(editor.index, editor, nodes), *nodes]
    editor.replace(node, nodes)
    return nodes


def _requantize_stages(editor: GraphEditor, node: onnx.NodeProto, nodes: list[onnx.NodeProto]
                       ) -> list[onnx.NodeProto]:
    """Between the ConvTranspose stages of a form on a quantized input, a Q -> DQ on the input's own grid, so
    that every stage is a DQ -> ConvTranspose -> Q unit and no float tensor runs between them (an integer compiler
    has nowhere to keep one). Not exact: a stage's outputs are k/16 between grid points and round to the grid
    (half a step at most, carried to the output by weights that sum to 1; the pass declares quantized_tolerance
    and is measured). Only for kernels without negative taps (linear): their outputs stay within the input's
    range, so the grid's saturation never clips them; a cubic stage keeps its float tensor."""
    found = dequantizer_of(editor.index, node.input[0])
    stages = [n for n in nodes if n.op_type == "ConvTranspose"]
    if found is None or found[1].per_channel or len(stages) < 2:
        return nodes
    inner = {id(stage) for stage in stages[:-1]}
    out: list[onnx.NodeProto] = []
    for n in nodes:
        weight = editor.pending_initializer(n.input[1]) if id(n) in inner else None
        if weight is not None and (tensor_value(weight) >= 0).all():
            out.extend(wrap_inserted(editor.index, editor, [n], found[1]))
        else:
            out.append(n)
    return out


def _split_stages(forms: dict[int, AxisConvTranspose], max_stride: int | None
                  ) -> list[dict[int, tuple[np.ndarray, int]]] | None:
    """Per-stage kernels and strides of every axis when some stride exceeds ``max_stride`` ([] when none
    does: one ConvTranspose); axes with fewer stages get unit stages. None when an axis cannot be split."""
    if max_stride is None or all(f.stride <= max_stride for f in forms.values()):
        return []
    per_axis: dict[int, list[tuple[np.ndarray, int]]] = {}
    for axis, form in forms.items():
        stages = conv_transpose_stages(form.kernel, form.stride, max_stride)
        if stages is None:
            return None
        per_axis[axis] = stages
    count = max(len(st) for st in per_axis.values())
    unit = (np.ones(1), 1)
    # An axis with fewer stages runs its own ones first and then unit stages (kernel [1], stride 1).
    return [{axis: (st[i] if i < len(st) else unit) for axis, st in per_axis.items()} for i in range(count)]


def _describe_node(node: onnx.NodeProto, plan: _Form) -> dict[str, Any]:
    out: dict[str, Any] = {"op": node.op_type, "mode": "nearest"}
    if node.op_type == "Resize" and plan.site.opset >= 11:
        out["coordinate_transformation_mode"] = get_attr(node, "coordinate_transformation_mode", "half_pixel")
        out["nearest_mode"] = get_attr(node, "nearest_mode", "round_prefer_floor")
    if plan.factors is not None and plan.site.opset >= 10:
        out["scales"] = [float(s) for s in plan.factors]
    return out


def _bump_opset(model: onnx.ModelProto, plan: OpsetBumpPlan, result: PassResult) -> None:
    """Raise the default-domain opset (and the IR version to one that has it), reported as a change."""
    old_ir = model.ir_version
    for imp in model.opset_import:
        if is_default_domain(imp):
            imp.version = plan.new
    model.ir_version = max(model.ir_version, 5)
    result.changes.append(Change(
        "<model>", "opset_import", "opset-bump", old=plan.old, new=plan.new,
        detail={"reason": "Upsample -> Resize needs opset 10; every other default-domain op keeps "
                          "its schema", "ir_version": [old_ir, model.ir_version]}))
    result.warnings.append(f"default-domain opset raised {plan.old} -> {plan.new} to turn "
                           f"{plan.upsamples} Upsample node(s) into Resize")
    result.metrics["opset"] = {"old": plan.old, "new": plan.new}


def _bump_blockers(model: onnx.ModelProto, opset: int) -> list[str]:
    """Why raising the default-domain opset to 10 could change the model (empty: provably safe)."""
    if model.functions:
        return ["the model has local functions"]
    blockers: set[str] = set()
    op_types: set[str] = set()
    for node in model.graph.node:
        if not is_default_domain(node) or node.op_type == "Upsample":
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            blockers.add(f"{node.op_type} has a subgraph")
        op_types.add(node.op_type)
    for op_type in op_types:  # once per op type, not per node
        try:
            old = defs.get_schema(op_type, opset).since_version
            new = defs.get_schema(op_type, _BUMP_TARGET).since_version
        except defs.SchemaError:
            blockers.add(f"{op_type} has no schema at opset {opset} or {_BUMP_TARGET}")
            continue
        if old != new and op_type not in _BUMP_COMPATIBLE:
            blockers.add(f"{op_type} changes schema ({old} -> {new})")
    return sorted(blockers)


def _factor_rule(site: _Site, options: FixOptions, mode: str) -> str | None:
    """Why the target's Resize factor rule (resize_factors, linear_half_pixel_factors) refuses ``site`` in ``mode``
    (None: it keeps it, or the target has no such rule, or the shapes are unknown)."""
    if (options.resize_factors is None and options.linear_half_pixel_factors is None) or site.in_shape is None \
            or site.out_shape is None:
        return None
    return resize_factor_problem(site.in_shape, site.out_shape, mode, site.coord, options.resize_factors,
                                 options.linear_half_pixel_factors)


def _make_separable(plan: _Form, max_stride: int | None) -> bool:
    """Turn a 2-D (or higher) ConvTranspose form into one stage per axis (and per split of that axis's stride
    above ``max_stride``), each stage's kernel 1-D: ``K = k_h (x) k_w`` is separable, so the depthwise
    ConvTranspose with ``K`` equals the one with ``k_h`` along H followed by the one with ``k_w`` along W (each
    output is ``sum_i sum_j k_h[i] k_w[j] x[..]``, summed in another order). Used on a quantized input when
    ``K``'s products leave int8 (half_pixel x8: 225/256) but each 1-D kernel ({1, 3, ..., 15}/16) is exact in
    int8 with a power-of-two scale. False when the form has one resized axis or an axis cannot be staged."""
    if plan.action != "conv-transpose" or len(plan.axis_forms) < 2:
        return False
    stages: list[dict[int, tuple[np.ndarray, int]]] = []
    for axis, form in sorted(plan.axis_forms.items()):
        per_axis = (conv_transpose_stages(form.kernel, form.stride, max_stride) if max_stride is not None
                    else [(form.kernel, form.stride)])
        if per_axis is None:
            return False
        stages += [{axis: stage} for stage in per_axis]
    plan.stages = stages
    plan.note += f"; separable: {len(stages)} ConvTransposes with 1-D kernels (int8-exact weights)"
    return True


def _qdq_weights_problem(index: GraphIndex, plan: _Form) -> str:
    """On a quantized Resize input, an exact form is used only when its weights are exactly int8 with a
    power-of-two scale (qdq.power_of_two_int8), so the rewrite stays QDQ; else the reason ("" when fine)."""
    if plan.action not in ("conv-transpose", "matmul") or not dequantizer_of(index, plan.site.node.input[0]):
        return ""
    if plan.action == "conv-transpose" and len(plan.stages) > 1:
        weights = []  # the kernels the stages write: per stage, the outer product of its axes' kernels
        for stage in plan.stages:
            kernel = np.ones(1)
            for stage_kernel, _ in stage.values():
                kernel = np.multiply.outer(kernel, stage_kernel)
            weights.append(kernel)
    elif plan.action == "conv-transpose":
        kernel = np.ones(1)
        for form in plan.axis_forms.values():
            kernel = np.multiply.outer(kernel, form.kernel)
        weights = [kernel]
    else:
        weights = list(plan.matrices.values())
    if all(power_of_two_int8(w.astype(np.float32)) is not None for w in weights):
        return ""
    return (f"the exact {plan.action} form's weights are not exactly int8 with a power-of-two scale, so on this "
            f"quantized tensor it would leave a float weight in a QDQ model; left as it is (use --resize-mode "
            f"nearest)")
