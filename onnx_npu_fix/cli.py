"""The ``npufix`` command: parse options, call the library (api.run), print the summary, exit with its code.

Exit codes (errors.py; README and docs/cli.md): 0 success; 1 requested constraints violated; 2 usage error or
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

# `npufix --help` starts with these (command, what it does), then lists the options in OPTION_GROUPS; the CLI
# reference in docs/ is generated from the same definitions (docs/hooks.py).
EXAMPLES = (
    ("npufix model.onnx -o fixed.onnx --max-dilation 4 --align 8 --report npufix.json",
     "fix, prove it with onnxruntime, write the build record"),
    ("npufix fixed.onnx --check --target stm32n6", "list what the NPU would still reject (exit 1 if anything)"),
    ("npufix model.onnx --dump-shapes", "every node's input and output shapes (the first debugging step)"),
    ("npufix tcn.onnx -o tcn_fixed.onnx --input-shape mix:1,1,16000 --max-dilation 4",
     "freeze a dynamic input's shape first"),
)
EXIT_CODES_LINE = ("Exit codes: 0 success; 1 requested constraints violated; 2 usage error or unusable input; "
                   "3 a pass failed; 4 --strict refused an approximation; 5 internal error; 130 / 143 interrupted. "
                   "A fixing run writes its output only with 0 or 1.")

FIXING = "Fixing"
VALIDATION = "Validation"
CONSTRAINTS = "Constraints and targets"
MEMORY = "Memory"
JUDGING = "Compiler in the loop"
OUTPUT = "Output and report"
OPTION_GROUPS = (FIXING, VALIDATION, CONSTRAINTS, MEMORY, JUDGING, OUTPUT)
"""The --help sections, in order. Every option names its group (_option); -h/--help joins the last one."""


class _GroupedOption(click.Option):
    """A click option that knows which --help section it belongs to."""

    def __init__(self, *args: Any, group: str, **kwargs: Any) -> None:
        if group not in OPTION_GROUPS:
            raise ValueError(f"unknown option group {group!r}")
        super().__init__(*args, **kwargs)
        self.group = group


def _option(group: str, *param_decls: str, **attrs: Any):
    """click.option in one of OPTION_GROUPS."""
    return click.option(*param_decls, cls=_GroupedOption, group=group, **attrs)


def _judge_options(*, required: bool):
    """The judge's options (docs/reduce.md), one definition for ``npufix reduce`` (``required``) and a fixing
    run's ``--judge``."""
    decorators = (
        _option(JUDGING, "--judge", "judge_command", required=required, default=None, metavar="CMD",
                help="Shell command that compiles a model: {model} is its path, {dir} a fresh scratch directory. "
                     "The model fails when it exits non-zero (or per --fail-regex / --pass-regex)."),
        _option(JUDGING, "--fail-regex", multiple=True, metavar="RE",
                help="Judge output matching RE is a failure (repeatable)."),
        _option(JUDGING, "--pass-regex", multiple=True, metavar="RE",
                help="A model passes only when the judge's output matches RE (repeatable; the exit status is "
                     "ignored)."),
        _option(JUDGING, "--judge-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
                metavar="SECONDS", help="Per-call limit; a call that exceeds it is a timeout (neither pass nor fail)."),
        _option(JUDGING, "--signature", default=None, metavar="RE",
                help="The failure's signature is RE's first match in the judge's output (group 1 if any), not the "
                     "first error line."),
    )

    def decorate(function):
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return decorate


def _make_judge(judge_command: str, fail_regex: tuple[str, ...], pass_regex: tuple[str, ...],
                judge_timeout: float | None, signature: str | None):
    from onnx_npu_fix.judge.command import Judge

    return Judge(judge_command, fail_regex=fail_regex, pass_regex=pass_regex, timeout=judge_timeout,
                 signature=signature)


def _check_judging(judging: dict[str, Any], check: bool) -> None:
    """A fixing run's judge options make sense together (click.UsageError otherwise)."""
    if judging["judge_command"] is None and any(v for k, v in judging.items() if k != "judge_command"):
        raise click.UsageError("--fail-regex, --pass-regex, --judge-timeout and --signature need --judge CMD")
    if check and judging["judge_command"] is not None:
        raise click.UsageError("--judge judges a fixing run's output: use it with -o, not with --check")


class _InputProblem(click.ClickException):
    """A one-line error (exit 2 unless told): control characters in names or paths are escaped, never printed
    raw."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(_one_line(message))
        self.exit_code = exit_code


class _OneLineCommand(click.Command):
    """click's command with its usage errors on one line (errors are one line: a CI log wants the last of click's
    ``Usage: …``, ``Try '… -h' for help.`` and ``Error: …``), and a --help that shows the examples first, then
    the options in their groups."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _InputProblem(exc.format_message()) from None

    examples: tuple[tuple[str, str], ...] = EXAMPLES
    exit_codes_line: str = EXIT_CODES_LINE

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        with formatter.section("Examples"):
            for command, what in self.examples:  # a command is never wrapped: it must stay copyable
                formatter.write(f"{'':>{formatter.current_indent}}{command}\n")
                with formatter.indentation():
                    formatter.write_text(what)
        self.format_options(ctx, formatter)
        formatter.write_paragraph()
        formatter.write_text(self.exit_codes_line)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: dict[str, list[tuple[str, str]]] = {group: [] for group in OPTION_GROUPS}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is not None:
                rows[getattr(param, "group", OUTPUT)].append(record)
        for group, records in rows.items():
            if records:
                with formatter.section(group):
                    formatter.write_dl(records)


