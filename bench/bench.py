"""npufix benchmark: how long a fix takes against the I/O floor and against onnxsim, at the sizes deployments use.

    python bench/bench.py                  # every model, writes bench/results.md (~15 min on 2 cores)
    python bench/bench.py --quick          # small models, a smoke test in ~10 s (writes nothing)
    python bench/bench.py --only tcn,unet  # some models only
    python bench/bench.py --profile --only chain100k   # also cProfile one npufix run and print the top functions
    python bench/bench.py --rows check     # only the --check row (9,000 nodes; rows: models, sram, check)

This is a script, not a test. It builds its models (numpy + onnx.helper, seeded) into a scratch directory
(``build/bench`` by default, reused by later runs when the size parameters have not changed), then for each model
times, every step in a fresh subprocess and all in the same run, interleaved per repetition:

  (a) the I/O floor: ``onnx.load`` + ``onnx.save`` of the same model (external data kept external);
  (b) ``npufix --no-validate`` with the model's options;
  (c) ``npufix`` with validation (``--validate each`` unless the model says otherwise);
  (d) ``onnxsim`` on the same model (its default command line; "timeout" past ``--onnxsim-timeout``);
  (e) onnxruntime latency (default session options, i.e. ORT_ENABLE_ALL) of the fixed model over the original's.

Every time is the whole process's wall time (interpreter start and imports included, as a CI step pays them);
peak RSS comes from the kernel's rusage of that one child (``os.wait4``), which is started by a small launcher
process so that the benchmark's own memory does not count as the child's. The figures are medians over
``--repeat`` runs (default 5; ``--repeat-huge``, default 1, for the 100k-node and the >2 GB models); CPU time
(user + system, from the same rusage) is reported beside the wall time where a target is stated in both. The report
ends with the speed targets (docs/benchmark.md), each judged met or not met from this run's own ratios
(``--busy-core`` keeps one core busy with a spinning process meanwhile: the condition the c/d target is stated
for).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures"))
from build_fixtures import Builder as FixtureBuilder  # noqa: E402 - the fixtures' builder, extended below

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OPSET = 17
GIB = 1 << 30
MIB = 1 << 20
BUILDER_VERSION = 2  # bump when a builder changes, so cached models in the workdir are rebuilt


# ----------------------------------------------------------------------------------------------------------------
# Model builders
# ----------------------------------------------------------------------------------------------------------------


class Builder(FixtureBuilder):
    """Nodes and initializers with readable unique names; large tensors can go to an external data file."""

    def __init__(self, seed: int, data_path: str | None = None) -> None:
        super().__init__(seed)
        self.data_path = data_path
        self._data = open(data_path, "wb") if data_path else None

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.name(base)
        value = np.ascontiguousarray(value)
        if self._data is not None and value.nbytes >= 1 << 16:
            # Write the bytes straight to the data file (64 KiB aligned, so onnxruntime can map them):
            # a >2 GB model is never held as one protobuf here.
            offset = -self._data.tell() % 65536 + self._data.tell()
            self._data.seek(offset)
            self._data.write(value.tobytes())
            tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(value.dtype),
                                 dims=value.shape, data_location=TensorProto.EXTERNAL)
            for key, val in (("location", os.path.basename(self.data_path)), ("offset", str(offset)),
                             ("length", str(value.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, val
            self.inits.append(tensor)
        else:
            self.inits.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, shape: tuple[int, ...], fan_in: int, gain: float = 1.0) -> np.ndarray:
        w = self.rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(gain / np.sqrt(fan_in))
        return w

    def conv(self, x: str, c_in: int, c_out: int, kernel: tuple[int, ...], base: str, *, group: int = 1,
             dilation: int = 1, pads: list[int] | None = None, bias: bool = True, stride: int = 1,
             weight: np.ndarray | None = None) -> str:
        if weight is None:
            weight = self.weight((c_out, c_in // group, *kernel), c_in // group * int(np.prod(kernel)), 1.4)
        inputs = [x, self.const(f"{base}.weight", weight)]
        if bias:
            inputs.append(self.const(f"{base}.bias", 0.1 * self.rng.standard_normal(c_out, dtype=np.float32)))
        attrs: dict[str, Any] = {"kernel_shape": list(kernel), "group": group}
        if dilation != 1:
            attrs["dilations"] = [dilation] * len(kernel)
        if pads:
            attrs["pads"] = pads
        if stride != 1:
            attrs["strides"] = [stride] * len(kernel)
        return self.node("Conv", inputs, base, **attrs)

    def batchnorm(self, x: str, c: int, base: str, mean: np.ndarray | None = None,
                  var: np.ndarray | None = None, scale: np.ndarray | None = None,
                  shift: np.ndarray | None = None) -> str:
        rng = self.rng
        scale = (1 + 0.2 * rng.standard_normal(c)).astype(np.float32) if scale is None else scale
        shift = (0.2 * rng.standard_normal(c)).astype(np.float32) if shift is None else shift
        mean = (0.3 * rng.standard_normal(c)).astype(np.float32) if mean is None else mean
        var = (0.5 + rng.random(c)).astype(np.float32) if var is None else var
        names = [self.const(f"{base}.{n}", v.astype(np.float32))
                 for n, v in (("gamma", scale), ("beta", shift), ("mean", mean), ("var", var))]
        return self.node("BatchNormalization", [x, *names], base, epsilon=1e-5)

    def save(self, path: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
             graph_name: str) -> None:
        graph = helper.make_graph(self.nodes, graph_name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8,
                                  producer_name="npufix-bench")
        if self._data is not None:
            self._data.close()
            with open(path, "wb") as f:
                f.write(model.SerializeToString())
            onnx.checker.check_model(path)
        else:
            onnx.checker.check_model(model)
            with open(path, "wb") as f:
                f.write(model.SerializeToString())


def _io(name: str, shape: Sequence[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def build_tcn(path: str, *, bottleneck: int, hidden: int, repeats: int, frames: int, seed: int = 11) -> None:
    """ConvTasNet-like separator: encoder conv (kernel 16, stride 8), gLN, bottleneck, ``repeats`` x 8 blocks of
    1x1 conv -> PRelu -> gLN -> depthwise conv (dilation 1..128) -> PRelu -> gLN -> 1x1 conv + residual, then a
    sigmoid mask on the encoder output and a transposed-conv decoder. Channel counts are deliberately not
    multiples of 8, the alignment many NPU compilers require."""
    b = Builder(seed)
    n_filters, kernel = bottleneck, 3
    samples = 8 * (frames - 1) + 16
    enc = b.node("Relu", [b.conv("mix", 1, n_filters, (16,), "encoder", stride=8, bias=False)], "encoder.relu")
    x = b.global_layer_norm(enc, n_filters, "in_norm")
    x = b.conv(x, n_filters, bottleneck, (1,), "bottleneck")
    for r in range(repeats):
        for i in range(8):
            d, p = 2 ** i, f"r{r}b{i}"
            h = b.conv(x, bottleneck, hidden, (1,), f"{p}.in_conv")
            h = b.global_layer_norm(b.prelu(h, hidden, 3, f"{p}.prelu1"), hidden, f"{p}.norm1")
            h = b.conv(h, hidden, hidden, (kernel,), f"{p}.depth_conv", group=hidden, dilation=d, pads=[d, d])
            h = b.global_layer_norm(b.prelu(h, hidden, 3, f"{p}.prelu2"), hidden, f"{p}.norm2")
            h = b.conv(h, hidden, bottleneck, (1,), f"{p}.res_conv", weight=b.weight(
                (bottleneck, hidden, 1), hidden, 0.3))
            x = b.node("Add", [x, h], f"{p}.residual")
    mask = b.node("Sigmoid", [b.conv(b.prelu(x, bottleneck, 3, "mask.prelu"), bottleneck, n_filters, (1,),
                                     "mask.conv")], "mask.sigmoid")
    masked = b.node("Mul", [enc, mask], "masked")
    dec_w = b.const("decoder.weight", b.weight((n_filters, 1, 16), n_filters))
    b.nodes.append(helper.make_node("ConvTranspose", [masked, dec_w], ["separated"], name="decoder",
                                    kernel_shape=[16], strides=[8]))
    b.save(path, [_io("mix", (1, 1, samples))], [_io("separated", (1, 1, samples))], "tcn")


def build_unet(path: str, *, base: int, size: int, seed: int = 12) -> None:
    """U-Net with Conv(3x3, no bias) -> BatchNorm -> Relu twice per level, MaxPool, 4 levels down, bilinear Resize
    x2 up (half_pixel, torch's align_corners=False), Concat skips, a 1x1 head with 2 classes."""
    b = Builder(seed)

    def double(x: str, c_in: int, c_out: int, p: str) -> str:
        for j, ci in enumerate((c_in, c_out)):
            x = b.conv(x, ci, c_out, (3, 3), f"{p}.conv{j}", pads=[1, 1, 1, 1], bias=False)
            x = b.node("Relu", [b.batchnorm(x, c_out, f"{p}.bn{j}")], f"{p}.relu{j}")
        return x

    widths = [base * 2 ** i for i in range(5)]
    skips, x, c = [], "image", 3
    for lvl, w in enumerate(widths[:-1]):
        x = double(x, c, w, f"down{lvl}")
        skips.append((x, w))
        x, c = b.node("MaxPool", [x], f"pool{lvl}", kernel_shape=[2, 2], strides=[2, 2]), w
    x, c = double(x, c, widths[-1], "bottom"), widths[-1]
    roi = b.const("resize.roi", np.array([], dtype=np.float32))
    scales = b.const("resize.scales", np.array([1, 1, 2, 2], dtype=np.float32))
    for lvl in reversed(range(len(widths) - 1)):
        up = b.node("Resize", [x, roi, scales], f"up{lvl}", mode="linear",
                    coordinate_transformation_mode="half_pixel")
        skip, w = skips[lvl]
        x, c = double(b.node("Concat", [up, skip], f"cat{lvl}", axis=1), c + w, w, f"dec{lvl}"), w
    b.conv(x, c, 2, (1, 1), "head")
    b.nodes[-1].output[0] = "logits"
    b.save(path, [_io("image", (1, 3, size, size))], [_io("logits", (1, 2, size, size))], "unet")


def build_unet_qdq(path: str, *, base: int, size: int, seed: int = 12) -> None:
    """The U-Net above, quantized by onnxruntime's ``quantize_static`` in QDQ form (per-channel int8 weights, uint8
    activations, 4 seeded N(0, 1) calibration sets, no ``quant_pre_process``: the BNs stay between DQ and Q)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    float_path = path + ".float.onnx"
    build_unet(float_path, base=base, size=size, seed=seed)
    rng = np.random.default_rng(seed)
    sets = iter([{"image": rng.standard_normal((1, 3, size, size)).astype(np.float32)} for _ in range(4)])

    class Reader(CalibrationDataReader):
        def get_next(self):  # noqa: ANN202 - the quantizer's interface
            return next(sets, None)

    quantize_static(float_path, path, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    os.unlink(float_path)


def build_skip_unet(path: str, *, levels: int, convs: int, base: int, size: int, seed: int = 15) -> None:
    """A ~1k-node U-Net for the SRAM row: per level ``convs`` x (Conv 3x3 -> Relu), the skip taken after the
    first (so it stays live across the rest of the block: the peak is above the largest layer, and only a cut
    lowers it), MaxPool; decoder: nearest x2 Resize, a 1x1 conv to a quarter of the skip's channels, Concat, a
    3x3 conv. 4 levels x 121 convs: 999 nodes."""
    b = Builder(seed)

    def conv(x: str, c_in: int, c_out: int, p: str, k: int = 3) -> str:
        x = b.conv(x, c_in, c_out, (k, k), p, pads=[k // 2] * 4, bias=False)
        return b.node("Relu", [x], f"{p}.relu")

    scales = b.const("up.scales", np.array([1, 1, 2, 2], dtype=np.float32))
    x, c, skips = "image", 1, []
    for lvl in range(levels):
        w = base * 2 ** lvl
        x = conv(x, c, w, f"down{lvl}.conv0")
        skips.append((x, w))
        for j in range(1, convs):
            x = conv(x, w, w, f"down{lvl}.conv{j}")
        x, c = b.node("MaxPool", [x], f"pool{lvl}", kernel_shape=[2, 2], strides=[2, 2]), w
    x = conv(x, c, c, "bottom")
    for lvl in reversed(range(levels)):
        skip, w = skips[lvl]
        up = b.node("Resize", [x, "", scales], f"up{lvl}", mode="nearest")
        small = max(1, w // 4)
        x = conv(b.node("Concat", [conv(up, c, small, f"dec{lvl}.reduce", k=1), skip], f"cat{lvl}", axis=1),
                 small + w, w, f"dec{lvl}.conv")
        c = w
    b.conv(x, c, 1, (1, 1), "head", bias=False)
    b.nodes[-1].output[0] = "mask"
    b.save(path, [_io("image", (1, 1, size, size))], [_io("mask", (1, 1, size, size))], "skip_unet")


def sram_row(workdir: str, quick: bool) -> str:
    """Schedule search and split on the ~1k-node skip U-Net, in-process (library calls, medians of 3), as a
    Markdown table: the exact schedule search (memory.best_schedule), the split plan (split.plan_split), and the
    whole --split use case (api.split_model: plan, build, check each segment, chained onnxruntime validation,
    atomic write)."""
    from onnx_npu_fix import api
    from onnx_npu_fix.analysis.memory import estimate
    from onnx_npu_fix.analysis.schedule import best_schedule, liveness
    from onnx_npu_fix.analysis.split import plan_split
    from onnx_npu_fix.config.options import FixOptions
    from onnx_npu_fix.ir.graph import GraphIndex, format_bytes, infer_shapes

    params = dict(levels=4, convs=12 if quick else 121, base=8, size=64)
    path = os.path.join(workdir, "models", f"skip-unet-{'quick' if quick else 'full'}.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    build_skip_unet(path, **params)
    model = onnx.load(path)
    infer_shapes(model)
    est = estimate(model)
    budget = (est.floor_bytes + est.best_peak) // 2

    def timed(fn: Callable[[], Any], runs: int = 3) -> tuple[float, Any]:
        times, value = [], None
        for _ in range(runs):
            t0 = time.perf_counter()
            value = fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), value

    t_search, found = timed(lambda: best_schedule(liveness(GraphIndex(model), 1)))
    t_plan, plan = timed(lambda: plan_split(GraphIndex(model), budget))
    with tempfile.TemporaryDirectory(prefix="split-", dir=workdir) as scratch:
        dirs = iter(os.path.join(scratch, f"seg{k}") for k in range(3))
        t_split, outcome = timed(lambda: api.split_model(model, next(dirs), FixOptions(sram_bytes=budget)))
    lines = [
        "| model | nodes | peak (best order) | largest layer | search | optimal | states | budget | segments | "
        "crossing | plan | split + validate + write |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| skip U-Net {params} | {len(model.graph.node)} | {format_bytes(found.peak)} | "
        f"{format_bytes(est.floor_bytes)} | {t_search:.3f} s | {found.optimal} | {found.expanded} | "
        f"{format_bytes(budget)} | {len(plan.segments)} | "
        f"{', '.join(format_bytes(b) for b in plan.crossing_bytes)} | {t_plan:.3f} s | {t_split:.2f} s "
        f"(validated: {outcome.validation.passed}) |",
    ]
    return "\n".join(lines)


def build_chain(path: str, *, blocks: int, channels: int = 8, size: int = 4, seed: int = 13) -> None:
    """``blocks`` x (Conv 3x3 -> BatchNormalization -> Relu) on a tiny feature map: 3 nodes and 5 initializers
    per block, the shape of a graph where per-node overhead dominates.

    Each block is made a contraction (BatchNorm's scale / sqrt(var) times a bound on the conv's operator norm is
    at most 0.7), so float rounding does not grow over 30k+ layers: npufix's exact tolerance is then a fair test,
    and activations stay finite. The BatchNorm means are the conv outputs' means on a random input."""
    from numpy.lib.stride_tricks import sliding_window_view

    b = Builder(seed)
    rng = b.rng
    act = rng.standard_normal((channels, size, size)).astype(np.float32)
    x = "input"
    for i in range(blocks):
        w = b.weight((channels, channels, 3, 3), channels * 9, 1.4)
        padded = np.pad(act, ((0, 0), (1, 1), (1, 1)))
        cols = sliding_window_view(padded, (3, 3), axis=(1, 2)).transpose(0, 3, 4, 1, 2).reshape(channels * 9, -1)
        y = (w.reshape(channels, -1) @ cols).reshape(channels, size, size)
        bound = sum(np.linalg.norm(w[:, :, r, s], 2) for r in range(3) for s in range(3))
        gain = (0.7 / bound) * rng.uniform(0.5, 1.0, channels)
        scale = rng.uniform(0.3, 0.6, channels)
        var = ((scale / gain) ** 2 - 1e-5).astype(np.float32)
        mean = y.mean(axis=(1, 2)).astype(np.float32)
        shift = rng.uniform(0.2, 0.5, channels)
        act = np.maximum(gain[:, None, None] * (y - mean[:, None, None]) + shift[:, None, None], 0).astype(np.float32)
        x = b.conv(x, channels, channels, (3, 3), f"l{i}.conv", pads=[1, 1, 1, 1], bias=False, weight=w)
        x = b.batchnorm(x, channels, f"l{i}.bn", mean=mean, var=var, scale=scale.astype(np.float32),
                        shift=shift.astype(np.float32))
        x = b.node("Relu", [x], f"l{i}.relu")
    b.nodes[-1].output[0] = "output"
    shape = (1, channels, size, size)
    b.save(path, [_io("input", shape)], [_io("output", shape)], "chain")


def build_external(path: str, *, layers: int, channels: int, pixels: int = 4, seed: int = 14) -> None:
    """``layers`` x (Conv 1x1 channels->channels -> BatchNormalization -> Relu), weights in ``<name>.data``
    (external data, written tensor by tensor). With 9 x 8192^2 float32 weights the model is 2.4 GB."""
    b = Builder(seed, data_path=path + ".data")
    rng = b.rng
    act = rng.standard_normal((channels, pixels * pixels)).astype(np.float32)
    x = "input"
    for i in range(layers):
        w = b.weight((channels, channels, 1, 1), channels, 1.4)
        y = w[:, :, 0, 0] @ act
        mean, var = y.mean(axis=1), y.var(axis=1) + 1e-3
        scale = rng.uniform(0.5, 1.0, channels).astype(np.float32)
        shift = rng.uniform(0.0, 0.3, channels).astype(np.float32)
        act = np.maximum(scale[:, None] * (y - mean[:, None]) / np.sqrt(var + 1e-5)[:, None] + shift[:, None], 0)
        x = b.conv(x, channels, channels, (1, 1), f"fc{i}", bias=False, weight=w)
        del w
        x = b.node("Relu", [b.batchnorm(x, channels, f"fc{i}.bn", mean=mean, var=var, scale=scale, shift=shift)],
                   f"fc{i}.relu")
    b.nodes[-1].output[0] = "output"
    shape = (1, channels, pixels, pixels)
    b.save(path, [_io("input", shape)], [_io("output", shape)], "external")


def build_residual(path: str, *, blocks: int, channels: int = 20, size: int = 8, seed: int = 16) -> None:
    """``blocks`` x (Conv 3x3 channels->channels -> Relu -> Add of the block's input): 3 nodes per block, and
    channel counts that are not multiples of 8, so ``--check`` finds an alignment violation at every Conv (and
    align-channels has a plan for each). The weights are small (the residual sum stays finite over 3,000 blocks)."""
    b = Builder(seed)
    x = "input"
    for i in range(blocks):
        y = b.conv(x, channels, channels, (3, 3), f"b{i}.conv", pads=[1, 1, 1, 1],
                   weight=b.weight((channels, channels, 3, 3), channels * 9, 1e-3))
        y = b.node("Relu", [y], f"b{i}.relu")
        x = b.node("Add", [x, y], f"b{i}.add")
    b.nodes[-1].output[0] = "output"
    shape = (1, channels, size, size)
    b.save(path, [_io("input", shape)], [_io("output", shape)], "residual")


# ----------------------------------------------------------------------------------------------------------------
# The benchmark cases
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    title: str
    build: Callable[..., None]
    params: dict[str, Any]
    quick_params: dict[str, Any]
    npufix_args: tuple[str, ...] = ()
    validate_args: tuple[str, ...] = ()
    """Extra arguments of run (c); empty means npufix's default policy (--validate each)."""
    huge: bool = False
    """Repeated --repeat-huge times instead of --repeat."""
    latency: bool = True
    note: str = ""


CASES: tuple[Case, ...] = (
    Case("tcn", "TCN (ConvTasNet-like)", build_tcn,
         dict(bottleneck=380, hidden=1370, repeats=3, frames=512),
         dict(bottleneck=20, hidden=36, repeats=1, frames=256),
         npufix_args=("--max-dilation", "4", "--align", "8")),
    Case("unet", "U-Net (BN, bilinear)", build_unet,
         dict(base=60, size=128), dict(base=6, size=32)),
    Case("unet-qdq", "U-Net, QDQ-quantized (onnxruntime)", build_unet_qdq,
         dict(base=60, size=128), dict(base=6, size=32)),
    Case("unet-small", "U-Net (BN, bilinear), 6 MB: the size of most exported NPU models", build_unet,
         dict(base=14, size=128), dict(base=4, size=32),
         note="a model of the usual exported size, where interpreter start and imports dominate every step"),
    Case("chain10k", "10k-node Conv+BN+Relu chain", build_chain,
         dict(blocks=3334), dict(blocks=300), latency=False),
    Case("chain30k", "30k-node Conv+BN+Relu chain", build_chain,
         dict(blocks=10000), dict(blocks=600), huge=True, latency=False),
    Case("chain100k", "100k-node Conv+BN+Relu chain", build_chain,
         dict(blocks=33334), dict(blocks=1000),
         validate_args=("--validate", "final"), huge=True, latency=False,
         note="(c) uses --validate final: one onnxruntime session per model instead of one per changed pass; "
              "(e) skipped by default: an ORT_ENABLE_ALL session of this graph takes minutes to build "
              "(--latency-all measures it)"),
    Case("external2g", ">2 GB, external data", build_external,
         dict(layers=9, channels=8192), dict(layers=3, channels=512),
         huge=True),
)


# The --check row's model: not a row of the table above (it is only checked, never fixed).
CHECK_CASE = Case("residual9k", "9,000-node residual chain, 20 channels", build_residual,
                  dict(blocks=3000), dict(blocks=300), latency=False)


def model_size(path: str) -> int:
    data = path + ".data"
    return os.path.getsize(path) + (os.path.getsize(data) if os.path.exists(data) else 0)


def ensure_model(case: Case, quick: bool, workdir: str) -> tuple[str, dict[str, Any]]:
    """Build the case's model unless an identical one (same builder parameters) is already in ``workdir``."""
    params = case.quick_params if quick else case.params
    tag = "quick" if quick else "full"
    path = os.path.join(workdir, "models", f"{case.name}-{tag}.onnx")
    stamp_path = path + ".json"
    if os.path.exists(stamp_path) and os.path.exists(path):
        with open(stamp_path, encoding="utf-8") as f:
            stamp = json.load(f)
        if stamp.get("params") == params and stamp.get("builder") == BUILDER_VERSION and \
                stamp.get("size") == model_size(path):
            return path, stamp
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for stale in (path, path + ".data", stamp_path):
        if os.path.exists(stale):
            os.unlink(stale)
    t0 = time.perf_counter()
    case.build(path, **params)
    model = onnx.load(path, load_external_data=False)
    stamp = {"params": params, "builder": BUILDER_VERSION, "size": model_size(path), "nodes": len(model.graph.node),
             "initializers": len(model.graph.initializer), "build_seconds": round(time.perf_counter() - t0, 1),
             "external_data": os.path.exists(path + ".data")}
    del model
    with open(stamp_path, "w", encoding="utf-8") as f:
        json.dump(stamp, f)
    return path, stamp


# ----------------------------------------------------------------------------------------------------------------
# Running one step in a child process
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    seconds: float
    peak_rss: int  # bytes, of the child process itself (rusage)
    returncode: int | None
    status: str  # ok | exit N | timeout | killed (RSS > limit)
    stderr: str
    cpu_seconds: float = 0.0  # user + system time of the child (rusage): less sensitive to a loaded machine


# The measured command runs as the child of this small launcher, not of the benchmark: a process's peak RSS
# (rusage) starts from the resident set of the process it was forked from, so a child forked from the benchmark
# (numpy, onnx and the models it built in memory) would report the benchmark's memory as its own. The launcher
# holds no model (~10 MB) and reports the child's wall time, peak RSS, CPU time and exit status as its last stderr
# line.
LAUNCHER = """
import json, os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
figures = {"seconds": time.perf_counter() - t0, "peak_rss": usage.ru_maxrss * 1024,
           "cpu_seconds": usage.ru_utime + usage.ru_stime, "code": os.waitstatus_to_exitcode(status)}
sys.stderr.write("\\n" + MARK + json.dumps(figures) + "\\n")
"""
LAUNCHED = "bench-launcher: "
LAUNCHER = LAUNCHER.replace("MARK", repr(LAUNCHED))


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its children (the launcher and the measured process)."""
    total = 0
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids = [pid, *map(int, f.read().split())]
    except OSError:
        pids = [pid]
    for one in pids:
        try:
            with open(f"/proc/{one}/status") as f:
                total += next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
        except OSError:
            pass
    return total


def run_child(cmd: Sequence[str], *, timeout: float, rss_limit: int, cwd: str | None = None) -> Run:
    """Run ``cmd`` from the launcher; its wall time, peak RSS (``os.wait4`` rusage) and exit code, and a watchdog
    for the timeout and RSS limit."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, *cmd], stdout=subprocess.DEVNULL, stderr=err,
                                cwd=cwd, start_new_session=True)
        verdict: list[str] = []
        done = threading.Event()

        def watchdog() -> None:
            while not done.wait(0.2):
                reason = None
                if time.perf_counter() - t0 > timeout:
                    reason = "timeout"
                elif _tree_rss(proc.pid) > rss_limit:
                    reason = f"killed (RSS > {rss_limit / GIB:.0f} GiB)"
                if reason:
                    verdict.append(reason)
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    return

        thread = threading.Thread(target=watchdog, daemon=True)
        thread.start()
        proc.wait()
        seconds = time.perf_counter() - t0
        done.set()
        thread.join()
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    head, _, last = stderr.rstrip("\n").rpartition("\n" + LAUNCHED)
    figures = json.loads(last) if last.startswith("{") and not verdict else {}
    if figures:
        stderr = head
    code = figures.get("code", proc.returncode)
    status = verdict[0] if verdict else ("ok" if code == 0 else f"exit {code}")
    return Run(figures.get("seconds", seconds), figures.get("peak_rss", 0), code, status, stderr,
               figures.get("cpu_seconds", 0.0))


