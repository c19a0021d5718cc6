"""The ``npufix`` command: parse options, call the library, print the summary, choose the exit code.

Exit codes: 0 success; 1 the model could not be made valid (a pass failed validation, or constraints remain
violated); 2 usage error or unusable input. The summary goes to stderr; nothing is printed on stdout except
what was asked for (--list-passes, --check output, --dump-shapes).
"""

from __future__ import annotations

import gc
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
    """Exit 2 with a one-line message: control characters in names or paths are escaped, never printed raw."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message))


def _one_line(text: str) -> str:
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


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


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 118},
               epilog=EXAMPLE)
@click.argument("models", nargs=-1, type=click.Path(dir_okay=True))
@click.option("-o", "--output", type=click.Path(), help="Where to write the fixed model (written atomically).")
@click.option("--target", help="An NPU profile (see --list-targets) or a path to a profile .toml; explicit options "
                               "override it.")
@click.option("--list-targets", is_flag=True, help="List the shipped target profiles with their sources and exit.")
@click.option("--check", is_flag=True, help="Write nothing: list every constraint violation (exit 1 if any).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="--check output, and the run summary on stdout with json.")
@click.option("--dump-shapes", is_flag=True, help="Print every node's input and output shapes (stdout).")
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
@click.option("--max-approx-error", type=click.FloatRange(min=0), default=0.5, show_default=True,
              help="Relative L2 error allowed per output for approximate passes.")
@click.option("--max-rank", type=click.IntRange(min=1), default=None, help="Largest tensor rank the NPU accepts.")
@click.option("--sram", "sram", default=None, metavar="SIZE",
              help="Activation-memory budget for the memory estimate, e.g. 384KiB, 2MiB.")
@click.option("--act-bytes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Bytes per activation element in the memory estimate (1 int8, 4 float32).")
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
@click.option("--rtol", type=click.FloatRange(min=0), default=1e-4, show_default=True,
              help="Relative tolerance of exact passes.")
@click.option("--atol", type=click.FloatRange(min=0), default=1e-5, show_default=True,
              help="Absolute tolerance of exact passes (scaled by max(1, max|output|)).")
@click.option("--validate", "validate_policy", type=click.Choice(["each", "final", "none"]), default="each",
              show_default=True, help="Validate after every changed pass, once at the end, or never.")
@click.option("--no-validate", is_flag=True, help="Same as --validate none.")
@click.option("--keep-going", is_flag=True,
              help="Roll back a pass that fails validation and continue (default: stop, write nothing).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="Write the build record (JSON) here.")
# --- emission forms (issue 13): target facts a profile sets, overridable here ---
@click.option("--remainder-pad", type=click.Choice(["concat", "pad4d", "pad"]), default="concat", show_default=True,
              help="How dilated-conv pads a remainder: Concat with zeros, a Pad on a 4-D view, or a plain Pad.")
@click.option("--lift-conv1d/--no-lift-conv1d", default=False,
              help="Run 1-D Convs as 4-D ones ([B,C,1,L], kernel [1,K]) for compilers that want 4-D convs.")
@click.option("--force-rewrite", is_flag=True,
              help="Rewrite convs even when the target runs every candidate form's ops on its CPU.")
@click.option("--max-convtranspose-stride", type=click.IntRange(min=1), default=None,
              help="Largest ConvTranspose stride; exact Resize forms above it are split into stages.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
@click.option("-v", "--verbose", count=True, help="More detail: every change and rejection (-vv: tracebacks).")
@click.version_option(__version__, "--version")
@click.pass_context
def main(ctx: click.Context, **params: Any) -> None:
    """Rewrite an ONNX MODEL so embedded NPU compilers accept it, and prove with onnxruntime that the
    rewrite changed nothing the model computes."""
    # A run allocates millions of small objects (maps over every node) that reference counting frees; the cyclic
    # collector would walk them over and over for nothing: 1.5 s of a 10 s run at 100k nodes. The process is
    # short-lived, so it is off for the run (and back on after it, for callers that invoke main in-process).
    collecting = gc.isenabled()
    gc.disable()
    try:
        _main(ctx, **params)
    except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
        raise
    except Exception as exc:  # noqa: BLE001 - a bug must still end in one line and a non-zero exit
        if params.get("verbose", 0) > 1:
            raise
        click.echo(f"error: internal error ({type(exc).__name__}: {_one_line(str(exc))[:300]}); nothing written; "
                   f"rerun with -vv for the traceback and report it", err=True)
        ctx.exit(1)
    finally:
        if collecting:
            gc.enable()


def _main(ctx: click.Context, models: tuple[str, ...], output: str | None, target: str | None,
          list_targets: bool, check: bool, output_format: str, dump_shapes: bool, only: str | None,
          skip: str | None, list_passes: bool, report_path: str | None, quiet: bool, verbose: int,
          **opts: Any) -> None:
    from onnx_npu_fix import api

    if list_passes:
        click.echo(_render_pass_list(), nl=False)
        return
    if list_targets:
        from onnx_npu_fix import targets

        click.echo(targets.render_target_list(targets.list_targets()), nl=False)
        return
    if not models:
        raise click.UsageError("missing MODEL (an .onnx file)")
    if len(models) > 1 and (not check or report_path):
        raise click.UsageError("several MODELs are only accepted by --check without --report (e.g. a pre-commit hook)")
    if output is None and not check:
        raise click.UsageError("missing -o/--output (where to write the fixed model), or use --check")
    model = models[0]
    started = time.perf_counter()
    _setup_logging(quiet, verbose)
    try:
        options = _build_options(ctx, target, opts)
        if check:
            exit_code = 0
            for path in models:
                if len(models) > 1 and output_format == "text":
                    click.echo(f"== {path}")
                source = api.read_model(path)
                loaded = source.model
                if report_path:
                    _check_report_path(report_path, path, None, source.external_files)
                code, checked = _run_check(loaded, options, output_format, dump_shapes, quiet)
                exit_code = max(exit_code, code)
                if report_path:
                    _write_json(report_path, _record(path, None, options, None, time.perf_counter() - started,
                                                     code, checked))
            ctx.exit(exit_code)
        passes = api.select_passes(_split_names(only), _split_names(skip) or ())
        api.check_output_path(output, model)
        reference = None
        early = api.EarlyWrite(output)
        try:
            loaded = api.read_model(model)
            # Only a model that passed the onnx checker goes to onnxruntime: malformed graphs can crash it.
            reference = api.start_reference(model, options)
            api.check_output_path(output, model, protected=loaded.external_files)
            if report_path:
                _check_report_path(report_path, model, output, loaded.external_files)
            external = bool(loaded.external_files)
            result = api.fix(loaded.model, options, passes, reference=reference,
                             on_serialized=None if external else early.start, source=model)
        except BaseException:
            early.close()
            raise
        finally:
            if reference is not None:
                reference.close()
    except InputError as exc:
        raise _InputProblem(str(exc)) from None

    report = result.report
    _print_passes(report, quiet, verbose)
    exit_code = 0
    written = None
    checked = None
    if not result.ok:
        early.close()
        failed = report.failed_pass
        if failed is not None:
            click.echo(f"error: pass {failed.name} failed: {failed.error}; nothing written "
                       f"(--skip {failed.name} to run without it, or --keep-going to roll it back)", err=True)
        else:
            click.echo(f"error: the output does not match the original ({_final_problem(report.final)}); "
                       f"nothing written", err=True)
        exit_code = 1
    else:
        from onnx_npu_fix.constraints import check_model

        try:
            checked = check_model(result.model, options, shapes=dump_shapes, prepared=True,
                                  memory=bool(report_path) or output_format == "json")
            api.save_model(result.model, output, external_data=external or None, serialized=result.serialized,
                           early=early)
        except OSError as exc:
            raise _InputProblem(f"cannot write {output}: {exc.strerror or exc}; nothing written") from None
        finally:
            early.close()
        written = output
        if report.final is not None:
            kind = "exact" if report.final.exact else "approximate"
            _say(quiet, f"{'output vs input':<16} {kind}: max abs {report.final.max_abs:.2e}, "
                        f"max rel {report.final.max_rel:.2e}")
        if checked.violations:
            exit_code = 1
            for violation in checked.violations:
                click.echo(f"unfixed: {violation.text()}", err=True)
            for pass_name, rejection in report.blocking:
                click.echo(f"  why: {rejection.node} ({rejection.op}): {rejection.reason} [{pass_name}]", err=True)
        if verbose:
            for note in checked.exempt:
                _say(quiet, f"exempt: {note.text()} ({note.message})")
        if dump_shapes and checked.shapes is not None:
            from onnx_npu_fix.constraints import render_shapes

            click.echo(render_shapes(checked.shapes))
        _say(quiet, f"wrote {output}")
    # The record hashes both models (0.2 s at 100 MB): built only when someone reads it.
    wanted = report_path or output_format == "json"
    record = _record(model, written, options, result, time.perf_counter() - started, exit_code, checked) \
        if wanted else {}
    if report_path:
        try:
            _write_json(report_path, record)
        except OSError as exc:
            raise _InputProblem(f"cannot write the report {report_path}: {exc.strerror or exc}") from None
    if output_format == "json":
        click.echo(json.dumps(record, indent=2, default=str))
    ctx.exit(exit_code)


# Option name on the command line -> FixOptions field, for everything that becomes an option.
_OPTION_FIELDS = {
    "max_dilation": "max_dilation", "s2b_layout": "s2b_layout", "align": "align", "align_io": "align_io",
    "bn_standalone": "bn_standalone", "resize_mode": "resize_mode", "max_approx_error": "max_approx_error",
    "max_rank": "max_rank", "sram": "sram_bytes", "act_bytes": "act_bytes", "large_tensor": "large_tensor_bytes",
    "input_shape": "input_shapes", "seed": "seed", "n_inputs": "n_inputs", "rtol": "rtol", "atol": "atol",
    "validate_policy": "validate", "keep_going": "keep_going",
}
_OPTION_FIELDS.update({  # emission forms (issue 13)
    "remainder_pad": "remainder_pad", "lift_conv1d": "lift_conv1d", "force_rewrite": "force_rewrite",
    "max_convtranspose_stride": "max_convtranspose_stride",
})


def _build_options(ctx: click.Context, target: str | None, opts: dict[str, Any]) -> FixOptions:
    """FixOptions from the command line; with --target, the profile's values unless given explicitly."""
    from click.core import ParameterSource

    values: dict[str, Any] = {}
    explicit: dict[str, Any] = {}
    for param, field_name in _OPTION_FIELDS.items():
        value = opts[param]
        if param == "input_shape":
            value = _parse_input_shape(value)
        elif param == "sram" and value is not None:
            from onnx_npu_fix.targets import parse_size

            try:
                value = parse_size(value)
            except (InputError, ValueError):
                raise click.BadParameter(f"'{value}' is not a size like 384KiB or 2MiB", param_hint="--sram") \
                    from None
        values[field_name] = value
        if ctx.get_parameter_source(param) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            explicit[field_name] = value
    if opts["no_validate"]:
        values["validate"] = explicit["validate"] = "none"
    base = FixOptions(**values)
    if target is None:
        return base
    from onnx_npu_fix.targets import apply_target, load_target

    return apply_target(load_target(target), base, explicit)


