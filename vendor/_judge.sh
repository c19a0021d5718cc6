# Sourced by the judge_*.sh wrappers: run_judge PYTHON NAME ARGS... runs the judge onnx_npu_fix/judges/NAME.py as
# `python -m onnx_npu_fix.judges.NAME ARGS...` with PYTHON (the vendor toolchain's interpreter, which has numpy and
# onnx but not npufix) and this checkout first on its path. Not `-m` itself: that puts the working directory first,
# so from inside another checkout that checkout's package would run.
run_judge() {
    judge_python="$1" judge_name="$2"
    shift 2
    judge_root="$(cd "$(dirname "$0")/.." && pwd)"
    exec "$judge_python" -c 'import runpy, sys
sys.path[0] = sys.argv.pop(1)
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)' \
        "$judge_root" "onnx_npu_fix.judges.$judge_name" "$@"
}