FLOOR = """
import os, sys, onnx
src, dst, external = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
model = onnx.load(src)
if external:
    data = os.path.basename(dst) + ".data"
    if os.path.exists(os.path.join(os.path.dirname(dst), data)):
        os.unlink(os.path.join(os.path.dirname(dst), data))  # onnx appends to an existing data file
    onnx.save(model, dst, save_as_external_data=True, all_tensors_to_one_file=True, location=data,
              size_threshold=1024)
else:
    onnx.save(model, dst)
"""


ORT_ONCE = """
import sys, numpy as np, onnxruntime as ort
opts = ort.SessionOptions()  # as npufix's validation sessions (pipeline/validation/session.py, Runner)
opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
opts.enable_cpu_mem_arena = False
opts.enable_mem_pattern = False
session = ort.InferenceSession(sys.argv[1], opts, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
session.run(None, {i.name: rng.standard_normal([d if isinstance(d, int) and d > 0 else 1 for d in i.shape])
                   .astype(np.float32) for i in session.get_inputs()})
"""
"""(g): onnxruntime builds one session of the original and runs it once: what any validating tool pays at least
(its import, the session's weights and activations), next to the floor (a), which runs nothing."""

CHECKED = """
import math, sys, onnx
with open(sys.argv[1], "rb") as f:
    data = f.read()
onnx.checker.check_model(data)  # on the bytes: no serialization of a proto first
model = onnx.load_from_string(data)
del data
light = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import, functions=model.functions)
graph = light.graph  # weights as dims only: inference reads the values of small constants, not of weights
for field in ("node", "input", "output", "sparse_initializer"):
    getattr(graph, field).extend(getattr(model.graph, field))
floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
for tensor in model.graph.initializer:  # the limits of npufix's own copy (ir/graph.shape_only_copy), restated:
    numel = math.prod(tensor.dims)  # the floor runs onnx alone
    if numel > 1024 or (numel > 64 and tensor.data_type in floats):
        stub = graph.initializer.add(name=tensor.name, dims=tensor.dims, data_type=tensor.data_type,
                                     data_location=onnx.TensorProto.EXTERNAL)
        stub.external_data.add(key="location", value="unread")
    else:
        graph.initializer.append(tensor)
data = light.SerializeToString()
del light, graph  # not held while onnx holds its own copy
inferred = onnx.shape_inference.infer_shapes(data, check_type=True, strict_mode=True, data_prop=True)
del model.graph.value_info[:]  # inference returns the declared ones too
model.graph.value_info.extend(inferred.graph.value_info)
del inferred
data = model.SerializeToString()
del model
onnx.checker.check_model(data)
with open(sys.argv[2], "wb") as f:
    f.write(data)
"""
"""(h): the floor (a) plus onnx's own checks, each once, done as cheaply as onnx's Python API allows (the checker
on bytes, shape inference on a copy without the weights' values): the checker on the input, strict shape inference
with data propagation, the checker on the result. A fixing run of npufix does each of them once (it needs every
shape, and writes nothing the checker refuses): where (h) alone takes more than twice (a), b/a <= 2 is out of reach
for any tool that checks as npufix does. Not run on a model with external data (its data file would be read
twice)."""