def _run_check(model, options: FixOptions, output_format: str, dump_shapes: bool, quiet: bool):
    """--check: print the violations (and memory estimate) of the input model; exit code 0 when clean."""
    from onnx_npu_fix.constraints import check_model, render_check

    report = check_model(model, options, shapes=dump_shapes)
    if output_format == "json":
        click.echo(json.dumps(report.to_json(), indent=2, default=str))
    elif not quiet or report.violations:
        click.echo(render_check(report))
    return (0 if report.clean else 1), report


def _render_pass_list() -> str:
    from onnx_npu_fix.passes import DEFAULT_ORDER, PASSES

    lines = []
    for name, cls in PASSES.items():
        kind = "exact" if cls.exact else "approximate"
        extra = "" if cls in DEFAULT_ORDER else " (opt-in: run with --passes)"
        lines.append(f"{name:<16} {kind:<12} {cls.summary}{extra}")
    return "\n".join(lines) + "\n"


def _print_passes(report, quiet: bool, verbose: int) -> None:
    from onnx_npu_fix.report import render_pass_line

    for record in report.passes:
        _say(quiet, render_pass_line(record))
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


def _final_problem(final) -> str:
    if final is None:
        return "not compared"
    if final.error:
        return final.error
    worst = final.worst
    return f"output '{worst.name}': max abs {worst.max_abs:.3g}, rel L2 {worst.rel_l2:.3g}; {final.criterion}"


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


