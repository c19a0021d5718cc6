"""Write the acceptance matrix's models: real exports npufix never saw, into OUT_DIR (not committed: tens of MB).

Run with the Python of the venv made by vendor/install_exports.sh (torch, torchvision, segmentation-models-pytorch,
timm, onnxruntime): ``python vendor/export_real_models.py OUT_DIR``. Every torch model is built with random,
seeded weights (no hub download) and exported by the classic TorchScript exporter (dynamo=False, opset 17), as
most models in the wild are. OUT_DIR/models.json lists each model with the input shapes it is judged with and
where it came from; vendor/acceptance_matrix.py reads it.

- smp_unet_mnv3_odd   segmentation_models_pytorch Unet, timm MobileNetV3-large encoder, odd decoder channels
- smp_unet_bilinear   smp Unet (ResNet-18) with bilinear decoder upsampling (where this smp has the option)
- smp_linknet         smp Linknet, ResNet-18 encoder
- smp_deeplabv3plus   smp DeepLabV3Plus, ResNet-18 encoder (align_corners x4 upsamplings)
- tv_deeplabv3        torchvision deeplabv3_mobilenet_v3_large
- tv_lraspp           torchvision lraspp_mobilenet_v3_large
- convtasnet_*        the ConvTasNet exports committed in fixtures/ (fixtures/export_torch.py, export_torchaudio.py)
- wheel_*             ONNX models shipped inside PyPI wheels (pip download --no-deps; nothing installed)
- *_qdq               three of them quantized with onnxruntime (quant_pre_process, then quantize_static QDQ, uint8
                      activations / int8 weights, 8 calibration samples of N(0,1))
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "fixtures")
IMAGE = (1, 3, 224, 224)

# wheel (pinned) -> files inside it to keep (fnmatch on the archive path) -> model name, input shapes when dynamic
WHEELS = {
    "nudenet==3.4.2": [("*/320n.onnx", "wheel_nudenet_320n", {"images": [1, 3, 320, 320]})],  # [batch,3,h,w]
    "rapidocr-onnxruntime==1.4.4": [
        ("*/models/ch_PP-OCRv4_det_infer.onnx", "wheel_ppocr_det", {"x": [1, 3, 320, 320]}),
        ("*/models/ch_PP-OCRv4_rec_infer.onnx", "wheel_ppocr_rec", {"x": [1, 3, 48, 320]}),
        ("*/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "wheel_ppocr_cls", {"x": [1, 3, 48, 192]}),
    ],
    "openwakeword==0.5.1": [
        ("*/embedding_model.onnx", "wheel_oww_embedding", {"input_1": [1, 76, 32, 1]}),
        ("*/melspectrogram.onnx", "wheel_oww_melspectrogram", {"input": [1, 1280]}),
    ],
}
FIXTURE_MODELS = {
    "torch_convtasnet.onnx": ("convtasnet_asteroid", {"mix": [1, 8000]}),
    "torch_convtasnet_causal.onnx": ("convtasnet_asteroid_causal", {"mix": [1, 8000]}),
    "torchaudio_convtasnet.onnx": ("convtasnet_torchaudio", {"mix": [1, 1, 8000]}),
    "silero_vad.onnx": ("wheel_silero_vad", {"input": [1, 512], "state": [2, 1, 128]}),
}
QUANTIZE = ["convtasnet_asteroid", "tv_deeplabv3", "smp_unet_mnv3_odd"]


def torch_models() -> dict:
    import segmentation_models_pytorch as smp
    import torchvision

    unet_bilinear = {"decoder_interpolation": "bilinear"}
    try:
        smp.Unet("resnet18", encoder_weights=None, **unet_bilinear)
    except TypeError:  # older smp: nearest only
        unet_bilinear = {}
    return {
        "smp_unet_mnv3_odd": lambda: smp.Unet("timm-mobilenetv3_large_100", encoder_weights=None, classes=3,
                                              decoder_channels=(99, 51, 27, 13, 7)),
        "smp_unet_bilinear": lambda: smp.Unet("resnet18", encoder_weights=None, classes=2, **unet_bilinear),
        "smp_linknet": lambda: smp.Linknet("resnet18", encoder_weights=None, classes=2),
        "smp_deeplabv3plus": lambda: smp.DeepLabV3Plus("resnet18", encoder_weights=None, classes=5),
        "tv_deeplabv3": lambda: torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=5, aux_loss=False),
        "tv_lraspp": lambda: torchvision.models.segmentation.lraspp_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=5),
    }


class _FirstOutput:
    """torchvision segmentation models return a dict: export its 'out'."""

    def __new__(cls, model):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = model

            def forward(self, x):
                y = self.inner(x)
                return y["out"] if isinstance(y, dict) else y

        return Wrapped()


def export_torch(out: str, manifest: dict) -> None:
    import torch

    for seed, (name, build) in enumerate(torch_models().items()):
        torch.manual_seed(seed)
        try:
            model = _FirstOutput(build()).eval()
            path = os.path.join(out, f"{name}.onnx")
            torch.onnx.export(model, torch.randn(*IMAGE), path, input_names=["image"], output_names=["out"],
                              opset_version=17, dynamo=False)
        except Exception as exc:  # one model that does not build must not stop the others
            print(f"skip {name}: {type(exc).__name__}: {exc}")
            continue
        manifest[name] = {"file": f"{name}.onnx", "input_shapes": {"image": list(IMAGE)},
                          "source": f"torch {torch.__version__}, classic exporter, opset 17"}
        print(f"wrote {name}")


def copy_fixtures(out: str, manifest: dict) -> None:
    for file, (name, shapes) in FIXTURE_MODELS.items():
        shutil.copyfile(os.path.join(FIXTURES, file), os.path.join(out, f"{name}.onnx"))
        entry = {"file": f"{name}.onnx", "source": f"fixtures/{file}"}
        if shapes:
            entry["input_shapes"] = shapes
        if name == "wheel_silero_vad":  # its integer sample-rate input decides shapes: npufix needs it frozen
            entry["npufix_args"] = ["--freeze-input", "sr=16000"]
        manifest[name] = entry


def from_wheels(out: str, manifest: dict) -> None:
    import fnmatch

    with tempfile.TemporaryDirectory() as tmp:
        for spec, wanted in WHEELS.items():
            done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, spec],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                print(f"skip {spec}: pip download failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            wheel = glob.glob(os.path.join(tmp, spec.split("==")[0].replace("-", "_") + "-*"))
            with zipfile.ZipFile(wheel[0]) as archive:
                for pattern, name, shapes in wanted:
                    members = [m for m in archive.namelist() if fnmatch.fnmatch(m, pattern)]
                    if not members:
                        print(f"skip {name}: no {pattern} in {os.path.basename(wheel[0])}")
                        continue
                    with archive.open(members[0]) as src, open(os.path.join(out, f"{name}.onnx"), "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    manifest[name] = {"file": f"{name}.onnx", "source": f"{spec}: {members[0]}"}
                    if shapes:
                        manifest[name]["input_shapes"] = shapes
                    print(f"wrote {name}")


def _Feeds(base: type, feeds: list[dict]):
    """An onnxruntime CalibrationDataReader over a list of feeds."""

    class Reader(base):
        def __init__(self) -> None:
            self.items = iter(feeds)

        def get_next(self):
            return next(self.items, None)

    return Reader()


def quantize(out: str, manifest: dict) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    for name in QUANTIZE:
        if name not in manifest:
            continue
        entry = manifest[name]
        shapes = entry.get("input_shapes") or {}
        model = onnx.load(os.path.join(out, entry["file"]))
        for vi in model.graph.input:  # freeze the judged shapes before quantizing
            if vi.name in shapes:
                for dim, size in zip(vi.type.tensor_type.shape.dim, shapes[vi.name]):
                    dim.Clear()
                    dim.dim_value = size
        # onnxruntime's symbolic shape inference writes temporary files into the working directory
        with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
            static, pre = os.path.join(tmp, "static.onnx"), os.path.join(tmp, "pre.onnx")
            onnx.save(model, static)
            try:
                quant_pre_process(static, pre)
            except Exception as exc:  # onnxruntime's symbolic shape inference gives up on some exports
                print(f"{name}: quant_pre_process without symbolic shapes ({type(exc).__name__}: {exc})")
                quant_pre_process(static, pre, skip_symbolic_shape=True)
            rng = np.random.default_rng(0)
            feeds = [{k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()} for _ in range(8)]
            qname = f"{name}_qdq"
            try:
                quantize_static(pre, os.path.join(out, f"{qname}.onnx"), _Feeds(CalibrationDataReader, feeds),
                                quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                                weight_type=QuantType.QInt8)
            except Exception as exc:  # one model that does not quantize must not stop the others
                print(f"skip {qname}: {type(exc).__name__}: {exc}")
                continue
        manifest[qname] = {"file": f"{qname}.onnx", "input_shapes": shapes,
                           "source": f"{name} quantized by onnxruntime (quant_pre_process + quantize_static QDQ)"}
        print(f"wrote {qname}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--skip", action="append", default=[], choices=["torch", "wheels", "quantize"])
    args = parser.parse_args()
    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    manifest_path = os.path.join(out, "models.json")
    manifest = json.load(open(manifest_path)) if os.path.exists(manifest_path) else {}
    copy_fixtures(out, manifest)
    if "torch" not in args.skip:
        export_torch(out, manifest)
    if "wheels" not in args.skip:
        from_wheels(out, manifest)
    if "quantize" not in args.skip:
        quantize(out, manifest)
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    print(f"{len(manifest)} models in {manifest_path}")


if __name__ == "__main__":
    main()