def _remove(path: str) -> None:
    for p in (path, path + ".data"):
        if os.path.exists(p):
            os.unlink(p)


def _warm_cache(path: str) -> None:
    """Read the model once so the first timed step does not pay for the disk alone."""
    for p in (path, path + ".data"):
        if os.path.exists(p):
            with open(p, "rb") as f:
                while f.read(64 * MIB):
                    pass


# ----------------------------------------------------------------------------------------------------------------
# onnxruntime latency, run as `bench.py --_latency ORIGINAL FIXED` in its own process
# ----------------------------------------------------------------------------------------------------------------


def _latency_main(original: str, fixed: str, runs: int) -> None:
    import onnxruntime as ort

    def session(path: str) -> tuple[Any, dict[str, np.ndarray], float]:
        t0 = time.perf_counter()
        sess = ort.InferenceSession(path, ort.SessionOptions(), providers=["CPUExecutionProvider"])
        created = time.perf_counter() - t0
        rng = np.random.default_rng(0)
        feeds = {i.name: rng.standard_normal([d if isinstance(d, int) and d > 0 else 1 for d in i.shape])
                 .astype(np.float32) for i in sess.get_inputs()}
        for _ in range(2):  # warm-up: first runs allocate and pick kernels
            sess.run(None, feeds)
        return sess, feeds, created

    def timed(sess: Any, feeds: dict[str, np.ndarray]) -> float:
        t0 = time.perf_counter()
        sess.run(None, feeds)
        return time.perf_counter() - t0

    big = model_size(original) + model_size(fixed) > GIB
    result: dict[str, Any] = {}
    if big:  # one session at a time: two sessions of a >2 GB model would double the memory
        for key, path in (("original", original), ("fixed", fixed)):
            sess, feeds, created = session(path)
            result[key] = {"ms": 1e3 * statistics.median(timed(sess, feeds) for _ in range(runs)),
                           "session_s": created}
            del sess
    else:  # interleaved, so drift on a shared machine hits both alike
        s_o, f_o, c_o = session(original)
        s_f, f_f, c_f = session(fixed)
        t_o, t_f = [], []
        for _ in range(runs):
            t_o.append(timed(s_o, f_o))
            t_f.append(timed(s_f, f_f))
        result = {"original": {"ms": 1e3 * statistics.median(t_o), "session_s": c_o},
                  "fixed": {"ms": 1e3 * statistics.median(t_f), "session_s": c_f}}
    print(json.dumps(result))


