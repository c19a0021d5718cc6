"""The ``npufix`` command: parse options, call the library (api.run), print the summary, exit with its code.

Exit codes (errors.py, README "Exit codes"): 0 success; 1 requested constraints violated; 2 usage error or
unusable input; 3 a pass failed, nothing written; 4 --strict refused an approximate change; 5 internal error;
130 / 141 / 143 SIGINT / closed stdout / SIGTERM. The summary goes to stderr; nothing is printed on stdout
except what was asked for (--list-passes, --check output, --dump-shapes, --format json).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import signal
import sys
import threading
from typing import Any

import click

from onnx_npu_fix import __version__
from onnx_npu_fix.config.options import CHOICES, FixOptions
from onnx_npu_fix.errors import (
    EXIT_INTERNAL,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_USAGE,
    InputError,
    NpufixError,
    OptionError,
)

EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: stdout was closed (e.g. `npufix --check ... | head -1`)

EXAMPLE = """\b
Example (the CI step before a vendor compiler):
  npufix model.onnx -o fixed.onnx --max-dilation 4 --align 8 --report npufix.json
  npufix tcn.onnx -o tcn_fixed.onnx --input-shape mix:1,1,16000 --max-dilation 4
"""


class _InputProblem(click.ClickException):
    """A one-line error (exit 2 unless told): control characters in names or paths are escaped, never printed
    raw."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(_one_line(message))
        self.exit_code = exit_code


class _OneLineCommand(click.Command):
    """click's command with its usage errors on one line (README: errors are one line): click prints
    ``Usage: …``, ``Try '… -h' for help.`` and ``Error: …``; a CI log wants the last one only."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _InputProblem(exc.format_message()) from None


class _Terminated(BaseException):
    """SIGTERM (what CI sends on cancel), raised in the main thread so that every ``finally`` cleans up."""


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
        if not parsed:  # the dims' range is FixOptions' rule (options.check_value), as for a profile's
            raise click.BadParameter(f"'{value}' is not NAME:D1,D2,... (e.g. input:1,1,16000)",
                                     param_hint="--input-shape")
        shapes[name] = parsed
    return shapes


def _choice(field_name: str) -> click.Choice:
    """The values FixOptions accepts for ``field_name`` (options.CHOICES), as click's choice type."""
    return click.Choice(list(CHOICES[field_name]))


