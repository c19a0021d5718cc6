"""The ``npufix`` command: parse options, call the library, print the summary, choose the exit code.

Exit codes: 0 success; 1 the model could not be made valid (a pass failed validation, or constraints remain
violated); 2 usage error or unusable input. The summary goes to stderr; nothing is printed on stdout except
what was asked for (--list-passes, --check output, --dump-shapes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from typing import Any

import click

from onnx_npu_fix import __version__
from onnx_npu_fix.errors import InputError
from onnx_npu_fix.options import FixOptions

EXAMPLE = """\b
Example (the CI step before a vendor compiler):
  npufix model.onnx -o fixed.onnx --max-dilation 4 --align 8 --report npufix.json
  npufix tcn.onnx -o tcn_fixed.onnx --input-shape mix:1,1,16000 --max-dilation 4
"""


class _InputProblem(click.ClickException):
    exit_code = 2


def _parse_input_shape(values: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values:
        name, sep, dims = value.rpartition(":")
        try:
            parsed = tuple(int(d) for d in dims.split(",")) if sep and name else None
        except ValueError:
            parsed = None
        if not parsed or any(d < 0 for d in parsed):
            raise click.BadParameter(f"'{value}' is not NAME:D1,D2,... (e.g. input:1,1,16000)",
                                     param_hint="--input-shape")
        shapes[name] = parsed
    return shapes


def _split_names(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
               epilog=EXAMPLE)
@click.argument("model", required=False, type=click.Path(dir_okay=True))
@click.option("-o", "--output", type=click.Path(), help="Where to write the fixed model (written atomically).")
@click.option("--max-dilation", type=click.IntRange(min=1), default=None,
              help="Largest Conv dilation the NPU accepts; larger ones are rewritten by space-to-batch.")
@click.option("--s2b-layout", type=click.Choice(["auto", "spatial", "channel", "batch"]), default="auto",
              show_default=True, help="Layout of the space-to-batch rewrite (dilated-conv).")
@click.option("--align", type=click.IntRange(min=0), default=8, show_default=True,
              help="Conv channel alignment (0 disables align-channels).")
@click.option("--align-io", is_flag=True, help="Also align graph-input channels inside the graph (a Pad node).")
@click.option("--bn-standalone", type=click.Choice(["mul-add", "conv"]), default="mul-add", show_default=True,
              help="How a BatchNormalization with no Conv to fold into is lowered.")
@click.option("--resize-mode", type=click.Choice(["nearest", "exact"]), default="nearest", show_default=True,
              help="nearest: linear/cubic Resize becomes nearest (approximate, measured); exact: exact "
                   "ConvTranspose/MatMul forms where they exist.")
@click.option("--max-approx-error", type=click.FloatRange(min=0), default=None,
              help="Relative L2 error allowed per output for approximate passes [default: 0.5].")
@click.option("--passes", "only", help="Run only these passes (comma-separated, default order kept).")
@click.option("--skip", help="Skip these passes (comma-separated).")
@click.option("--list-passes", is_flag=True, help="List the passes in their default order and exit.")
@click.option("--input-shape", multiple=True, metavar="NAME:D1,D2,...",
              help="Freeze a graph input's shape (repeatable), e.g. input:1,1,16000.")
@click.option("--large-tensor", type=click.IntRange(min=0), default=1 << 20, show_default=True,
              help="fold-constants does not create constants above this many bytes.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the validation inputs.")
@click.option("--validation-inputs", "n_inputs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Number of random input sets per validation.")
@click.option("--rtol", type=float, default=1e-4, show_default=True, help="Relative tolerance of exact passes.")
@click.option("--atol", type=float, default=1e-5, show_default=True,
              help="Absolute tolerance of exact passes (scaled by max(1, max|output|)).")
@click.option("--validate", "validate_policy", type=click.Choice(["each", "final", "none"]), default="each",
              show_default=True, help="Validate after every changed pass, once at the end, or never.")
@click.option("--no-validate", is_flag=True, help="Same as --validate none.")
@click.option("--keep-going", is_flag=True,
              help="Roll back a pass that fails validation and continue (default: stop, write nothing).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="Write the build record (JSON) here.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
@click.option("-v", "--verbose", count=True, help="More detail: every change and rejection (-vv: tracebacks).")
@click.version_option(__version__, "--version")
@click.pass_context
def main(ctx: click.Context, model: str | None, output: str | None, only: str | None, skip: str | None,
         list_passes: bool, input_shape: tuple[str, ...], no_validate: bool, validate_policy: str,
         report_path: str | None, quiet: bool, verbose: int, **opts: Any) -> None:
    """Rewrite an ONNX MODEL so embedded NPU compilers accept it, and prove with onnxruntime that the
    rewrite changed nothing the model computes."""
    from onnx_npu_fix import api
    from onnx_npu_fix.passes import DEFAULT_ORDER, PASSES

    if list_passes:
        for cls in DEFAULT_ORDER:
            kind = "exact" if cls.exact else "approximate"
            click.echo(f"{cls.name:<16} {kind:<12} {cls.summary}")
        for name, cls in PASSES.items():
            if cls not in DEFAULT_ORDER:
                click.echo(f"{name:<16} {'exact' if cls.exact else 'approximate':<12} {cls.summary} (opt-in)")
        return
    if model is None:
        raise click.UsageError("missing MODEL (an .onnx file)")
    if output is None:
        raise click.UsageError("missing -o/--output (where to write the fixed model)")
    started = time.perf_counter()
    options = FixOptions(
        max_dilation=opts["max_dilation"], s2b_layout=opts["s2b_layout"], align=opts["align"],
        align_io=opts["align_io"], bn_standalone=opts["bn_standalone"], resize_mode=opts["resize_mode"],
        max_approx_error=opts["max_approx_error"] if opts["max_approx_error"] is not None else 0.5,
        large_tensor_bytes=opts["large_tensor"], input_shapes=_parse_input_shape(input_shape),
        validate="none" if no_validate else validate_policy, n_inputs=opts["n_inputs"], seed=opts["seed"],
        rtol=opts["rtol"], atol=opts["atol"], keep_going=opts["keep_going"],
    )
    _setup_logging(quiet, verbose)
    try:
        passes = api.select_passes(_split_names(only), _split_names(skip) or ())
        api.check_output_path(output, model)
        loaded = api.load_model(model)
        result = api.fix(loaded, options, passes)
    except InputError as exc:
        raise _InputProblem(str(exc)) from None

    report = result.report
    for record in report.passes:
        _say(quiet, _pass_line(record))
        if verbose:
            for change in record.changes:
                _say(quiet, f"    {change.node} ({change.op}): {change.action}"
                     + (f" {change.old} -> {change.new}" if change.old is not None else ""))
            for rejection in record.rejections:
                _say(quiet, f"    kept {rejection.node} ({rejection.op}): {rejection.reason}")
        for warning in record.warnings:
            _say(quiet, f"    warning: {warning}")
    if report.validation_note:
        _say(quiet, f"note: {report.validation_note}")
    if verbose > 1:
        for warning in report.warnings:
            _say(quiet, warning)

    blocking = report.blocking
    exit_code = 0
    if not result.ok:
        failed = report.failed_pass
        if failed is not None:
            click.echo(f"error: pass {failed.name} failed: {failed.error}; nothing written "
                       f"(--skip {failed.name} to run without it, or --keep-going to roll it back)", err=True)
        else:
            click.echo(f"error: the output does not match the original: {report.final.error or report.final.worst}"
                       f"; nothing written", err=True)
        exit_code = 1
    else:
        api.save_model(result.model, output)
        if report.final is not None:
            kind = "exact" if report.final.criterion.startswith("|a-b|") else "approximate"
            _say(quiet, f"{'output vs input':<16} {kind}: max abs {report.final.max_abs:.2e}, "
                        f"max rel {report.final.max_rel:.2e}")
        for pass_name, rejection in blocking:
            click.echo(f"unfixed: {rejection.node} ({rejection.op}): {rejection.reason} [{pass_name}]", err=True)
        if blocking:
            exit_code = 1
        _say(quiet, f"wrote {output}")
    if report_path:
        _write_record(report_path, model, output if exit_code == 0 or (result.ok and blocking) else None,
                      options, result, time.perf_counter() - started, exit_code)
    ctx.exit(exit_code)


def _pass_line(record) -> str:
    from onnx_npu_fix.report import render_pass_line

    return render_pass_line(record)


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        click.echo(text, err=True)


def _setup_logging(quiet: bool, verbose: int) -> None:
    level = logging.ERROR if quiet else (logging.DEBUG if verbose > 1 else logging.WARNING)
    logging.basicConfig(level=level, format="%(levelname)s: %(message)s", stream=sys.stderr)


def _sha256(path: str | None) -> str | None:
    if path is None or not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_record(path: str, model_path: str, output_path: str | None, options: FixOptions, result,
                  seconds: float, exit_code: int) -> None:
    from dataclasses import asdict

    from onnx_npu_fix.report import REPORT_VERSION

    record = {
        "report_version": REPORT_VERSION,
        "npufix_version": __version__,
        "command": sys.argv,
        "options": asdict(options),
        "input": {"path": model_path, "sha256": _sha256(model_path)},
        "output": {"path": output_path, "sha256": _sha256(output_path)} if output_path else None,
        "exit_code": exit_code,
        "seconds": round(seconds, 4),
        **result.report.to_json(),
    }
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)