# ----------------------------------------------------------------------------------------------------------------
# The benchmark
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class CaseResult:
    case: Case
    path: str
    stamp: dict[str, Any]
    repeat: int
    runs: dict[str, list[Run]]
    latency: dict[str, Any] | None = None
    latency_status: str = ""
    fixed_from: str = ""


def _median(runs: list[Run]) -> float | None:
    ok = [r.seconds for r in runs if r.status in ("ok", "exit 1")]
    return statistics.median(ok) if ok else None


def _median_cpu(runs: list[Run]) -> float | None:
    """The median CPU time (user + system) of the runs that finished: steadier than wall time on a shared
    machine, and what a target stated "in CPU time" is judged on."""
    ok = [r.cpu_seconds for r in runs if r.status in ("ok", "exit 1")]
    return statistics.median(ok) if ok else None


def _paired(num: list[Run], den: list[Run], cpu: bool = False) -> float | None:
    """The median of ``num``'s runs over ``den``'s round by round (the i-th of each ran in the same round, seconds
    apart): a ratio the machine's drift over the whole run does not move, as a ratio of medians can (it pairs
    each figure with one taken minutes later)."""
    def figure(run: Run) -> float:
        return run.cpu_seconds if cpu else run.seconds

    ratios = [figure(n) / figure(d) for n, d in zip(num, den)
              if n.status in ("ok", "exit 1") and d.status in ("ok", "exit 1") and figure(d) > 0]
    return statistics.median(ratios) if ratios else None