def _record(model_path: str, output_path: str | None, options: FixOptions, result, seconds: float,
            exit_code: int, checked=None) -> dict[str, Any]:
    """The build record (README, "Build record"): what ran, on what, with which result."""
    from dataclasses import asdict

    from onnx_npu_fix.report import REPORT_VERSION

    record: dict[str, Any] = {
        "report_version": REPORT_VERSION,
        "npufix_version": __version__,
        "mode": "fix" if result is not None else "check",
        "command": sys.argv,
        "options": asdict(options),
        "input": {"path": model_path, "sha256": _sha256(model_path)},
        "output": {"path": output_path, "sha256": _sha256(output_path)} if output_path else None,
        "exit_code": exit_code,
        "seconds": round(seconds, 4),
    }
    if result is not None:
        record.update(result.report.to_json())
    else:  # a check run: same keys, nothing ran
        record.update({"passes": [], "final_validation": None, "validation_note": None, "warnings": []})
    record["violations"] = [v.to_json() for v in checked.violations] if checked is not None else None
    record["exempt"] = [v.to_json() for v in checked.exempt] if checked is not None else None
    record["memory"] = checked.memory.to_json() if checked is not None and checked.memory else None
    return record


def _check_report_path(report_path: str, model: str, output: str | None, protected=()) -> None:
    """The report must not land on the input or the output model, and must be writable (checked up front)."""
    from onnx_npu_fix import api

    for other, what in ((model, "the input model"), (output, "the output model")):
        if other and os.path.abspath(report_path) == os.path.abspath(other):
            raise InputError(f"--report {report_path} is {what}; choose another path")
    api.check_output_path(report_path, model, protected=protected, what="--report")


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
