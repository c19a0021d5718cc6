"""Judge: Qualcomm HTP (QNN) context generation with onnxruntime-qnn, offline on x86_64 (no device needed).

Run by the onnxruntime-qnn venv's Python (vendor/judge_qnn.sh). The QNN execution provider (a plugin library of
onnxruntime) compiles the model for the HTP of the given arch (v73 by default) and writes an EP context model;
CPU fallback is disabled, so a node the HTP backend does not take rejects the model; cpu_ops = the nodes
the backend refused (they would run on the CPU with fallback on). Accepted = the session is
created and the context model written; rejected = the backend's own error line (e.g. "backendValidateOpConfig
... Concat error 3110"). Qualcomm's libraries are only run here, never copied.
"""

from __future__ import annotations

import os
import re
import time

import onnx

from onnx_npu_fix.judges.common import Verdict, error_line, finish, input_shapes, parser, run_captured, workdir

# "[W:onnxruntime:, qnn_model_wrapper.cc:565 CreateQnnNode] QNN.backendValidateOpConfig() failed for node `Concat5`
#  of type `Concat` with error code 3110"
_REFUSED_NODE = re.compile(r"(\w+\.\w+\(\) failed for node `([^`]*)` of type `(\w+)`.*)$")


def compile_context(model_path: str, out: str, htp_arch: str, soc_model: str) -> list[str]:
    import onnxruntime as ort
    import onnxruntime_qnn as qnn

    ort.register_execution_provider_library("QNNExecutionProvider", qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    options = ort.SessionOptions()
    options.add_session_config_entry("ep.context_enable", "1")
    options.add_session_config_entry("ep.context_file_path", out)
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    options.log_severity_level = 2
    options.add_provider_for_devices(devices, {"backend_path": qnn.get_qnn_htp_path(), "htp_arch": htp_arch,
                                               "soc_model": soc_model})
    return ort.InferenceSession(model_path, options).get_providers()


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--htp-arch", default="73")
    p.add_argument("--soc-model", default="60", help="QNN soc model id (60: SM8550, an HTP v73 part)")
    args = p.parse_args()
    started = time.time()
    model_path = os.path.abspath(args.model)
    input_shapes(onnx.load(model_path, load_external_data=False), args.input_shape)  # static shapes required
    work = workdir(args)
    out = os.path.join(work, "ctx.onnx")
    if os.path.exists(out):  # onnxruntime refuses to overwrite a context model
        os.remove(out)
    _, error, log = run_captured(lambda: compile_context(model_path, out, args.htp_arch, args.soc_model),
                                 os.path.join(work, "qnn.log"))
    refused = [m for m in map(_REFUSED_NODE.search, log.splitlines()) if m]
    cpu = list(dict.fromkeys((m.group(3), m.group(2)) for m in refused))  # each node is validated more than once
    if error is not None:
        message = refused[0].group(1).strip()[-300:] if refused else error_line(str(error))
        finish(args, Verdict(False, message, cpu, {"exception": str(error).strip()[-300:]}), started)
    finish(args, Verdict(os.path.exists(out), "HTP context written" if os.path.exists(out) else "no context",
                         cpu),
           started)


if __name__ == "__main__":
    main()