def run_case(case: Case, args: argparse.Namespace) -> CaseResult:
    path, stamp = ensure_model(case, args.quick, args.workdir)
    out_dir = os.path.join(args.workdir, "out", case.name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    external = "1" if stamp["external_data"] else "0"
    repeat = args.repeat_huge if case.huge else args.repeat
    py = sys.executable
    npufix = [py, "-m", "onnx_npu_fix", path, *case.npufix_args]
    outs = {k: os.path.join(out_dir, f"{k}.onnx") for k in "abcdgh"}  # (g) writes none
    steps: dict[str, tuple[list[str], float, str | None]] = {
        "a": ([py, "-c", FLOOR, path, outs["a"], external], args.step_timeout, None),
        "b": ([*npufix, "-o", outs["b"], "--no-validate"], args.step_timeout, None),
        "c": ([*npufix, "-o", outs["c"], *case.validate_args], args.step_timeout, None),
        "g": ([py, "-c", ORT_ONCE, path], args.step_timeout, None),
    }
    if not stamp["external_data"]:
        steps["h"] = ([py, "-c", CHECKED, path, outs["h"]], args.step_timeout, None)
    if not args.no_onnxsim:
        cmd = [py, "-m", "onnxsim", path, outs["d"]]
        if args.onnxsim_check:
            cmd.append(str(args.onnxsim_check))
        steps["d"] = (cmd, args.onnxsim_timeout, out_dir)
    runs: dict[str, list[Run]] = {k: [] for k in steps}
    _warm_cache(path)
    _log(f"{case.name}: {stamp['size'] / MIB:.0f} MiB, {stamp['nodes']} nodes, {repeat} run(s) of "
         f"{', '.join(steps)}")
    if not case.huge and not args.quick:
        # One untimed round first: the first runs after another model's (page cache full of its files, memory
        # being reclaimed) measured 30% slower than the later ones, for every step alike.
        for key, (cmd, timeout, cwd) in steps.items():
            _remove(outs[key])
            run_child(cmd, timeout=timeout, rss_limit=args.rss_limit, cwd=cwd)
    for i in range(repeat):
        for key, (cmd, timeout, cwd) in steps.items():
            if runs[key] and (runs[key][-1].status == "timeout" or runs[key][-1].status.startswith("killed")):
                continue  # once over a limit, not again
            _remove(outs[key])
            run = run_child(cmd, timeout=timeout, rss_limit=args.rss_limit, cwd=cwd)
            runs[key].append(run)
            _log(f"  {case.name} {key} #{i + 1}: {run.seconds:7.2f} s  RSS {run.peak_rss / GIB:5.2f} GiB  "
                 f"{run.status}")
            if run.status not in ("ok",) and key in "bc":
                tail = run.stderr.strip().splitlines()[-3:]
                _log("    " + "\n    ".join(tail))
    result = CaseResult(case, path, stamp, repeat, runs)
    for key in ("c", "b"):
        if os.path.exists(outs[key]):
            result.fixed_from = key
            break
    _measure_latency(result, outs, args)
    if args.profile:
        profile_npufix(case, path, out_dir, args)
    if not args.keep_outputs:
        shutil.rmtree(out_dir, ignore_errors=True)
    return result


def _measure_latency(result: CaseResult, outs: dict[str, str], args: argparse.Namespace) -> None:
    """(e): onnxruntime latency of the original and the fixed model, in a child process of its own."""
    case, path, py = result.case, result.path, sys.executable
    if not case.latency and not args.latency_all:
        result.latency_status = "skipped"
    elif not result.fixed_from:
        result.latency_status = "no fixed model"
    else:
        cmd = [py, os.path.abspath(__file__), "--_latency", path, outs[result.fixed_from],
               "--latency-runs", str(args.latency_runs)]
        with tempfile.TemporaryFile() as out:
            try:
                done = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, timeout=args.latency_timeout)
                out.seek(0)
                text = out.read().decode()
                if done.returncode == 0:
                    result.latency = json.loads(text.strip().splitlines()[-1])
                    result.latency_status = "ok"
                else:
                    result.latency_status = f"error: {done.stderr.decode().strip().splitlines()[-1:]}"
            except subprocess.TimeoutExpired:
                result.latency_status = "timeout"
        _log(f"  {case.name} e: {result.latency_status} {json.dumps(result.latency) if result.latency else ''}")