class _Dispatching(_OneLineCommand):
    """``npufix reduce ...`` (the first argument exactly ``reduce``) runs the reduce command; anything else is
    the fixing / checking command. A model file named ``reduce`` is reached as ``npufix ./reduce ...`` or
    ``npufix -- reduce ...``."""

    def main(self, args: Any = None, prog_name: str | None = None, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if argv[:1] == ["reduce"]:
            return reduce_command.main(argv[1:], prog_name=f"{prog_name or 'npufix'} reduce", **extra)
        if argv[:1] == ["probe"]:
            return probe_command.main(argv[1:], prog_name=f"{prog_name or 'npufix'} probe", **extra)
        return super().main(args, prog_name, **extra)


class _Terminated(BaseException):
    """SIGTERM (what CI sends on cancel), raised in the main thread so that every ``finally`` cleans up."""


def _one_line(text: str) -> str:
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _parse_input_shape(values: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values:
        # NAME:D1,D2,... or, for a model with one input, D1,D2,... (onnxsim's nameless form; name "" resolved
        # by ir.graph.set_input_shapes)
        name, sep, dims = value.rpartition(":")
        try:
            parsed = tuple(int(d) for d in dims.split(",")) if name or not sep else None
        except ValueError:
            parsed = None
        if not parsed:  # the dims' range is FixOptions' rule (options.check_value), as for a profile's
            raise click.BadParameter(f"'{value}' is not [NAME:]D1,D2,... (e.g. input:1,1,16000, or 1,3,224,224 "
                                     f"for a model with one input)", param_hint="--input-shape")
        if name in shapes:
            raise click.BadParameter(f"input {f'{name!r}' if name else 'without a name'} is given twice",
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


@click.command(cls=_Dispatching, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 118})
@click.argument("models", nargs=-1, type=click.Path(dir_okay=True))
@_option(FIXING, "-o", "--output", type=click.Path(),
         help="Where to write the fixed model (a temporary file renamed into place; external data next to it "
              "when the input had external data or the model is above 2 GB).")
@_option(CONSTRAINTS, "--target",
         help="An NPU profile (see --list-targets) or a path to a profile .toml; explicit options override it.")
@_option(CONSTRAINTS, "--list-targets", is_flag=True,
         help="List the shipped target profiles with their sources and exit.")
@_option(CONSTRAINTS, "--check", is_flag=True,
         help="Write nothing: list every constraint violation (exit 1 if any). Several MODELs may be given.")
@_option(OUTPUT, "--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="--check output; with json in a fixing run, the build record on stdout.")
@_option(OUTPUT, "--dump-shapes", is_flag=True,
         help="Print every node's input and output shapes (stdout); without -o it runs as --check --dump-shapes.")
@_option(CONSTRAINTS, "--max-dilation", type=click.IntRange(min=1), default=None,
              help="Largest Conv dilation the NPU accepts; larger ones are rewritten by space-to-batch.")
@_option(FIXING, "--s2b-layout", type=_choice("s2b_layout"), default="auto",
              show_default=True, help="Layout of the space-to-batch rewrite (dilated-conv).")
@_option(CONSTRAINTS, "--align", type=click.IntRange(min=0), default=8, show_default=True,
              help="Conv channel alignment (0 disables align-channels).")
@_option(FIXING, "--align-io", is_flag=True, help="Also align graph-input channels inside the graph (a Pad node).")
@_option(FIXING, "--bn-standalone", type=_choice("bn_standalone"), default="mul-add", show_default=True,
              help="How a BatchNormalization with no Conv to fold into is lowered.")
@_option(FIXING, "--resize-mode", type=_choice("resize_mode"), default="nearest", show_default=True,
              help="nearest: linear/cubic Resize becomes nearest (approximate, measured); exact: exact "
                   "ConvTranspose/MatMul forms where they exist.")
@_option(VALIDATION, "--max-approx-error", type=click.FloatRange(min=0), default=0.5, show_default=True,
              help="Relative L2 error allowed per output for approximate passes.")
@_option(CONSTRAINTS, "--max-rank", type=click.IntRange(min=1), default=None,
         help="Largest tensor rank the NPU accepts (checked; no pass lowers a rank).")
@_option(MEMORY, "--sram", "sram", default=None, metavar="SIZE",
              help="Activation-memory budget for the memory estimate, e.g. 384KiB, 2MiB (units B, KiB, MiB, GiB or "
                   "K, M, G; KB/MB are refused as ambiguous; whole bytes).")
@_option(MEMORY, "--act-bytes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Bytes per activation element in the memory estimate (1 int8, 4 float32).")
@_option(FIXING, "--passes", "only", help="Run only these passes (comma-separated, default order kept).")
@_option(FIXING, "--skip", help="Skip these passes (comma-separated).")
@_option(FIXING, "--list-passes", is_flag=True,
         help="List the passes (plugins included) in their default order and exit.")
@_option(FIXING, "--plugin", "plugins", multiple=True, metavar="MODULE:NAME|FILE.py[:NAME]|NAME",
              help="Load a plugin pass (repeatable); it joins the run (see docs/plugins.md).")
@_option(FIXING, "--input-shape", multiple=True, metavar="[NAME:]D1,D2,...",
              help="Freeze a graph input's shape (repeatable), e.g. input:1,1,16000, like onnxsim's "
                   "--overwrite-input-shape; no name for a model with one input.")
@_option(FIXING, "--freeze-input", multiple=True, metavar="NAME=VALUE",
              help="Replace a graph input by a constant (repeatable): a number, 1,2,3, [[1,2],[3,4]] or an .npy "
                   "file, e.g. sr=16000. The model no longer takes that input; what depends on it folds. A "
                   "fixing-run option: --check reads the model as given.")
@_option(FIXING, "--large-tensor", type=click.IntRange(min=0), default=1 << 20, show_default=True,
              help="fold-constants does not create constants above this many bytes.")
@_option(VALIDATION, "--seed", type=int, default=0, show_default=True, help="Seed of the validation inputs (>= 0).")
@_option(VALIDATION, "--validation-inputs", "n_inputs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Number of random input sets per validation (an exact candidate bit-identical to the model "
                   "before it on the first set runs only that one: see the manual's Validation page).")
@_option(VALIDATION, "--rtol", multiple=True, metavar="[OUTPUT:]VALUE",
         help="Relative tolerance of exact passes (default 1e-4); OUTPUT:VALUE sets one graph output's "
              "(repeatable, as polygraphy).")
@_option(VALIDATION, "--atol", multiple=True, metavar="[OUTPUT:]VALUE",
         help="Absolute tolerance of exact passes, scaled by max(1, max|output|) (default 1e-5); "
              "OUTPUT:VALUE sets one graph output's (repeatable).")
@_option(VALIDATION, "--quant-steps", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Tolerance of outputs made by a DequantizeLinear, in their quantization steps.")
@_option(VALIDATION, "--validate", "validate_policy", type=_choice("validate"), default="each",
              show_default=True, help="Validate after every changed pass, once at the end, or never (none writes the "
                                     "model unvalidated and says so last).")
@_option(VALIDATION, "--no-validate", is_flag=True, help="Same as --validate none.")
@_option(VALIDATION, "--validation-data", type=click.Path(), default=None, metavar="FILE.npz|FILE.json|DIR",
              help="Validate on these inputs instead of generated ones: an .npz keyed by input name (one set), "
                   "Polygraphy's --save-inputs JSON (its sets), or a folder of .npz / .json / <input>.npy files.")
@_option(VALIDATION, "--save-inputs", "save_inputs", type=click.Path(dir_okay=False), metavar="FILE.json",
              help="Write the inputs the run validated with, in Polygraphy's JSON (polygraphy run --load-inputs); "
                   "also when validation fails.")
@_option(VALIDATION, "--input-range", multiple=True, metavar="NAME:LO,HI",
              help="Range of generated values for an input (repeatable): floats uniform, integers inclusive.")
@_option(VALIDATION, "--strict", is_flag=True,
              help="Refuse any approximate change (exit 4, nothing written) instead of measuring it.")
@_option(VALIDATION, "--keep-going", is_flag=True,
              help="Roll back a pass that fails validation and continue (default: stop, write nothing).")
# --- fitting SRAM (docs/memory.md): segments, user cuts, the memory picture -----------------------------------
@_option(MEMORY, "--split", "split_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="After fixing, cut the model into segments that each fit --sram; write them and "
                   "DIR/manifest.json (DIR must be new or empty).")
@_option(MEMORY, "--split-at", "split_at", metavar="TENSOR,...",
              help="With --split: also cut right after the producer of each of these tensors.")
@_option(MEMORY, "--memory-plot", "memory_plot", type=click.Path(dir_okay=False), metavar="FILE",
              help="Draw live activation bytes per step (.png or .svg; needs matplotlib).")
@_option(MEMORY, "--schedule-budget", "schedule_budget", type=click.IntRange(min=0), default=None, metavar="N",
              help="States the exact schedule search may expand (reorder-memory, the estimate, --split; "
                   "default 20000; 0: greedy orders only).")
@_option(OUTPUT, "--report", "report_path", type=click.Path(dir_okay=False),
              help="Write the build record (strict JSON) here; not the input, the output or their external "
                   "data (checked before any work).")
# --- emission forms: target facts a profile sets, overridable here ---
@_option(FIXING, "--remainder-pad", type=_choice("remainder_pad"), default="concat", show_default=True,
              help="How dilated-conv pads a remainder: Concat with zeros, a Pad on a 4-D view, or a plain Pad.")
@_option(FIXING, "--lift-conv1d/--no-lift-conv1d", default=False,
              help="Run 1-D Convs as 4-D ones ([B,C,1,L], kernel [1,K]) for compilers that want 4-D convs.")
@_option(FIXING, "--force-rewrite", is_flag=True,
              help="Rewrite convs even when the target runs every candidate form's ops on its CPU.")
@_option(FIXING, "--fold-pad-into-conv/--no-fold-pad-into-conv", default=False,
         help="Fold a constant zero Pad into the following Conv's pads (exact; the Rockchip profiles set it).")
@_option(FIXING, "--max-convtranspose-stride", type=click.IntRange(min=1), default=None,
              help="Largest ConvTranspose stride; exact Resize forms above it are split into stages.")
@_option(FIXING, "--resize-separable/--no-resize-separable", default=False,
         help="Run exact ConvTranspose Resize forms as one stage per axis, each with a 1-D kernel (exact).")
@_judge_options(required=False)
@_option(OUTPUT, "--progress/--no-progress", "show_progress", default=None,
         help="A progress line for validation sets and long searches (default: when stderr is a terminal "
              "and not -q; pass lines are printed as each pass finishes either way).")
@_option(OUTPUT, "-q", "--quiet", is_flag=True, help="Print only errors, the unfixed: lines and the APPROXIMATE: line.")
@_option(OUTPUT, "-v", "--verbose", count=True, help="More detail: every change and rejection (-vv: tracebacks).")
@click.version_option(__version__, "--version", cls=_GroupedOption, group=OUTPUT)
@click.pass_context
def main(ctx: click.Context, **params: Any) -> None:
    """Rewrite an ONNX MODEL so embedded NPU compilers accept it, and prove with onnxruntime that the
    rewrite changed nothing the model computes.

    `npufix reduce MODEL --judge CMD -o MIN.onnx` finds the smallest model a compiler still rejects (see
    `npufix reduce --help`); with `--judge CMD` a fixing run's output must pass that compiler, and npufix tries
    the other forms it knows for what the compiler rejects (docs/reduce.md)."""
    _guarded(ctx, params.get("verbose", 0), lambda: _main(ctx, **params))


def _guarded(ctx: click.Context, verbose: int, body: Any) -> None:
    """Run a command's ``body`` with the process-wide rules of every npufix command: the cyclic collector off,
    SIGTERM as an exception, and every way out a one-line message and its exit code (README "Exit codes")."""
    # A run allocates millions of small objects (maps over every node) that reference counting frees; the cyclic
    # collector would walk them over and over for nothing, a large share of a long graph's run. The process is
    # short-lived, so it is off for the run (and back on after it, for callers that invoke main in-process).
    collecting = gc.isenabled()
    gc.disable()
    previous = _catch_sigterm()
    try:
        body()
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
        if verbose > 1:
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
    until the commit was complete: io.atomic.Transaction), and then all of them; after ``npufix probe --report``,
    the partial record."""
    written = getattr(exc, "npufix_written", None)
    partial = getattr(exc, "npufix_partial", None)
    if partial is not None:
        return f"wrote only the partial record {partial} (interrupted: true)"
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
          plugins: tuple[str, ...] = (), show_progress: bool | None = None, **opts: Any) -> None:
    from onnx_npu_fix import api
    split_dir, memory_plot, save_inputs = opts.pop("split_dir"), opts.pop("memory_plot"), opts.pop("save_inputs")
    split_at, schedule_budget = _split_names(opts.pop("split_at")), opts.pop("schedule_budget")
    judging = {k: opts.pop(k) for k in ("judge_command", "fail_regex", "pass_regex", "judge_timeout", "signature")}
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
    if output is None and dump_shapes:  # the first debugging step needs no -o: it is --check --dump-shapes
        check = True
    if len(models) > 1 and (not check or report_path):
        raise click.UsageError("several MODELs are only accepted by --check without --report (e.g. a pre-commit hook)")
    if check and opts["freeze_input"]:
        # --check reports on the model as given; checking another model than the one named would mislead.
        raise click.UsageError("--freeze-input does not apply to --check (it checks the model as given); fix "
                               "the model with --freeze-input first, then --check the output")
    if check and memory_plot and len(models) > 1:
        raise click.UsageError("--memory-plot draws one model: give one MODEL with --check --memory-plot")
    if check and save_inputs:
        raise click.UsageError("--save-inputs writes the inputs a fixing run validated with; --check validates "
                               "nothing")
    if output is None and not check:
        raise click.UsageError("missing -o/--output (where to write the fixed model), or use --check")
    _check_judging(judging, check)
    _setup_logging(quiet, verbose)
    shown = _Progress(quiet, verbose, _wants_progress_line(show_progress, quiet))
    try:
        options = _build_options(ctx, target, opts, check)
        fitting: dict[str, Any] = {"split_at": tuple(split_at or ())}
        if schedule_budget is not None:
            fitting["schedule_budget"] = schedule_budget
        options = dataclasses.replace(options, **fitting)
        if check:
            ctx.exit(_check_models(models, options, output_format, dump_shapes, report_path, quiet, verbose,
                                   memory_plot, shown))
        passes = api.select_passes(_split_names(only), _split_names(skip) or (), plugins=plugins)
        judge = _make_judge(**judging) if judging["judge_command"] is not None else None  # JudgeError: exit 2
        outcome = api.run(models[0], output, options, passes=passes, report_path=report_path, shapes=dump_shapes,
                          record=output_format == "json", split_dir=split_dir, memory_plot=memory_plot,
                          save_inputs=save_inputs, on_event=shown, judge=judge)
    except NpufixError as exc:
        raise _InputProblem(str(exc), exc.exit_code) from None
    finally:
        shown.close()
    _print_outcome(outcome, quiet, verbose, dump_shapes, shown.printed)
    if output_format == "json":
        from onnx_npu_fix.io.save import dumps

        click.echo(dumps(outcome.record))
    ctx.exit(outcome.exit_code)


_DEFAULTS_LINE = ("checking npufix's default constraints (align 8, nearest Resize, no BatchNormalization, "
                  "no Dropout/Identity, static shapes); --target or constraint options choose what to check")


def _check_models(models: tuple[str, ...], options: FixOptions, output_format: str, dump_shapes: bool,
                  report_path: str | None, quiet: bool, verbose: int, memory_plot: str | None = None,
                  shown: _Progress | None = None) -> int:
    """--check over every model: findings prefixed with the file, like ruff; with --format json one document
    (report.check_document: an object whose ``models`` holds one entry per model). Returns the exit code (the
    worst)."""
    from onnx_npu_fix import api
    from onnx_npu_fix.pipeline.report import check_document, check_entry, check_error_entry
    if options.requested is None:
        _say(quiet or output_format == "json", _DEFAULTS_LINE)
    exit_code = 0
    documents = []
    for path in models:
        try:
            outcome = api.run(path, options=options, check=True, report_path=report_path, shapes=dump_shapes,
                              memory_plot=memory_plot if len(models) == 1 else None, on_event=shown)
        except NpufixError as exc:
            if shown is not None:
                shown.close()
            if len(models) == 1 and output_format != "json":  # json: the document says it (one shape always)
                raise
            click.echo(f"{_one_line(path)}: error: {_one_line(str(exc))}", err=True)
            documents.append(check_error_entry(path, str(exc)))
            exit_code = max(exit_code, exc.exit_code)
            continue
        if shown is not None:
            shown.close()
        exit_code = max(exit_code, outcome.exit_code)
        if output_format == "json":
            documents.append(check_entry(path, outcome.checked, outcome.violations, outcome.not_requested))
        else:
            _print_check(path, outcome, quiet, verbose)
    if output_format == "json":
        from onnx_npu_fix.io.save import dumps

        click.echo(dumps(check_document(documents, exit_code)))
    return exit_code


def _print_check(path: str, outcome, quiet: bool, verbose: int) -> None:
    """One line per finding, ``model.onnx: node (op): constraint: value vs limit -> fix``; then (unless -q) the
    summary, the exempt findings, the memory estimate and the shapes."""
    from onnx_npu_fix.analysis.memory import render_memory
    from onnx_npu_fix.constraints import render_shapes, violations_summary

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


def _print_outcome(outcome, quiet: bool, verbose: int, dump_shapes: bool, printed: set[int] = frozenset()) -> None:
    """The summary after the run; ``printed``: the pass records already printed as they finished (by id)."""
    report = outcome.report
    for name, frozen in report.frozen_inputs.items():
        shown = frozen["value"] if "value" in frozen else f"<sha256 {frozen['sha256'][:12]}…>"
        _say(quiet, f"frozen input {name} = {shown} ({frozen['dtype']} {frozen['shape']}): the model no longer "
                    f"takes it")
    _print_passes(report, quiet, verbose, printed)
    if outcome.saved_inputs:  # also when the run failed: they are the case to replay
        saved = outcome.saved_inputs
        _say(quiet, f"wrote {saved['path']} ({saved['sets']} input set{'s' if saved['sets'] != 1 else ''}; "
                    f"polygraphy run MODEL --onnxrt --load-inputs {saved['path']})")
    if outcome.error:
        click.echo(f"error: {outcome.error}", err=True)
        return
    checked = outcome.checked
    if report.final is not None:
        from onnx_npu_fix.pipeline.report import scaled_atol_note
        from onnx_npu_fix.pipeline.validation.comparison import (  # onnx and onnxruntime: not at start-up (--version)
            approximate_summary,
            sets_summary,
        )
        from onnx_npu_fix.pipeline.validation.quantized import quant_summary

        kind = "exact" if report.final.exact else "approximate"
        _say(quiet, f"{'output vs input':<16} {kind}: max abs {report.final.max_abs:.2e}, "
                    f"max rel {report.final.max_rel:.2e}{approximate_summary(report.final)}"
                    f"{quant_summary(report.final)}{scaled_atol_note(report.final)}{sets_summary(report.final)}")
    if report.cost is not None:
        from onnx_npu_fix.analysis.cost import render_cost

        for line in render_cost(*report.cost):
            _say(quiet, line)
    _print_judge(outcome.judge, quiet)
    _print_findings(outcome, quiet, verbose)
    if verbose:
        for note in checked.exempt:
            _say(quiet, f"exempt: {note.text()} ({note.message})")
    if dump_shapes and checked.shapes is not None:
        from onnx_npu_fix.constraints import render_shapes

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


def _print_judge(fit, quiet: bool) -> None:
    """--judge: accepted as fixed, or with which changed forms (and the profile lines that say so)."""
    if fit is None:
        return
    calls = f"{fit.calls} judge call{'s' if fit.calls != 1 else ''}"
    if fit.accepted and not fit.changed:
        _say(quiet, f"{'judge':<16} accepted ({calls})")
        return
    if not fit.accepted:  # the judge violation's unfixed: line follows
        _say(quiet, f"{'judge':<16} rejected: {fit.signature}; {len(fit.attempts)} other forms tried, none "
                    f"accepted ({calls})")
        return
    changed = ", ".join(f"{k} {c['from']} -> {c['to']}" for k, c in fit.changed.items())
    _say(quiet, f"{'judge':<16} rejected the first output ({fit.signature}); accepted with {changed} ({calls})")
    for line in fit.snippet().splitlines():
        _say(quiet, f"    profile: {line}")


def _print_fitting(outcome, quiet: bool) -> None:
    """The --memory-plot and --split lines (docs/memory.md, "Fitting SRAM")."""
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
    for requested, cut in plan.split_at.items():
        if cut != requested:  # a pass renamed it or folded its producer away (docs/memory.md, "Split")
            _say(quiet, f"{'split-at':<16} {requested} -> {cut} (its carrier in the fixed model)")
    peaks = " / ".join(format_bytes(s.peak_bytes) for s in plan.segments)
    crossing = ", ".join(format_bytes(b) for b in plan.crossing_bytes) or "none"
    check = split.validation
    verdict = f"not validated: {split.note}" if split.note else "not validated" if check is None else \
        f"chained segments bit-exact (max abs {check.max_abs:.1e})"
    _say(quiet, f"{'split':<16} {len(plan.segments)} segment{'s' if len(plan.segments) != 1 else ''}, peaks "
                f"{peaks}; crossing {crossing}; {verdict}")
    _say(quiet, f"wrote {os.path.join(split.directory, 'manifest.json')}")


# Option name on the command line -> FixOptions field, where the two differ. An option whose parameter name is
# the field's name needs no entry (_option_fields maps it): a new option is a click decorator and a FixOptions
# field, nothing else.
_OPTION_FIELDS = {
    "sram": "sram_bytes", "large_tensor": "large_tensor_bytes", "input_shape": "input_shapes",
    "validate_policy": "validate", "freeze_input": "freeze_inputs", "input_range": "input_ranges",
}


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
        elif param in ("rtol", "atol"):
            from onnx_npu_fix.config.options import parse_tolerances

            try:
                value, values[f"output_{param}"] = parse_tolerances(f"--{param}", value)
            except OptionError as exc:
                raise click.BadParameter(str(exc), param_hint=f"--{param}") from None
            if value is None:
                continue  # FixOptions' default (or the target's)
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
            except (InputError, ValueError) as exc:  # parse_size says why (not whole bytes, which units exist)
                raise click.BadParameter(str(exc), param_hint="--sram") from None
        values[field_name] = value
        if ctx.get_parameter_source(param) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            explicit[field_name] = value
    if opts["no_validate"]:
        values["validate"] = explicit["validate"] = "none"
    from onnx_npu_fix.constraints import ASKED_BY

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


def _print_passes(report, quiet: bool, verbose: int, printed: set[int] = frozenset()) -> None:
    """The pass lines not yet printed as their passes finished, then the run's validation note."""
    from onnx_npu_fix.pipeline.scheduler import NOT_VALIDATED

    for record in report.passes:
        if id(record) not in printed:
            _print_pass(record, quiet, verbose)
    if report.validation_note and report.validation_note != NOT_VALIDATED:  # that one ends the summary
        _say(quiet, f"note: {report.validation_note}")
    if verbose > 1:
        for warning in report.warnings:
            _say(quiet, warning)


def _print_pass(record, quiet: bool, verbose: int) -> None:
    """One pass's line, with -v its changes and rejections, and its warnings."""
    from onnx_npu_fix.pipeline.report import render_pass_line

    _say(quiet, render_pass_line(record))
    if verbose:
        for change in record.changes:
            _say(quiet, f"    {change.node} ({change.op}): {change.action}"
                 + (f" {change.old} -> {change.new}" if change.old is not None else ""))
        for rejection in record.rejections:
            _say(quiet, f"    kept {rejection.node} ({rejection.op}): {rejection.reason}")
    for warning in record.warnings:
        _say(quiet, f"    warning: {warning}")


def _wants_progress_line(asked: bool | None, quiet: bool) -> bool:
    """--progress / --no-progress, else a terminal's stderr without -q (CI logs and pipes get no redraws)."""
    if asked is not None:
        return asked
    return not quiet and _stderr_is_terminal()


def _stderr_is_terminal() -> bool:
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


class _Progress:
    """The run's progress events (onnx_npu_fix.progress) on stderr: each pass line as its pass is settled (the
    summary prints only the rest), and with ``line`` a progress line of long steps (validation sets, the schedule
    search), redrawn in place on a terminal and at most every REDRAW seconds, cleared before any other line.
    Events may come from the reference worker thread: one lock orders the writes."""

    REDRAW = 0.2

    def __init__(self, quiet: bool, verbose: int, line: bool) -> None:
        self.quiet, self.verbose, self.line = quiet, verbose, line
        self.printed: set[int] = set()
        """ids of the pass records printed."""
        self._lock = threading.Lock()
        self._shown = False
        self._drawn_at: float | None = None
        self._terminal = line and _stderr_is_terminal()

    def __call__(self, event: Any) -> None:
        from onnx_npu_fix import progress

        with self._lock:
            if isinstance(event, progress.PassFinished):
                self._clear()
                _print_pass(event.record, self.quiet, self.verbose)
                self.printed.add(id(event.record))
            elif isinstance(event, progress.Step) and self.line:
                self._draw(event)
            elif isinstance(event, progress.JudgeCall) and not self.quiet:
                self._clear()
                _print_judge_call(event)

    def _draw(self, step: Any) -> None:
        import time

        if step.total is not None and step.done >= step.total:
            self._clear()
            return
        now = time.monotonic()
        if self._drawn_at is not None and now - self._drawn_at < self.REDRAW:
            return
        self._drawn_at = now
        text = f"{step.task} {step.done}" + (f"/{step.total}" if step.total else "")
        if self._terminal:
            click.echo(f"\r{text}\x1b[K", err=True, nl=False)
            self._shown = True
        else:  # --progress into a log: plain lines
            click.echo(f"progress: {text}", err=True)

    def _clear(self) -> None:
        if self._shown:
            click.echo("\r\x1b[K", err=True, nl=False)
            self._shown = False

    def close(self) -> None:
        with self._lock:
            self._clear()


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


# --- npufix reduce ----------------------------------------------------------------------------------------------

_judged_input_shape = click.option("--input-shape", multiple=True, metavar="NAME:D1,D2,...",
                                   help="Freeze a graph input's shape (repeatable); needed for dynamic inputs.")
"""--input-shape of the judge commands (reduce, probe)."""

class _ReduceCommand(_OneLineCommand):
    examples = (
        ("npufix reduce fixed.onnx --judge 'compile.sh {model} {dir}' -o min.onnx --report reduce.json",
         "a compiler that aborts: the smallest model it still rejects, and what that likely trips"),
        ("npufix reduce model.onnx --judge 'rknn_build.py {model}' --fail-regex 'CPU fallback' -o min.onnx",
         "a compiler that succeeds but says something: judge its output"),
    )
    exit_codes_line = ("Exit codes: 0 written; 2 bad input or judge (not executable, no {model}, passes the model: "
                       "nothing to reduce, times out on it); 5 internal error; 130 / 143 interrupted.")


@click.command(cls=_ReduceCommand, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 118})
@click.argument("model", type=click.Path(dir_okay=True))
@_judge_options(required=True)
@click.option("-o", "--output", required=True, type=click.Path(), metavar="MIN.onnx",
              help="Where to write the minimal model that still fails with the original signature.")
@click.option("--min-good", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Also write the passing candidate nearest the minimal model, when the judge passed one.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="Write the reduction record (JSON) here.")
@click.option("--shrink", is_flag=True, help="Then make attributes that are not the cause smaller where exact.")
@_judged_input_shape
@click.option("--target", metavar="NAME|FILE",
              help="A profile whose constraints the record checks the remaining nodes against.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
@click.option("-v", "--verbose", count=True, help="-vv: tracebacks.")
@click.pass_context
def reduce_command(ctx: click.Context, **params: Any) -> None:
    """Reduce MODEL to the smallest sub-model the judge command still rejects with the same failure."""
    _guarded(ctx, params.get("verbose", 0), lambda: _reduce(ctx, **params))


def _reduce(ctx: click.Context, model: str, judge_command: str, output: str, fail_regex: tuple[str, ...],
            pass_regex: tuple[str, ...], judge_timeout: float | None, signature: str | None, min_good: str | None,
            report_path: str | None, shrink: bool, input_shape: tuple[str, ...], target: str | None,
            quiet: bool, verbose: int) -> None:
    from onnx_npu_fix import api

    _setup_logging(quiet, verbose)
    try:
        options = FixOptions(input_shapes=_parse_input_shape(input_shape))
        if target is not None:
            from onnx_npu_fix.config.targets import apply_target, load_target

            options = apply_target(load_target(target), options, {"input_shapes": options.input_shapes})
        judge = _make_judge(judge_command, fail_regex, pass_regex, judge_timeout, signature)
        outcome = api.reduce(model, output, judge, options, min_good=min_good, report_path=report_path,
                             shrink=shrink, on_event=None if quiet else _print_judge_call)
    except NpufixError as exc:
        raise _InputProblem(str(exc), exc.exit_code) from None
    _print_reduction(outcome, quiet)
    ctx.exit(outcome.exit_code)


def _print_judge_call(event: Any) -> None:
    """A judge call's line on stderr as it happens (a vendor compile takes seconds to minutes); the reduction's
    other events (its fold-constants run) are not the user's."""
    from onnx_npu_fix import progress

    if isinstance(event, progress.JudgeCall):
        click.echo(event.line, err=True)


def _print_reduction(outcome, quiet: bool) -> None:
    """The summary: nodes before -> after, calls, the signature, each node left with its likely cause."""
    from onnx_npu_fix.ir.graph import format_shape

    r = outcome.reduction
    _say(quiet, f"reduced {r.nodes_before} -> {r.nodes_after} nodes in {r.calls} judge calls ({r.cached} cached, "
                f"{r.unbuildable} unbuildable, {r.timeouts} timeouts, {r.other_failures} other failures), "
                f"{r.seconds:.1f}s")
    _say(quiet, f"signature: {r.signature}")
    for node in outcome.record["nodes"]:
        def io(tensors):
            return ", ".join(f"{t['name']} {format_shape(t['shape'])}" for t in tensors if not t["const"]) or "-"
        likely = f"  likely: {'; '.join(node['likely'])}" if node["likely"] else ""
        _say(quiet, f"  {node['name']} ({node['op']}): {io(node['inputs'])} -> {io(node['outputs'])}{likely}")
    if outcome.min_good:
        _say(quiet, f"wrote {outcome.min_good} (passes)")
    _say(quiet, f"wrote {outcome.written}")


# --- npufix probe -----------------------------------------------------------------------------------------------

class _ProbeCommand(_OneLineCommand):
    examples = (
        ("npufix probe --judge 'compile.sh {model} {dir}' --like model.onnx --input-shape x:1,1,16000 -o chip.toml",
         "learn what the compiler accepts of this model's ops and limits, as a profile (docs/unknown-compiler.md)"),
        ("npufix model.onnx --target chip.toml -o fixed.onnx", "then fix the model for it"),
    )
    exit_codes_line = ("Exit codes: 0 profile written; 2 bad input or judge (not executable, no {model}, a --like "
                       "model that cannot be read or has dynamic inputs); 5 internal error; 130 / 143 interrupted "
                       "(only the partial --report is written).")


@click.command(cls=_ProbeCommand, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 118})
@_judge_options(required=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), metavar="CHIP.toml",
              help="Where to write the learned target profile (load it with --target CHIP.toml).")
@click.option("--like", multiple=True, type=click.Path(dir_okay=False), metavar="MODEL",
              help="Probe only the ops and limits this model holds, and what npufix emits for it (repeatable).")
@click.option("--base-target", metavar="NAME|FILE", default=None,
              help="A profile whose constraints the learned ones override.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="Write the probe record (JSON: every judge call) here.")
@_judged_input_shape
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
@click.option("-v", "--verbose", count=True, help="-vv: tracebacks.")
@click.pass_context
def probe_command(ctx: click.Context, **params: Any) -> None:
    """Learn a compiler's limits from the judge command and write them as a target profile."""
    _guarded(ctx, params.get("verbose", 0), lambda: _probe(ctx, **params))


def _probe(ctx: click.Context, judge_command: str, fail_regex: tuple[str, ...], pass_regex: tuple[str, ...],
           judge_timeout: float | None, signature: str | None, output: str, like: tuple[str, ...],
           base_target: str | None, report_path: str | None, input_shape: tuple[str, ...], quiet: bool,
           verbose: int) -> None:
    from onnx_npu_fix import api

    _setup_logging(quiet, verbose)
    try:
        judge = _make_judge(judge_command, fail_regex, pass_regex, judge_timeout, signature)
        outcome = api.probe(output, judge, like=like, base_target=base_target,
                            input_shapes=_parse_input_shape(input_shape), report_path=report_path,
                            on_event=None if quiet else _print_judge_call)
    except NpufixError as exc:
        raise _InputProblem(str(exc), exc.exit_code) from None
    result = outcome.result
    _say(quiet, f"probed in {len(result.calls)} judge calls ({result.cached} cached, {len(result.unbuildable)} "
                f"not built), {result.judge_seconds:.1f}s in the judge")
    for learned in result.learned.values():
        _say(quiet, f"  {learned.key} = {_learned_text(learned.value)}")
    for key, note in result.notes.items():
        _say(quiet, f"  note {key}: {note}")
    for check in result.checks:
        _say(quiet, f"  {check['model']} fixed under it: {check['verdict_text']}")
    _say(quiet, f"wrote {outcome.written}")
    ctx.exit(outcome.exit_code)


def _learned_text(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(sorted(value))
    return str(value).lower() if isinstance(value, bool) else str(value)