def _split_names(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


@click.command(cls=_OneLineCommand, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 118},
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
@click.option("--s2b-layout", type=_choice("s2b_layout"), default="auto",
              show_default=True, help="Layout of the space-to-batch rewrite (dilated-conv).")
@click.option("--align", type=click.IntRange(min=0), default=8, show_default=True,
              help="Conv channel alignment (0 disables align-channels).")
@click.option("--align-io", is_flag=True, help="Also align graph-input channels inside the graph (a Pad node).")
@click.option("--bn-standalone", type=_choice("bn_standalone"), default="mul-add", show_default=True,
              help="How a BatchNormalization with no Conv to fold into is lowered.")
@click.option("--resize-mode", type=_choice("resize_mode"), default="nearest", show_default=True,
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
@click.option("--plugin", "plugins", multiple=True, metavar="MODULE:NAME|FILE.py[:NAME]|NAME",
              help="Load a plugin pass (repeatable); it joins the run (see README, Plugin passes).")
@click.option("--input-shape", multiple=True, metavar="NAME:D1,D2,...",
              help="Freeze a graph input's shape (repeatable), e.g. input:1,1,16000.")
@click.option("--freeze-input", multiple=True, metavar="NAME=VALUE",
              help="Replace a graph input by a constant (repeatable): a number, 1,2,3, [[1,2],[3,4]] or an .npy "
                   "file, e.g. sr=16000. The model no longer takes that input; what depends on it folds.")
@click.option("--large-tensor", type=click.IntRange(min=0), default=1 << 20, show_default=True,
              help="fold-constants does not create constants above this many bytes.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the validation inputs.")
@click.option("--validation-inputs", "n_inputs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Number of random input sets per validation.")
@click.option("--rtol", type=click.FloatRange(min=0), default=1e-4, show_default=True,
              help="Relative tolerance of exact passes.")
@click.option("--atol", type=click.FloatRange(min=0), default=1e-5, show_default=True,
              help="Absolute tolerance of exact passes (scaled by max(1, max|output|)).")
@click.option("--quant-steps", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Tolerance of outputs made by a DequantizeLinear, in their quantization steps.")
@click.option("--validate", "validate_policy", type=_choice("validate"), default="each",
              show_default=True, help="Validate after every changed pass, once at the end, or never.")
@click.option("--no-validate", is_flag=True, help="Same as --validate none.")
@click.option("--validation-data", type=click.Path(), default=None, metavar="FILE.npz|DIR",
              help="Validate on these inputs instead of generated ones: an .npz keyed by input name (one set), "
                   "or a folder of .npz files / <input>.npy files.")
@click.option("--input-range", multiple=True, metavar="NAME:LO,HI",
              help="Range of generated values for an input (repeatable): floats uniform, integers inclusive.")
@click.option("--strict", is_flag=True,
              help="Refuse any approximate change (exit 4, nothing written) instead of measuring it.")
@click.option("--keep-going", is_flag=True,
              help="Roll back a pass that fails validation and continue (default: stop, write nothing).")
# --- fitting SRAM (README "Fitting SRAM"): segments, user cuts, the memory picture ---------------------------
@click.option("--split", "split_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="After fixing, cut the model into segments that each fit --sram; write them and "
                   "DIR/manifest.json (DIR must be new or empty).")
@click.option("--split-at", "split_at", metavar="TENSOR,...",
              help="With --split: also cut right after the producer of each of these tensors.")
@click.option("--memory-plot", "memory_plot", type=click.Path(dir_okay=False), metavar="FILE",
              help="Draw live activation bytes per step (.png or .svg; needs onnx-npu-fix[plot]).")
@click.option("--schedule-budget", "schedule_budget", type=click.IntRange(min=0), default=None, metavar="N",
              help="States the exact schedule search may expand (default 20000; 0: greedy orders only).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="Write the build record (JSON) here.")
# --- emission forms (issue 13): target facts a profile sets, overridable here ---
@click.option("--remainder-pad", type=_choice("remainder_pad"), default="concat", show_default=True,
              help="How dilated-conv pads a remainder: Concat with zeros, a Pad on a 4-D view, or a plain Pad.")
@click.option("--lift-conv1d/--no-lift-conv1d", default=False,
              help="Run 1-D Convs as 4-D ones ([B,C,1,L], kernel [1,K]) for compilers that want 4-D convs.")
@click.option("--force-rewrite", is_flag=True,
              help="Rewrite convs even when the target runs every candidate form's ops on its CPU.")
@click.option("--max-convtranspose-stride", type=click.IntRange(min=1), default=None,
              help="Largest ConvTranspose stride; exact Resize forms above it are split into stages.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors, the unfixed: lines and the APPROXIMATE: line.")
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
    previous = _catch_sigterm()
    try:
        _main(ctx, **params)
    except click.UsageError as exc:  # raised by the checks after parsing: one line too (_OneLineCommand)
        raise _InputProblem(exc.format_message()) from None
    except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
        raise
    except BrokenPipeError:
        _stdout_closed()
        ctx.exit(EXIT_CLOSED_PIPE)
    except KeyboardInterrupt as exc:
        click.echo(f"error: interrupted; {_written(exc)}", err=True)
        ctx.exit(EXIT_SIGINT)
    except _Terminated as exc:
        click.echo(f"error: terminated (SIGTERM); {_written(exc)}", err=True)
        ctx.exit(EXIT_SIGTERM)
    except Exception as exc:  # noqa: BLE001 - a bug must still end in one line and a non-zero exit
        if params.get("verbose", 0) > 1:
            raise
        click.echo(f"error: internal error ({type(exc).__name__}: {_one_line(str(exc))[:300]}); nothing written; "
                   f"rerun with -vv for the traceback and report it", err=True)
        ctx.exit(EXIT_INTERNAL)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if collecting:
            gc.enable()


def _written(exc: BaseException) -> str:
    """What a signal left on disk: nothing, unless it came while the run's files were renamed into place (held
    until the commit was complete: io.save.Transaction), and then all of them."""
    written = getattr(exc, "npufix_written", None)
    if not written:
        return "nothing written"
    return f"it came as the run's files were committed, which completed first: written {', '.join(written)}"


def _catch_sigterm():
    """Turn SIGTERM into _Terminated for the run (main thread only); returns the handler to restore."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminate(signum, frame):
        raise _Terminated()

    return signal.signal(signal.SIGTERM, terminate)


def _stdout_closed() -> None:
    """The reader of stdout went away: point stdout at /dev/null so that the interpreter's final flush does not
    print a BrokenPipeError either."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _main(ctx: click.Context, models: tuple[str, ...], output: str | None, target: str | None,
          list_targets: bool, check: bool, output_format: str, dump_shapes: bool, only: str | None,
          skip: str | None, list_passes: bool, report_path: str | None, quiet: bool, verbose: int,
          plugins: tuple[str, ...] = (), **opts: Any) -> None:
    from onnx_npu_fix import api
    split_dir, memory_plot = opts.pop("split_dir"), opts.pop("memory_plot")
    split_at, schedule_budget = _split_names(opts.pop("split_at")), opts.pop("schedule_budget")
    if list_passes:
        try:
            click.echo(_render_pass_list(api.list_passes(plugins)), nl=False)
        except InputError as exc:
            raise _InputProblem(str(exc)) from None
        return
    if list_targets:
        from onnx_npu_fix.config import targets
        click.echo(targets.render_target_list(targets.list_targets()), nl=False)
        return
    if not models:
        raise click.UsageError("missing MODEL (an .onnx file)")
    if len(models) > 1 and (not check or report_path):
        raise click.UsageError("several MODELs are only accepted by --check without --report (e.g. a pre-commit hook)")
    if check and opts["freeze_input"]:
        # --check reports on the model as given; checking another model than the one named would mislead.
        raise click.UsageError("--freeze-input does not apply to --check (it checks the model as given); fix "
                               "the model with --freeze-input first, then --check the output")
    if check and memory_plot and len(models) > 1:
        raise click.UsageError("--memory-plot draws one model: give one MODEL with --check --memory-plot")
    if output is None and not check:
        raise click.UsageError("missing -o/--output (where to write the fixed model), or use --check")
    _setup_logging(quiet, verbose)
    try:
        options = _build_options(ctx, target, opts, check)
        fitting: dict[str, Any] = {"split_at": tuple(split_at or ())}
        if schedule_budget is not None:
            fitting["schedule_budget"] = schedule_budget
        options = dataclasses.replace(options, **fitting)
        if check:
            ctx.exit(_check_models(models, options, output_format, dump_shapes, report_path, quiet, verbose,
                                   memory_plot))
        passes = api.select_passes(_split_names(only), _split_names(skip) or (), plugins=plugins)
        outcome = api.run(models[0], output, options, passes=passes, report_path=report_path, shapes=dump_shapes,
                          record=output_format == "json", split_dir=split_dir, memory_plot=memory_plot)
    except NpufixError as exc:
        raise _InputProblem(str(exc), exc.exit_code) from None
    _print_outcome(outcome, quiet, verbose, dump_shapes)
    if output_format == "json":
        from onnx_npu_fix.io.save import dumps

        click.echo(dumps(outcome.record))
    ctx.exit(outcome.exit_code)


_DEFAULTS_LINE = ("checking npufix's default constraints (align 8, nearest Resize, no BatchNormalization, "
                  "no Dropout/Identity, static shapes); --target or constraint options choose what to check")


def _check_models(models: tuple[str, ...], options: FixOptions, output_format: str, dump_shapes: bool,
                  report_path: str | None, quiet: bool, verbose: int, memory_plot: str | None = None) -> int:
    """--check over every model: findings prefixed with the file, like ruff; with --format json one document
    (the model's object, or an array of them with several models). Returns the exit code (the worst)."""
    from onnx_npu_fix import api
    if options.requested is None:
        _say(quiet or output_format == "json", _DEFAULTS_LINE)
    exit_code = 0
    documents = []
    for path in models:
        try:
            outcome = api.run(path, options=options, check=True, report_path=report_path, shapes=dump_shapes,
                              memory_plot=memory_plot if len(models) == 1 else None)
        except NpufixError as exc:
            if len(models) == 1:
                raise
            click.echo(f"{_one_line(path)}: error: {_one_line(str(exc))}", err=True)
            documents.append({"path": path, "error": str(exc)})
            exit_code = max(exit_code, exc.exit_code)
            continue
        exit_code = max(exit_code, outcome.exit_code)
        if output_format == "json":
            documents.append(_check_json(path, outcome))
        else:
            _print_check(path, outcome, quiet, verbose)
    if output_format == "json":
        from onnx_npu_fix.io.save import dumps

        click.echo(dumps(documents[0] if len(models) == 1 else documents))
    return exit_code


def _check_json(path: str, outcome) -> dict[str, Any]:
    data = {"path": path, **outcome.checked.to_json()}
    data["clean"] = not outcome.violations
    data["violations"] = [v.to_json() for v in outcome.violations]
    data["not_requested"] = [{**v.to_json(), "reason": why} for v, why in outcome.not_requested]
    return data


def _print_check(path: str, outcome, quiet: bool, verbose: int) -> None:
    """One line per finding, ``model.onnx: node (op): constraint: value vs limit -> fix``; then (unless -q) the
    summary, the exempt findings, the memory estimate and the shapes."""
    from onnx_npu_fix.analysis.constraints import render_shapes, violations_summary
    from onnx_npu_fix.analysis.memory import render_memory

    prefix = _one_line(path) + ": "
    checked = outcome.checked
    if outcome.violations:  # one write: an echo per line costs more than the check itself at 6,000 findings
        click.echo("\n".join(prefix + violation.text() for violation in outcome.violations))
    if quiet:
        return
    if verbose:
        for violation, why in outcome.not_requested:
            click.echo(f"{prefix}{violation.text()} ({why}, not counted)")
    elif outcome.not_requested:
        click.echo(f"{prefix}{_findings(len(outcome.not_requested))} of constraints not asked for "
                   f"{'is' if len(outcome.not_requested) == 1 else 'are'} not counted "
                   f"(-v lists them)")
    click.echo(prefix + violations_summary(outcome.violations))
    if checked.exempt:
        click.echo("\n" + "\n".join(f"exempt: {v.text()} ({v.message})" for v in checked.exempt))
    if checked.memory is not None:
        click.echo("\n" + render_memory(checked.memory))
    if checked.shapes is not None:
        click.echo("\n" + render_shapes(checked.shapes))


def _print_outcome(outcome, quiet: bool, verbose: int, dump_shapes: bool) -> None:
    report = outcome.report
    for name, frozen in report.frozen_inputs.items():
        shown = frozen["value"] if "value" in frozen else f"<sha256 {frozen['sha256'][:12]}…>"
        _say(quiet, f"frozen input {name} = {shown} ({frozen['dtype']} {frozen['shape']}): the model no longer "
                    f"takes it")
    _print_passes(report, quiet, verbose)
    if outcome.error:
        click.echo(f"error: {outcome.error}", err=True)
        return
    checked = outcome.checked
    if report.final is not None:
        from onnx_npu_fix.pipeline.report import scaled_atol_note
        from onnx_npu_fix.pipeline.validate import quant_summary  # onnx and onnxruntime: not at start-up (--version)

        kind = "exact" if report.final.exact else "approximate"
        _say(quiet, f"{'output vs input':<16} {kind}: max abs {report.final.max_abs:.2e}, "
                    f"max rel {report.final.max_rel:.2e}{quant_summary(report.final)}{scaled_atol_note(report.final)}")
    if report.cost is not None:
        from onnx_npu_fix.analysis.cost import render_cost

        for line in render_cost(*report.cost):
            _say(quiet, line)
    _print_findings(outcome, quiet, verbose)
    if verbose:
        for note in checked.exempt:
            _say(quiet, f"exempt: {note.text()} ({note.message})")
    if dump_shapes and checked.shapes is not None:
        from onnx_npu_fix.analysis.constraints import render_shapes

        click.echo(render_shapes(checked.shapes))
    _print_fitting(outcome, quiet)
    _say(quiet, f"wrote {outcome.written}")
    _print_validation_verdict(report, quiet)


def _print_findings(outcome, quiet: bool, verbose: int) -> None:
    """The violations left in the output (with the rejections that left them) and those that do not count."""
    if outcome.violations:
        for violation in outcome.violations:
            click.echo(f"unfixed: {violation.text()}", err=True)
        for pass_name, rejection in outcome.report.blocking:
            click.echo(f"  why: {rejection.node} ({rejection.op}): {rejection.reason} [{pass_name}]", err=True)
    defaults = [v for v, why in outcome.not_requested if why == "not requested"]
    for violation, why in outcome.not_requested:
        if why != "not requested":
            _say(quiet, f"warning: {violation.text()} ({why}; not counted)")
        elif verbose:
            _say(quiet, f"not requested: {violation.text()}")
    if defaults and not verbose:
        _say(quiet, f"note: {_findings(len(defaults))} of constraints not asked for "
                    f"{'remains' if len(defaults) == 1 else 'remain'} (npufix's defaults, not "
                    f"counted; -v lists them, --target or options make them count)")


def _print_fitting(outcome, quiet: bool) -> None:
    """The --memory-plot and --split lines (README "Fitting SRAM")."""
    from onnx_npu_fix.ir.graph import format_bytes

    if outcome.memory_plot:
        _say(quiet, f"wrote {outcome.memory_plot} (and {outcome.memory_plot}.json)")
    split = outcome.split
    if split is None:
        return
    plan = split.plan
    if not split.fits:  # the sram-layer violation names the layer and what would fit
        node, op, size = plan.blocking[0]
        click.echo(f"{'split':<16} not possible: {node} ({op}) alone needs {format_bytes(size)} > SRAM "
                   f"{format_bytes(plan.sram_bytes)}; no segments written", err=True)
        return
    peaks = " / ".join(format_bytes(s.peak_bytes) for s in plan.segments)
    crossing = ", ".join(format_bytes(b) for b in plan.crossing_bytes) or "none"
    check = split.validation
    verdict = f"not validated: {split.note}" if split.note else "not validated" if check is None else \
        f"chained segments bit-exact (max abs {check.max_abs:.1e})"
    _say(quiet, f"{'split':<16} {len(plan.segments)} segment{'s' if len(plan.segments) != 1 else ''}, peaks "
                f"{peaks}; crossing {crossing}; {verdict}")
    _say(quiet, f"wrote {os.path.join(split.directory, 'manifest.json')}")


# Option name on the command line -> FixOptions field, for everything that becomes an option. An option whose
# parameter name is the field's name needs no entry (_option_fields): a new option is a click decorator and a
# FixOptions field, nothing else.
_OPTION_FIELDS = {
    "max_dilation": "max_dilation", "s2b_layout": "s2b_layout", "align": "align", "align_io": "align_io",
    "bn_standalone": "bn_standalone", "resize_mode": "resize_mode", "max_approx_error": "max_approx_error",
    "max_rank": "max_rank", "sram": "sram_bytes", "act_bytes": "act_bytes", "large_tensor": "large_tensor_bytes",
    "input_shape": "input_shapes", "seed": "seed", "n_inputs": "n_inputs", "rtol": "rtol", "atol": "atol",
    "validate_policy": "validate", "keep_going": "keep_going", "freeze_input": "freeze_inputs",
    "validation_data": "validation_data", "input_range": "input_ranges", "strict": "strict",
}
_OPTION_FIELDS.update({  # emission forms (issue 13)
    "remainder_pad": "remainder_pad", "lift_conv1d": "lift_conv1d", "force_rewrite": "force_rewrite",
    "max_convtranspose_stride": "max_convtranspose_stride",
})


def _build_options(ctx: click.Context, target: str | None, opts: dict[str, Any], check: bool = False) -> FixOptions:
    """FixOptions from the command line; with --target, the profile's values unless given explicitly.

    Which constraints count (FixOptions.requested): the target's and the explicitly given ones. In check mode
    with neither, npufix's defaults (``requested`` None, and a line says so)."""
    from click.core import ParameterSource

    values: dict[str, Any] = {}
    explicit: dict[str, Any] = {}
    for param, field_name in _option_fields(opts).items():
        value = opts[param]
        if param == "input_shape":
            value = _parse_input_shape(value)
        elif param == "freeze_input":
            from onnx_npu_fix.pipeline.freeze import parse_freeze_specs

            value = parse_freeze_specs(value)
        elif param == "input_range":
            from onnx_npu_fix.pipeline.inputs import parse_input_ranges

            try:
                parse_input_ranges(value)
            except InputError as exc:
                raise click.BadParameter(str(exc), param_hint="--input-range") from None
        elif param == "sram" and value is not None:
            from onnx_npu_fix.config.targets import parse_size

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
    from onnx_npu_fix.analysis.constraints import ASKED_BY

    asks = {f for fields in ASKED_BY.values() for f in fields}
    defaults = check and target is None and not (asks & set(explicit))
    values["requested"] = None if defaults else {name: "option" for name in explicit}
    try:
        base = FixOptions(**values)
        if target is None:
            return base
        from onnx_npu_fix.config.targets import apply_target, load_target

        return apply_target(load_target(target), base, explicit)
    except OptionError as exc:
        raise click.BadParameter(str(exc), param_hint=_option_name(ctx, exc.field)) from None


def _option_fields(params: dict[str, Any]) -> dict[str, str]:
    """Command-line parameter -> FixOptions field: the parameters named like a field, and _OPTION_FIELDS."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(FixOptions)}
    return {**{p: p for p in params if p in names}, **_OPTION_FIELDS}


def _option_name(ctx: click.Context, field_name: str) -> str:
    """The command-line spelling of a FixOptions field (e.g. n_inputs -> --validation-inputs)."""
    for param, name in _option_fields({p.name: None for p in ctx.command.params}).items():
        if name == field_name:
            for option in ctx.command.params:
                if option.name == param:
                    return option.opts[-1] if option.opts[-1].startswith("--") else option.opts[0]
    return field_name


def _render_pass_list(rows) -> str:
    lines = []
    for cls, name, where in rows:
        if cls is None:
            lines.append(f"{name:<16} {'-':<12} {where}")
            continue
        kind = "exact" if cls.exact else "approximate"
        extra = {"default": "", "opt-in": " (opt-in: run with --passes)"}.get(where, f" ({where})")
        lines.append(f"{name:<16} {kind:<12} {cls.summary}{extra}")
    return "\n".join(lines) + "\n"


def _print_passes(report, quiet: bool, verbose: int) -> None:
    from onnx_npu_fix.pipeline.report import render_pass_line
    from onnx_npu_fix.pipeline.scheduler import NOT_VALIDATED

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
    if report.validation_note and report.validation_note != NOT_VALIDATED:  # that one ends the summary
        _say(quiet, f"note: {report.validation_note}")
    if verbose > 1:
        for warning in report.warnings:
            _say(quiet, warning)


def _print_validation_verdict(report, quiet: bool) -> None:
    """The summary's last line when the output is not fully validated or not exact."""
    from onnx_npu_fix.pipeline.report import approximation_summary
    from onnx_npu_fix.pipeline.scheduler import NOT_VALIDATED

    if report.validation_note == NOT_VALIDATED:
        _say(quiet, report.validation_note)
    approximate = approximation_summary(report)
    if approximate:  # -q keeps it, as it keeps the unfixed: lines: a quiet run must not pass off an approximation
        click.echo(approximate, err=True)


def _findings(n: int) -> str:
    return f"{n} finding{'' if n == 1 else 's'}"


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        click.echo(text, err=True)


def _setup_logging(quiet: bool, verbose: int) -> None:
    level = logging.ERROR if quiet else (logging.DEBUG if verbose > 1 else logging.WARNING)
    logging.basicConfig(level=level, format="%(levelname)s: %(message)s", stream=sys.stderr)