def profile_npufix(case: Case, path: str, out_dir: str, args: argparse.Namespace) -> None:
    """cProfile one npufix run (the validated one, (c)) and print the functions that take the time."""
    prof = os.path.join(args.workdir, f"{case.name}.prof")
    out = os.path.join(out_dir, "profiled.onnx")
    cmd = [sys.executable, "-m", "cProfile", "-o", prof, "-m", "onnx_npu_fix", path, "-o", out,
           *case.npufix_args, *(["--no-validate"] if args.profile == "b" else case.validate_args)]
    run = run_child(cmd, timeout=args.step_timeout, rss_limit=args.rss_limit)
    _log(f"  {case.name} profile ({args.profile}): {run.seconds:.2f} s {run.status}; {prof}")
    import pstats

    stats = pstats.Stats(prof, stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(15)


LOAD_ONLY = "import sys, onnx\nonnx.load(sys.argv[1])\n"
IMPORT_ONLY = "import onnx_npu_fix.cli\n"


def check_row(args: argparse.Namespace) -> tuple[str, dict[str, float | None]]:
    """``npufix --check`` on the 9,000-node unaligned model next to the I/O floor: whole-process wall times of
    (a) ``onnx.load`` + ``onnx.save``, a load-only process, the npufix import alone and ``npufix MODEL --check``
    (the default constraints, so every Conv is an align-channels finding), each from the launcher, interleaved,
    medians of ``--repeat`` runs after one untimed round; peak RSS is the largest of the runs. Returns the table
    and its ratios (check/a in wall and CPU time, check/load in peak RSS) for :func:`targets`."""
    path, stamp = ensure_model(CHECK_CASE, args.quick, args.workdir)
    floor_out = os.path.join(args.workdir, "out", "check-floor.onnx")
    os.makedirs(os.path.dirname(floor_out), exist_ok=True)
    py = sys.executable
    steps = {"load+save": [py, "-c", FLOOR, path, floor_out, "0"], "load": [py, "-c", LOAD_ONLY, path],
             "import": [py, "-c", IMPORT_ONLY], "check": [py, "-m", "onnx_npu_fix", path, "--check"]}
    runs: dict[str, list[Run]] = {k: [] for k in steps}
    _warm_cache(path)
    _log(f"{CHECK_CASE.name}: {stamp['size'] / MIB:.0f} MiB, {stamp['nodes']} nodes, {args.repeat} run(s) of "
         f"{', '.join(steps)}")
    for i in range(args.repeat + (0 if args.quick else 1)):
        for key, cmd in steps.items():
            run = run_child(cmd, timeout=args.step_timeout, rss_limit=args.rss_limit)
            _log(f"  {key} #{i}: {run.seconds:6.2f} s ({run.cpu_seconds:5.2f} s CPU)  RSS {run.peak_rss / MIB:5.0f} "
                 f"MiB  {run.status}")
            if i or args.quick:
                runs[key].append(run)
    _remove(floor_out)
    seconds = {k: _median(v) for k, v in runs.items()}
    cpu = {k: _median_cpu(v) for k, v in runs.items()}
    peak = {k: max(r.peak_rss for r in v) for k, v in runs.items()}
    lines = [
        "| model | nodes | size | (a) load+save | load only | npufix import | npufix --check | check/a | "
        "check/a (CPU time) | peak RSS load only | peak RSS --check | check/load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {CHECK_CASE.name} ({CHECK_CASE.title}) | {stamp['nodes']:,} | {stamp['size'] / 1e6:.1f} MB | "
        f"{_cell(runs['load+save'])} | {_cell(runs['load'])} | {_cell(runs['import'])} | {_cell(runs['check'])} | "
        f"{_ratio(seconds['check'], seconds['load+save'])}{_excess(seconds['check'], seconds['load+save'])} | "
        f"{_ratio(cpu['check'], cpu['load+save'])}{_excess(cpu['check'], cpu['load+save'])} | "
        f"{peak['load'] / MIB:.0f} MiB | "
        f"{peak['check'] / MIB:.0f} MiB | {_ratio(peak['check'], peak['load'])} |",
    ]
    figures = {"wall": _quotient(seconds["check"], seconds["load+save"]),
               "cpu": _quotient(cpu["check"], cpu["load+save"]), "rss": _quotient(peak["check"], peak["load"])}
    return "\n".join(lines), figures


# ----------------------------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------------------------


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f} s" if value < 100 else f"{value:.0f} s"


def _cell(runs: list[Run]) -> str:
    """The median, or why there is none."""
    med = _median(runs)
    if med is None:
        return runs[-1].status if runs else "–"
    codes = {r.returncode for r in runs}
    return _fmt_s(med) + (" (exit 1)" if 1 in codes else "")


def _quotient(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _two(q: float | None) -> str:
    return "–" if q is None else f"{q:.2f}"


def _ratio(num: float | None, den: float | None) -> str:
    return _two(_quotient(num, den))


def _excess(num: float | None, den: float | None) -> str:
    """`` (+1.23 s)``: what a step costs over the floor, beside the ratio (a ratio alone hides a fixed cost, such
    as an import, that dominates small models)."""
    return f" ({num - den:+.2f} s)" if num is not None and den is not None else ""


def _rss(runs: list[Run], size: int, floor: list[Run] | None = None) -> str:
    """The largest peak RSS of ``runs``, and what it adds to the floor's (``floor``) in model sizes: the
    targets are stated that way (c <= floor + 2 x size, b <= floor + 1 x size)."""
    if not runs:
        return "–"
    peak = max(r.peak_rss for r in runs)
    if not floor:
        return f"{peak / GIB:.2f} GiB ({peak / size:.1f}×)"
    above = (peak - max(r.peak_rss for r in floor)) / size
    return f"{peak / GIB:.2f} GiB (floor {above:+.1f}× size)"


def table(results: list[CaseResult]) -> str:
    head = ("| model | size | nodes | (a) load+save | (b) npufix --no-validate | (c) npufix validated | "
            "(d) onnxsim | b/a (b − a) | c/a (c − a) | c/d | peak RSS (a) | peak RSS (b) | peak RSS (c) | "
            "(g) ORT runs the original once | (h) onnx checks | (e) ORT latency fixed/orig |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        a, b, c = (_median(r.runs.get(k, [])) for k in "abc")
        d_runs = r.runs.get("d", [])
        d = _median(d_runs)
        if d is None and d_runs and d_runs[-1].status == "timeout":
            cd = f"< {c / d_runs[-1].seconds:.2f}" if c else "–"
            d_cell = f"timeout (> {d_runs[-1].seconds:.0f} s)"
        else:
            cd, d_cell = _ratio(c, d), _cell(d_runs) if d_runs else "not run"
            if d is not None and c is not None:
                cd += (f" (CPU {_ratio(_median_cpu(r.runs['c']), _median_cpu(d_runs))}; paired "
                       f"{_two(_paired(r.runs['c'], d_runs))} / {_two(_paired(r.runs['c'], d_runs, cpu=True))})")
        size = r.stamp["size"]
        if r.latency:
            o, f = r.latency["original"]["ms"], r.latency["fixed"]["ms"]
            lat = f"{f / o:.2f} ({o:.1f} → {f:.1f} ms)"
        else:
            lat = r.latency_status
        c_label = _cell(r.runs.get("c", []))
        if r.case.validate_args:
            c_label += f" [{' '.join(r.case.validate_args)}]"
        size_txt = f"{size / 1e9:.2f} GB" if size > 1e9 else f"{size / 1e6:.{0 if size > 1e7 else 1}f} MB"
        lines.append(f"| {r.case.name} | {size_txt} | {r.stamp['nodes']:,} | {_cell(r.runs['a'])} | "
                     f"{_cell(r.runs['b'])} | {c_label} | {d_cell} | {_ratio(b, a)}{_excess(b, a)} | "
                     f"{_ratio(c, a)}{_excess(c, a)} | {cd} | {_rss(r.runs['a'], size)} | "
                     f"{_rss(r.runs['b'], size, r.runs['a'])} | {_rss(r.runs['c'], size, r.runs['a'])} | "
                     f"{_floor_cell(r, 'g')} | {_floor_cell(r, 'h')} | {lat} |")
    return "\n".join(lines)


def _floor_cell(r: CaseResult, key: str) -> str:
    """(g)'s or (h)'s cell: its time and its peak RSS over the floor's, in model sizes."""
    runs = r.runs.get(key, [])
    if not runs:
        return "–"
    if _median(runs) is None:
        return runs[-1].status
    return f"{_cell(runs)}, {_rss(runs, r.stamp['size'], r.runs['a'])}"


TARGET_CD_ROWS = ("tcn", "unet")  # where the targets ask c/d < 1: the model sizes onnxsim is used on


def _peak(runs: list[Run]) -> int | None:
    return max((r.peak_rss for r in runs), default=None) or None


def _every_row(results: list[CaseResult], figure: Callable[[CaseResult], float | None], limit: float,
               fmt: str = "{:.2f}") -> tuple[str, str]:
    """(the worst row's figure and name, verdict) for a target that holds on every row; a row without the figure
    (a step that failed or timed out) is named, and the target is then not judged met."""
    values = [(figure(r), r.case.name) for r in results]
    missing = [name for value, name in values if value is None]
    measured = [(value, name) for value, name in values if value is not None]
    if not measured:
        return "not measured", "–"
    worst, where = max(measured)
    text = f"worst {fmt.format(worst)} ({where}) over {len(measured)} row(s)"
    if missing:
        text += f"; not measured on {', '.join(missing)}"
    verdict = "not met" if worst > limit else ("met on the rows measured" if missing else "met")
    return text, verdict


def _rss_over_floor(r: CaseResult, key: str) -> float | None:
    """What step ``key``'s peak RSS adds to the floor's (a), in model sizes."""
    peak, floor = _peak(r.runs.get(key, [])), _peak(r.runs.get("a", []))
    return (peak - floor) / r.stamp["size"] if peak is not None and floor is not None else None


def _rss_over_ort_floor(r: CaseResult) -> float | None:
    """What (c)'s peak RSS adds to the larger of the floor's (a) and onnxruntime's own (g), in model sizes: the
    memory a validated run needs beyond running the original once."""
    peak, floors = _peak(r.runs.get("c", [])), [_peak(r.runs.get(k, [])) for k in "ag"]
    if peak is None or None in floors:
        return None
    return (peak - max(floors)) / r.stamp["size"]


def _cd_target(results: list[CaseResult]) -> tuple[str, str]:
    """c/d < 1 on the TCN and the U-Net, in wall time and in CPU time: as ratios of the medians and as the
    medians of the rounds' own ratios (_paired), both."""
    parts, verdicts = [], []
    for name in TARGET_CD_ROWS:
        r = next((x for x in results if x.case.name == name), None)
        if r is None or not r.runs.get("d"):
            parts.append(f"{name}: not measured")
            verdicts.append(None)
            continue
        figures = (_quotient(_median(r.runs["c"]), _median(r.runs["d"])),
                   _quotient(_median_cpu(r.runs["c"]), _median_cpu(r.runs["d"])),
                   _paired(r.runs["c"], r.runs["d"]), _paired(r.runs["c"], r.runs["d"], cpu=True))
        parts.append(f"{name}: wall {_two(figures[0])}, CPU {_two(figures[1])}; paired {_two(figures[2])} / "
                     f"{_two(figures[3])}")
        verdicts.append(None if None in figures else all(f < 1 for f in figures))
    if all(v is None for v in verdicts):
        return "; ".join(parts), "–"
    if False in verdicts:
        return "; ".join(parts), "not met"
    return "; ".join(parts), "met" if None not in verdicts else "met on the rows measured"


def _check_target(check: dict[str, float | None] | None) -> tuple[str, str]:
    if not check or check.get("wall") is None:
        return "not measured (`--rows check`)", "–"
    wall, cpu = check["wall"], check.get("cpu")
    text = f"check/a {wall:.2f} wall, {_two(cpu)} CPU"
    if wall <= 1.5 and (cpu is None or cpu <= 1.5):
        return text, "met"
    return text, "met in CPU time only" if cpu is not None and cpu <= 1.5 else "not met"


def targets(results: list[CaseResult], check: dict[str, float | None] | None, busy_core: bool) -> str:
    """The speed targets, each judged from this run's own ratios: met, not met, or not measured in this run."""
    def ratio(num: str) -> Callable[[CaseResult], float | None]:
        return lambda r: _quotient(_median(r.runs.get(num, [])), _median(r.runs.get("a", [])))

    rows = [("b/a ≤ 2 on every row", *_every_row(results, ratio("b"), 2.0)),
            ("c/a ≤ 5 on every row", *_every_row(results, ratio("c"), 5.0)),
            ("c/d < 1 on the TCN and the U-Net, wall and CPU time, one core busy elsewhere"
             + ("" if busy_core else " (this run: no `--busy-core`)"), *_cd_target(results)),
            ("peak RSS (c) ≤ the floor's + 2 × size on every row",
             *_every_row(results, lambda r: _rss_over_floor(r, "c"), 2.0, "floor {:+.1f}× size")),
            ("(not a target) peak RSS (c) ≤ the larger of the floor's and (g)'s + 2 × size on every row",
             *_every_row(results, _rss_over_ort_floor, 2.0, "{:+.1f}× size")),
            ("peak RSS (b) ≤ the floor's + 1 × size on every row",
             *_every_row(results, lambda r: _rss_over_floor(r, "b"), 1.0, "floor {:+.1f}× size")),
            ("(not a target) onnx's checks alone (h) ≤ 2 × (a) on every row: where not, b/a ≤ 2 is out of "
             "reach for any tool that runs them, as npufix does", *_every_row(results, ratio("h"), 2.0)),
            ("(not a target) peak RSS (h) ≤ the floor's + 1 × size on every row (onnx's checks through its "
             "Python API, the heap never trimmed: not a lower bound for memory)",
             *_every_row(results, lambda r: _rss_over_floor(r, "h"), 1.0, "floor {:+.1f}× size")),
            ("`--check` on the 9,000-node model ≤ 1.5 × (a)", *_check_target(check)),
            ("outputs and records unchanged (byte-identical on the fixtures)", "not measured here: "
             "`bench/same_outputs.py` before and after, `--compare`", "–")]
    lines = ["| target | this run | verdict |", "|---|---|---|"]
    lines += [f"| {what} | {measured} | {verdict} |" for what, measured, verdict in rows]
    return "\n".join(lines)


def _pass_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("wrote ")]


def details(results: list[CaseResult], quick: bool) -> str:
    out = []
    for r in results:
        case = r.case
        params = case.quick_params if quick else case.params
        out.append(f"### {case.name}: {case.title}\n")
        out.append(f"- built by `{case.build.__name__}({', '.join(f'{k}={v}' for k, v in params.items())})`: "
                   f"{r.stamp['size'] / 1e6:.1f} MB, {r.stamp['nodes']:,} nodes, "
                   f"{r.stamp['initializers']:,} initializers"
                   + (", weights in external data" if r.stamp["external_data"] else ""))
        flags = " ".join(case.npufix_args) or "(defaults)"
        out.append(f"- npufix options: `{flags}`; (c) validation: "
                   f"`{' '.join(case.validate_args) or '--validate each (default)'}`; runs per step: {r.repeat}")
        if case.note:
            out.append(f"- {case.note}")
        for key, label in (("a", "floor"), ("b", "no-validate"), ("c", "validated"), ("d", "onnxsim"),
                           ("g", "onnxruntime once"), ("h", "onnx checks")):
            runs = r.runs.get(key, [])
            if runs:
                samples = ", ".join(f"{x.seconds:.2f}" for x in runs)
                rss = ", ".join(f"{x.peak_rss / GIB:.2f}" for x in runs)
                statuses = sorted({x.status for x in runs})
                out.append(f"- ({key}) {label}: seconds [{samples}], peak RSS GiB [{rss}], status {statuses}")
        if r.latency:
            lo, lf = r.latency["original"], r.latency["fixed"]
            out.append(f"- (e) latency of the fixed model from ({r.fixed_from}): {lo['ms']:.2f} ms → "
                       f"{lf['ms']:.2f} ms; ORT_ENABLE_ALL session creation {lo['session_s']:.1f} s → "
                       f"{lf['session_s']:.1f} s")
        c_runs = r.runs.get("c", [])
        if c_runs:
            out.append("- npufix summary of the last validated run (c):\n")
            out.append("  ```")
            out.extend(f"  {line}" for line in _pass_lines(c_runs[-1].stderr)[-40:])
            out.append("  ```")
        out.append("")
    return "\n".join(out)


def machine_info() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        info["cpu"] = platform.processor() or "?"
    info["cores"] = str(os.cpu_count())
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
        info["ram"] = f"{kib / (1 << 20):.1f} GiB"
    except (OSError, StopIteration):
        info["ram"] = "?"
    info["os"] = platform.platform()
    info["python"] = platform.python_version()
    versions = []
    for mod in ("onnx", "onnxruntime", "ml_dtypes", "numpy", "onnxsim"):
        try:
            versions.append(f"{mod} {__import__(mod).__version__}")
        except Exception:  # noqa: BLE001 - a missing optional tool is reported, not fatal
            versions.append(f"{mod} not installed")
    info["versions"] = ", ".join(versions)
    try:
        from onnx_npu_fix import __version__
        info["npufix"] = __version__
    except ImportError:
        info["npufix"] = "not importable"
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        info["commit"] = (commit or "?") + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        info["commit"] = "?"
    listed = subprocess.run([sys.executable, "-c", "from onnx_npu_fix.passes import DEFAULT_ORDER as d; "
                             "print(' '.join(c.name for c in d))"], capture_output=True, text=True, timeout=60)
    default = listed.stdout.split()
    info["passes"] = ", ".join(default) or "?"
    return info


def report(results: list[CaseResult], info: dict[str, str], args: argparse.Namespace, seconds: float) -> str:
    load, start = os.getloadavg(), args.load_at_start
    lines = [
        "# npufix benchmark results" + (" (--quick)" if args.quick else ""),
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} by `python bench/bench.py"
        + (" " + " ".join(args.argv) if args.argv else "") + f"` in {seconds / 60:.1f} min.",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['ram']} RAM; {info['os']}; Python {info['python']};"
        f" {info['versions']}. npufix {info['npufix']} at {info['commit']}; default passes: {info['passes']}. "
        f"Load average (1 min) at the start {start:.1f}, at the end {load[0]:.1f}: other work on the machine "
        f"shows up in the times.",
        "",
        table(results),
        "",
        "Times are whole-process wall times (interpreter start and imports included), medians of the runs listed "
        "below; ratios are of medians. Peak RSS is the largest of the runs, also as a multiple of the model's size "
        "on disk. (e) is the median of the fixed model's onnxruntime latency over the original's, default session "
        "options (ORT_ENABLE_ALL). (g) is a process that builds one onnxruntime session of the original, "
        "with npufix's validation options (graph optimizations off, no arena), and runs it once on N(0, 1) inputs: "
        "the least any validating tool pays (its peak over the floor's in model sizes). (h) is the floor (a) "
        "plus onnx's checker on the input, strict shape inference with data propagation and the checker on its "
        "result: the least a tool that checks as npufix does pays (not run with external data). "
        "`(exit 1)`: npufix wrote "
        "the model but reported constraints it could not fix. "
        "onnxsim ran as `onnxsim IN OUT" + (f" {args.onnxsim_check}" if args.onnxsim_check else "") + "`"
        + (" (its default: no output check)" if not args.onnxsim_check else "") + ".",
        "",
        "The speed targets are judged from these ratios in the last section. The floor (a) ran with the versions "
        "above (onnx imports ml_dtypes, whose version alone moves the floor by ~0.5 s CPU)"
        + ("; one core was kept busy by a spinning process throughout (`--busy-core`)." if args.busy_core else "."),
        "",
        "## Per model",
        "",
        details(results, args.quick),
    ]
    return "\n".join(lines)


@contextlib.contextmanager
def _busy_core(busy: bool) -> Iterator[None]:
    """``--busy-core``: one spinning process for the duration (started by this process, ended by its pid)."""
    if not busy:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    _log(f"--busy-core: a spinning process (pid {spinner.pid}) keeps one core busy")
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


ROWS = ("models", "sram", "check")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    names = [c.name for c in CASES]
    parser.add_argument("--quick", action="store_true", help="small models: a smoke test in about a minute")
    parser.add_argument("--only", help=f"comma-separated subset of {', '.join(names)} (implies --rows models)")
    parser.add_argument("--rows", help=f"comma-separated subset of {', '.join(ROWS)}: the per-model table, the SRAM "
                        "row, the --check row (default: all; with --only: models)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per step (default 5; 1 with --quick)")
    parser.add_argument("--repeat-huge", type=int, default=1,
                        help="runs per step for the 100k-node and the >2 GB models (default 1)")
    parser.add_argument("--workdir", default=os.path.join(ROOT, "build", "bench"),
                        help="scratch directory for the models and outputs (default build/bench)")
    parser.add_argument("--results", help="write the Markdown report here (default: bench/results.md for a "
                        "full run of all models; nothing for --quick, --only or --rows)")
    parser.add_argument("--onnxsim-timeout", type=float, default=300, help="seconds (default 300)")
    parser.add_argument("--onnxsim-check", type=int, default=0,
                        help="onnxsim's check_n argument (default 0, onnxsim's own default)")
    parser.add_argument("--no-onnxsim", action="store_true", help="skip (d)")
    parser.add_argument("--step-timeout", type=float, default=1800, help="seconds per npufix / floor run")
    parser.add_argument("--rss-limit", type=float, default=20, help="GiB; a child above it is killed (default 20)")
    parser.add_argument("--latency-runs", type=int, default=10, help="timed onnxruntime runs per model in (e)")
    parser.add_argument("--latency-timeout", type=float, default=600, help="seconds for (e) per model")
    parser.add_argument("--latency-all", action="store_true", help="also measure (e) on the 100k-node graph")
    parser.add_argument("--profile", nargs="?", const="c", choices=["b", "c"],
                        help="also run npufix (c, or b) under cProfile per model and print the top functions")
    parser.add_argument("--keep-outputs", action="store_true", help="keep the fixed models in the workdir")
    parser.add_argument("--sram-row", action="store_true", help="the same as --rows sram")
    parser.add_argument("--busy-core", action="store_true",
                        help="keep one core busy (a spinning process) while the rows are measured: the condition "
                             "the c/d target is stated for")
    parser.add_argument("--_latency", nargs=2, metavar=("ORIGINAL", "FIXED"), help=argparse.SUPPRESS)
    return parser


def _chosen(parser: argparse.ArgumentParser, given: str | None, known: Sequence[str], what: str) -> list[str]:
    chosen = [n.strip() for n in given.split(",") if n.strip()] if given else list(known)
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        parser.error(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(known)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv)
    if args._latency:
        _latency_main(*args._latency, args.latency_runs)
        return 0
    args.argv = argv
    rows = _chosen(parser, "sram" if args.sram_row else args.rows or ("models" if args.only else None), ROWS, "row(s)")
    chosen = _chosen(parser, args.only, [c.name for c in CASES], "model(s)") if "models" in rows else []
    if args.repeat is None:
        args.repeat = 1 if args.quick else 5  # sub-second steps vary by 30% run to run on a shared machine
    args.rss_limit = int(args.rss_limit * GIB)
    if args.quick:
        args.latency_runs = min(args.latency_runs, 5)
    if chosen and not args.no_onnxsim:
        try:
            import onnxsim  # noqa: F401
        except ImportError:
            _log("onnxsim is not installed (pip install -e '.[bench]'): column (d) says 'not installed'")
            args.no_onnxsim = True
    args.workdir = os.path.abspath(args.workdir)
    os.makedirs(args.workdir, exist_ok=True)
    free = shutil.disk_usage(args.workdir).free
    if "external2g" in chosen and not args.quick and free < 16 * GIB:
        _log(f"warning: {free / GIB:.0f} GiB free in {args.workdir}; the >2 GB case needs about 15 GiB")
    # Byte-compile npufix as installing a wheel does: an editable install under PYTHONDONTWRITEBYTECODE would
    # otherwise recompile its modules in every timed run (50 ms), a cost the floor's pre-compiled onnx never pays.
    import compileall

    compileall.compile_dir(os.path.join(ROOT, "onnx_npu_fix"), quiet=1)
    started = time.perf_counter()
    args.load_at_start = os.getloadavg()[0]
    info = machine_info()
    with _busy_core(args.busy_core):
        results = [run_case(case, args) for case in CASES if case.name in chosen]
        extra = {"sram": sram_row(args.workdir, args.quick) if "sram" in rows else ""}
        extra["check"], check = check_row(args) if "check" in rows else ("", None)
    seconds = time.perf_counter() - started
    text = report(results, info, args, seconds) if chosen else ""
    if extra["sram"]:
        text += "\n\n## Fitting SRAM (in-process, medians of 3; `--rows sram` runs only this)\n\n" + extra["sram"]
    if extra["check"]:
        text += ("\n\n## --check on 9,000 nodes (whole processes; `--rows check` runs only this)\n\n" + extra["check"]
                 + "\n\nTargets: check/a ≤ 1.5 and check/load ≤ 1.5.")
    goals = targets(results, check, args.busy_core)
    text += "\n\n## Targets, judged from this run's ratios\n\n" + goals
    if args.no_onnxsim:
        text = text.replace("| not run |", "| not installed |")
    # Every run says what it ran with, a partial one too: the floor moves with onnx's and ml_dtypes' versions.
    print(f"Python {info['python']}; {info['versions']}; npufix at {info['commit']}; load average at the start "
          f"{args.load_at_start:.1f}" + ("; one core kept busy (--busy-core)" if args.busy_core else ""))
    if chosen:
        print(table(results).replace("| not run |", "| not installed |") if args.no_onnxsim else table(results))
    for key in ("sram", "check"):
        if extra[key]:
            print(extra[key])
    print(goals)
    target = args.results
    if target is None and not args.quick and not args.only and not args.rows and not args.sram_row:
        target = os.path.join(HERE, "results.md")
    if target:
        with open(target, "w", encoding="utf-8") as f:
            f.write(text.lstrip("\n") + "\n")
        _log(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
