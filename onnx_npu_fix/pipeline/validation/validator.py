""":class:`Validator` is the validation of one pass-manager run (the pass manager, scheduler.py, decides *when* to
validate and what a verdict does to the run; this module decides *how*): the run's input sets, the original's
outputs (computed in the background), the outputs of the last accepted model, and the comparison of a candidate
with them under the run's criteria (rtol/atol, the approximate bound, quantization steps).

One set when nothing moved: a candidate of exact passes whose outputs on the first generated input set are bit for
bit those of the model before it is accepted on that set, and the other sets are not run for it (its record says
so: ``sets_not_run``). Why one set can do: a wrong exact rewrite (a misplaced weight, a shifted window, a lost
channel) moves nearly every output element of any N(0, 1) input, and the sets are independent draws from one
distribution, so the others add only what depends on rare input values; a set of ``ONE_SET_MIN_ELEMENTS`` input
elements or more holds values beyond 3 sigma in all but about one of 60,000 draws, and a smaller one is run in
full (it costs little). Every set is run when anything moved, even within tolerance (a verdict about a size
depends on the sample), for a candidate with an approximate change, and on loaded ``--validation-data`` (the user
chose those sets). A later candidate that moves is compared, on the sets a predecessor skipped, with the last
model that ran them (the ones between were exact and bit-identical on the first set), and so is the output model
in the final comparison: it covers every set the original ran (``sets_carried``: how many of them the output
model did not run itself). So an exact pass after an approximate one (align-channels after resize-nearest) runs
one set, and the approximate verdict on the output is still made on all of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

from onnx_npu_fix.config.options import check_output_names
from onnx_npu_fix.errors import InputError, first_line
from onnx_npu_fix.host.heap import release_freed_memory
from onnx_npu_fix.io.external import MappedWeights
from onnx_npu_fix.io.serialize import model_bytes
from onnx_npu_fix.ir.graph import TWO_GB, approx_model_bytes, subgraphs
from onnx_npu_fix.ir.ops import RANDOM_OPS, is_default_domain
from onnx_npu_fix.ir.qdq import StepBound
from onnx_npu_fix.pipeline.inputs import Feeds, make_inputs, validation_feeds
from onnx_npu_fix.pipeline.validation.comparison import Comparison, OutputDiff, bit_identical, compare
from onnx_npu_fix.pipeline.validation.quantized import compare_quantized, quantized_output_steps
from onnx_npu_fix.pipeline.validation.reference import Reference
from onnx_npu_fix.pipeline.validation.runs import run_file, run_model, segmented
from onnx_npu_fix.pipeline.validation.session import Outputs, Runner, runtime_errors, write_scratch

if TYPE_CHECKING:
    from onnx_npu_fix.config.options import FixOptions


ONE_SET_MIN_ELEMENTS = 4096
"""The input elements a generated set needs before one bit-identical set settles an exact candidate (module
docstring): at this size, P(no element beyond 3 sigma) = (1 - 0.0027)^4096 < 2e-5 (a 4,104-sample audio frame
qualifies; a 32-element toy input does not, and runs every set)."""


EDGE = 0.1
"""An approximate verdict within this fraction of its bound is near the edge (measured on more sets)."""
EDGE_SETS = 3
"""Near the edge, this many times the run's input sets are added."""
EDGE_SEED_OFFSET = 1_000_003
"""The added sets' seed is the run's plus this: other draws than the first sets, the same on every run."""


def at_the_edge(diff: OutputDiff) -> bool:
    """Whether an approximate verdict on ``diff`` could go the other way on another sample: its relative L2 error
    within ``EDGE`` of the bound, or the bound below the error's 95% upper confidence bound."""
    if diff.metric != "rel_l2":
        return False
    near = abs(diff.rel_l2 - diff.bound) <= EDGE * diff.bound
    return near or (diff.rel_l2 <= diff.bound and diff.rel_l2_upper is not None and diff.rel_l2_upper > diff.bound)


def _made(model: onnx.ModelProto | Callable[[], onnx.ModelProto] | None) -> onnx.ModelProto:
    assert model is not None
    return model() if callable(model) else model


def check_structure(model: onnx.ModelProto | Callable[[], onnx.ModelProto] | None,
                    data: bytes | None = None, *, path: str | None = None) -> str | None:
    """The onnx checker's complaint about ``model`` (one line), or None. ``data``: the model already
    serialized (checking bytes skips the checker's own re-serialization; ``model`` is then not read). ``path``:
    a scratch copy of it (io.external.MappedWeights), checked instead: the checker reads the model file, and of the
    weights in the data file beside it that they are there, not their bytes (whose lengths the copy kept inline
    where they disagree with their dims, see MappedWeights), so that its copy of the model is kilobytes, not one
    more model size. Above 2 GB the checker cannot take the in-memory proto; strict shape inference and
    onnxruntime still check those models."""
    if path is not None:
        data = None
    elif data is None:
        model = _made(model)
        if approx_model_bytes(model) >= TWO_GB:
            return None
        data = model_bytes(model)
    try:
        onnx.checker.check_model(path if path is not None else data)
    except Exception as exc:  # noqa: BLE001
        return first_line(exc)
    finally:
        # The checker parsed its own copy of the model; handed back before onnxruntime's session and its runs
        # come on top (else that copy is part of the peak).
        release_freed_memory()
    return None


def refuse_random(model: onnx.ModelProto) -> None:
    """InputError naming the first node (main graph or a body) that draws random values: two runs of such a model
    differ whatever a pass did (a padded RandomNormalLike even draws other values under a seed), so validating it
    would blame an exact pass for the noise, or call a wrong one exact."""
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            if node.op_type in RANDOM_OPS and is_default_domain(node):
                raise InputError(f"node '{node.name}' ({node.op_type}) draws random values, so no output of this "
                                 f"model can be compared with another run's; nothing written (feed the noise as "
                                 f"an input instead, or --validate none to write it unvalidated)")
            graphs.extend(subgraphs(node))


def blind_output(outputs: Sequence[Outputs]) -> str | None:
    """Why the original's ``outputs`` (over all input sets) cannot show a difference, or None: an output with no
    element at all (a zero-size dimension), or a floating one with no finite element (NaN and ±inf compare
    equal to themselves, so any model that also yields them "matches" — e.g. on all-NaN inputs)."""
    if not outputs:
        return None
    for name in outputs[0]:
        values = [np.asarray(o[name]) for o in outputs]
        if all(v.size == 0 for v in values):
            return f"output '{name}' has no elements"
        if all(v.dtype.kind in "fc" for v in values) and not any(np.isfinite(v).any() for v in values):
            return f"output '{name}' has no finite value (only NaN / ±inf)"
    return None


@dataclass
class Verdict:
    """A candidate model judged by :meth:`Validator.check`."""

    problem: str | None
    """One line saying why it was refused; None when it passed."""
    comparison: Comparison | None
    """Its outputs against the last accepted model's (None when it could not run: checker, onnxruntime)."""
    data: bytes | None
    """The candidate serialized (None above 2 GB): reused by a later restore or by save_model."""
    scratch: str | None = None
    """The model file onnxruntime ran it from (io.external.MappedWeights.write_bytes), when it did: :meth:`Validator.
    keep` writes a restore point of it without the weights that file's data holds already."""

    @property
    def passed(self) -> bool:
        return self.problem is None


class Validator:
    """The validation of one run: its seeded (or loaded) inputs, the original's outputs and those of the last
    accepted model, so each is computed once; :meth:`check` judges a candidate against the last accepted model.

    The original's outputs are computed on a background thread (Reference) while the passes work; the first
    validation waits for them. A run whose original onnxruntime cannot run is an InputError (nothing could be
    validated), unless validation is off.
    """

    def __init__(self, model: onnx.ModelProto, options: FixOptions, *, reference: Reference | None = None,
                 reference_feeds: Feeds | None = None, approximate: bool = False) -> None:
        """``reference``: the original's outputs already under way, else computed from ``model`` as it is now.
        ``reference_feeds``: inputs only ``reference`` takes (frozen inputs), added to every set it runs.
        ``approximate``: the run may make an approximate change (more input sets, see inputs.py)."""

        self.options = options
        self.feeds: list[Feeds] = []
        self._original: list[Outputs] | None = None
        self._current: list[Outputs] | None = None
        self._fresh = 0
        """How many of the input sets (the first ones) the last accepted model itself ran: all, or only the first
        when its outputs there were bit-identical to its predecessor's (then ``_current`` holds, for the others,
        the outputs of the last model that ran them)."""
        self._reference: Reference | None = None
        self._reference_feeds: Feeds = {}
        self._rerun_path: str | None = None
        """The original's scratch copy, when its runs stopped after the first set (:meth:`_complete_original`)."""
        self.all_exact = True
        """Every accepted change was exact (the final comparison's criterion)."""
        self.changed = False
        """Some change was accepted (validated or not)."""
        self.steps: dict[str, StepBound] = {}
        self._may_widen = False
        """A change may be approximate, and its verdict near the bound can be measured on more generated sets
        (:meth:`_at_the_edge`)."""
        self._edge_model: str | bytes | None = None
        """The model as validation starts, written to the run's mapped weights for :meth:`_at_the_edge`, when the
        original's own scratch copy (``_rerun_path``) will not be there to run instead."""
        self._weights = MappedWeights()
        """Where the candidates' weights are written for onnxruntime to map (shared with the original's: a
        weight no pass changed is written once per run); removed by :meth:`close`, also when this raises."""
        check_output_names(options, [o.name for o in model.graph.output])
        if options.validate == "none":
            return
        try:
            self._start(model, reference, reference_feeds, approximate)
        except BaseException:
            self.close()
            raise

    def _start(self, model: onnx.ModelProto, reference: Reference | None, reference_feeds: Feeds | None,
               approximate: bool) -> None:
        """The input sets, and the original's outputs under way (see __init__)."""
        options = self.options
        refuse_random(model)
        self.feeds = validation_feeds(model, n_inputs=options.n_inputs, seed=options.seed,
                                      data=options.validation_data, ranges=options.input_ranges,
                                      approximate=approximate and not options.strict)
        # Outputs made by a DequantizeLinear are judged in quantization steps (graph output names never change).
        self.steps = quantized_output_steps(model)
        if reference is None and approx_model_bytes(model) >= TWO_GB:
            # No file to start from and too large for bytes: the scratch copy must be written now, before the
            # passes change the model, so this one is computed here.
            self._settle(lambda: self._run(model))
            return
        if reference is None:
            data = model_bytes(model)
            reference = Reference(data, long_graph=segmented(model, len(data)), start=False)
            del data
        self._reference = reference.start()  # started once held here: close() stops it, whatever lands next
        self._weights = reference.take_weights()
        self._may_widen = (approximate and not options.strict and not options.validation_data
                           and approx_model_bytes(model) < TWO_GB)
        if self._may_widen and not reference.keeps_copy:
            self._edge_model = write_scratch(self._weights, model) or model_bytes(model)
        self._reference_feeds = dict(reference_feeds or {})
        if not approximate and self._one_set_may_do():
            reference.enough_with_one()  # the other sets only when a candidate moves
        self._reference.run([{**feeds, **self._reference_feeds} for feeds in self.feeds])

    @staticmethod
    def _of_original(compute: Callable[[], list[Outputs]]) -> list[Outputs]:
        try:
            return compute()
        except runtime_errors() as exc:
            # Without the original's outputs nothing can be validated, and nothing is written unvalidated
            # unless the user asked for it.
            raise InputError(f"onnxruntime cannot run the original model ({first_line(exc)}), so no change "
                             f"could be validated; nothing written (fix the model, or --validate none to write "
                             f"it unvalidated)") from None

    def _settle(self, compute: Callable[[], list[Outputs]]) -> None:
        self._original = self._of_original(compute)
        blind = blind_output(self._original)
        if blind is not None:
            source = ("the --validation-data inputs" if self.options.validation_data
                      else "the generated validation inputs")
            raise InputError(f"validation cannot tell a wrong model from a right one: {blind} on {source}; "
                             f"nothing written (give --validation-data with finite values and non-empty shapes, "
                             f"or --validate none to write it unvalidated)")
        self._current = self._original
        self._fresh = len(self._original)

    def _wait(self) -> None:
        if self._reference is not None:
            reference, self._reference = self._reference, None
            try:
                self._settle(reference.outputs)
                self._rerun_path = reference.rerun_path
            finally:
                reference.close()

    def _complete_original(self) -> None:
        """The original's outputs on every input set: the runs the reference left out (it stopped after the
        first set, see :meth:`_one_set_may_do`) from its scratch copy; the last accepted model's outputs on them
        are the original's too (every candidate since was bit-identical on the first set)."""
        assert self._original is not None and self._current is not None
        missing = self.feeds[len(self._original):]
        if not missing:
            return
        assert self._rerun_path is not None, "the reference stops early only with a scratch copy to run again"
        rest = self._of_original(functools.partial(
            run_file, self._rerun_path, [{**feeds, **self._reference_feeds} for feeds in missing],
            "reference outputs"))
        self._original = [*self._original, *rest]
        self._current = [*self._current, *rest]

    def require_original(self) -> None:
        """Raise InputError unless the original's outputs exist (or validation is off): a run that changed
        nothing still proves that the model it hands back runs."""
        if self.options.validate != "none":
            self._wait()

    @property
    def original(self) -> list[Outputs] | None:
        self._wait()
        return self._original

    @property
    def current(self) -> list[Outputs] | None:
        """The outputs of the last accepted model (the original's until a validation passes)."""
        self._wait()
        return self._current

    def close(self) -> None:
        try:
            if self._reference is not None:
                self._reference.close()
        finally:
            self._weights.close()

    def _run(self, model: onnx.ModelProto | None, data: bytes | None = None,
             task: str = "validation", enough: Callable[[Outputs], bool] | None = None,
             path: str | None = None) -> list[Outputs]:
        return run_model(model, self.feeds, data=data, task=task, weights=self._weights, enough=enough, path=path)

    def _scratch_copy(self, model: onnx.ModelProto | Callable[[], onnx.ModelProto], data: bytes | None) -> str | None:
        """The candidate written for the checker and its session (a model file and its weights in the run's
        data file, :func:`write_scratch`), or None: above 2 GB, for a graph run in segments (cut from the
        proto), or when the file system refuses (then both take the bytes, as before the scratch copies)."""
        if data is None or (not callable(model) and segmented(model, len(data))):
            return None
        return write_scratch(self._weights, data)

    def check_on_disk(self, model: onnx.ModelProto) -> tuple[str | None, str | None]:
        """:func:`check_structure` of a model whose weights are left in the input's data file (ir.weights), never
        serialized with them: of its scratch copy (:func:`write_scratch`), whose path is returned with the finding
        for :meth:`final` to run (None for a graph run in segments, which are cut from the proto, or when the file
        system refused the copy); without validation, of a copy whose references point at stand-ins
        (MappedWeights.write_references): nothing else would read a copy of the weights."""
        if self.options.validate == "none":
            try:
                return check_structure(None, path=self._weights.write_references(model)), None
            except OSError:
                pass  # (the file system refuses: the scratch copy, or the bytes, as with validation)
        scratch = write_scratch(self._weights, model)
        if scratch is None:
            return check_structure(model), None
        return check_structure(model, path=scratch), None if segmented(model) else scratch

    def _unmoved(self, exact: bool, before: Outputs) -> Callable[[Outputs], bool] | None:
        """For an exact candidate on generated inputs (more than one set): whether its first set's outputs are
        ``before``'s bit for bit, so that its other sets need not run (the module docstring says why; after an
        approximate change too: the final comparison's verdict about a size is made on the sets carried)."""
        if not (exact and self._one_set_may_do()):
            return None
        return lambda first: bit_identical(before, first)

    def _one_set_may_do(self) -> bool:
        """Whether this run's input sets allow settling a candidate on the first (generated, more than one,
        ``ONE_SET_MIN_ELEMENTS`` elements or more each)."""
        return (not self.options.validation_data and len(self.feeds) >= 2
                and sum(v.size for v in self.feeds[0].values()) >= ONE_SET_MIN_ELEMENTS)

    def check(self, model: onnx.ModelProto | Callable[[], onnx.ModelProto], *, exact: bool,
              data: bytes | None = None, on_serialized: Callable[[bytes], None] | None = None,
              task: str = "validation", from_proto: bool = False) -> Verdict:
        """Check and run ``model`` (the candidate after one pass or one group of them) and compare its outputs
        with the last accepted model's: by rtol/atol when ``exact`` (quantized outputs in quantization steps),
        else by the approximate bound. A passing candidate becomes the accepted model. ``data``: ``model``
        serialized already (else serialized here, below 2 GB); with ``data``, ``model`` may be a function
        that makes it: onnxruntime then gets the bytes (written for it to map, io.external.MappedWeights.write_bytes)
        and the proto is made only if a wider comparison needs it, so that neither the checker's two copies of
        the bytes nor the session's weights come on top of it (the caller makes it after this, from the bytes).
        Not for a graph run in segments (:func:`segmented`), which are cut from the proto. ``on_serialized``
        gets the candidate's bytes once the checker accepted them, before onnxruntime runs them. ``task``: what
        its progress steps are called (progress.Step). ``from_proto``: ``model`` (a proto) is never serialized:
        the checker and the session read a scratch copy written from it (:meth:`check_on_disk`)."""
        # The original's session is let go before the candidate is checked: its weights next to the candidate's
        # bytes and the checker's copy of them made the peak (and two models computing at once would only fight
        # over the cores). An original that cannot run is the input's problem: raised here.
        self._wait()
        if data is None and not from_proto:
            model = _made(model)
            data = model_bytes(model) if approx_model_bytes(model) < TWO_GB else None
        if from_proto and not segmented(model):
            scratch = write_scratch(self._weights, model)
        else:
            scratch = self._scratch_copy(model, data)
        problem = check_structure(model, data, path=scratch)
        if problem:
            return Verdict(f"the model fails the onnx checker after this pass: {problem}", None, data)
        if on_serialized is not None and data is not None:
            on_serialized(data)
        current = self.current
        assert current is not None  # the original ran (else _wait raised)
        try:
            outputs = self._run(None if callable(model) else model, data, task=task,
                                enough=self._unmoved(exact, current[0]), path=scratch)
        except runtime_errors() as exc:
            return Verdict(f"onnxruntime cannot run the model after this pass: {first_line(exc)}", None, data)
        if len(outputs) > len(current):
            self._complete_original()
            current = self._current
        comparison = self._compare(current[:len(outputs)], outputs, exact=exact)
        comparison.sets_not_run = len(self.feeds) - len(outputs)
        if self.all_exact:  # the accepted model computes the original's outputs: more sets can be compared
            comparison = self._at_the_edge(model, data, comparison, self.current, outputs)
        if not comparison.passed:
            worst = comparison.worst
            where = f"output '{worst.name}'" if worst else "outputs"
            upper = (f", its 95% upper confidence bound {worst.value:.3g} over {worst.sets} input sets"
                     if worst is not None and worst.metric == "rel_l2_upper" else "")
            detail = comparison.error or (f"{where}: max abs error {worst.max_abs:.3g}, rel L2 {worst.rel_l2:.3g}"
                                          f"{upper} ({comparison.criterion})")
            return Verdict(f"validation failed on {detail}", comparison, data)
        self.accept(exact=exact)
        self._current, self._fresh = [*outputs, *current[len(outputs):]], len(outputs)
        return Verdict(None, comparison, data, scratch)

    def keep(self, data: bytes, scratch: str | None = None) -> str | None:
        """``data`` (a validated model's bytes) written to the run's scratch directory, for a restore point that
        does not sit in memory (``scratch``: the file its session ran from, Verdict.scratch); its path, for
        :meth:`read_kept`, or None when the file system refuses (the caller keeps the bytes)."""
        try:
            return self._weights.keep(data, scratch)
        except OSError:
            return None

    def read_kept(self, path: str) -> bytes:
        """The bytes kept at ``path`` by :meth:`keep`."""
        return self._weights.read_kept(path)

    def accept(self, *, exact: bool) -> None:
        """A change is kept (by :meth:`check`, or unvalidated): the final comparison covers it."""
        self.changed = True
        self.all_exact = self.all_exact and exact

    def final(self, model: onnx.ModelProto, data: bytes | None = None, path: str | None = None) -> Comparison | None:
        """The output model against the original (reusing the last accepted outputs when every pass was
        validated); ``data``: the model already serialized; ``path``: a scratch copy of it written already
        (:meth:`check_on_disk`), which the session runs. None when nothing changed or validation is off."""
        if not self.changed or self.options.validate == "none" or self.original is None:
            return None
        original = self.original
        if self.options.validate == "each" and self.current is not None:
            # Every set the original ran: the output model's own, and for the others the outputs of the last
            # model that ran them (bit-identical since on the first set).
            outputs, own = self.current[:max(len(original), self._fresh)], self._fresh
        else:
            try:
                outputs = self._run(model, data, enough=self._unmoved(self.all_exact, original[0]), path=path)
            except runtime_errors() as exc:
                return Comparison(error=f"onnxruntime cannot run the output model: {first_line(exc)}")
            own = len(outputs)
            if len(outputs) > len(original):
                self._complete_original()
                original = self.original
        comparison = self._compare(original[:len(outputs)], outputs, exact=self.all_exact)
        comparison.sets_not_run, comparison.sets_carried = len(self.feeds) - own, len(outputs) - own
        return self._at_the_edge(model, data, comparison, original, outputs)

    def _at_the_edge(self, model: onnx.ModelProto | Callable[[], onnx.ModelProto], data: bytes | None,
                     comparison: Comparison,
                     reference: list[Outputs], outputs: list[Outputs]) -> Comparison:
        """An approximate ``comparison`` whose verdict is near its bound (within ``EDGE`` of it, or the bound
        inside the 95% confidence interval) depends on the sample: then ``model`` and the original are run on
        ``EDGE_SETS`` times as many more seeded sets (within inputs.MAX_SETS / MAX_EXTRA_BYTES), and every output
        is judged on all of them by the 95% upper confidence bound of its error (measured: 0.504 on the default
        sets of one seed was a pass at 0.5 on another). ``reference`` / ``outputs``: what ``comparison``
        compared (the original's, or the accepted model's while it computes the original's). Without a way to
        run more (--validation-data, --strict, above 2 GB, no scratch copy of the original because the file
        system refused it) the comparison stands, with its sets and confidence in the record."""
        # The original's own scratch copy when there is one (it is the model every comparison's original outputs
        # came from: frozen inputs are fed to it, as to the reference), else the copy written at the start.
        edge = self._edge_model if self._edge_model is not None else self._rerun_path
        if (comparison.exact or comparison.error is not None or not self._may_widen or edge is None
                or not any(at_the_edge(o) for o in comparison.outputs)):
            return comparison
        model = _made(model)
        from onnx_npu_fix.pipeline.inputs import MAX_EXTRA_BYTES, MAX_SETS, parse_input_ranges

        per_set = sum(v.nbytes for v in self.feeds[0].values()) + 2 * sum(v.nbytes for v in reference[0].values())
        more = min(EDGE_SETS * len(self.feeds), MAX_SETS - len(self.feeds), MAX_EXTRA_BYTES // max(per_set, 1))
        if more < 1:
            return comparison
        feeds = make_inputs(model, more, self.options.seed + EDGE_SEED_OFFSET,
                            ranges=parse_input_ranges(self.options.input_ranges))
        original = Runner(None, model_path=edge) if isinstance(edge, str) else Runner(None, data=edge)
        candidate = Runner(model, data=data, weights=self._weights)
        extra_reference_feeds = feeds if self._edge_model is not None else \
            [{**f, **self._reference_feeds} for f in feeds]
        try:
            extra_reference, extra = original.run_all(extra_reference_feeds), candidate.run_all(feeds)
        except runtime_errors():
            return comparison  # ran on the first sets, so this is not expected; the first verdict stands
        finally:
            original.close()
            candidate.close()
        widened = self._compare([*reference, *extra_reference], [*outputs, *extra], exact=False, confident=True)
        widened.criterion += f", by its 95% upper confidence bound over {len(self.feeds) + more} input sets"
        widened.sets_not_run, widened.sets_carried = comparison.sets_not_run, comparison.sets_carried
        return widened

    def _compare(self, reference: list[Outputs], outputs: list[Outputs], *, exact: bool,
                 confident: bool = False) -> Comparison:
        if self.steps:
            return compare_quantized(reference, outputs, self.steps, exact=exact, rtol=self.options.rtol,
                                     atol=self.options.atol, max_approx_error=self.options.max_approx_error,
                                     quant_steps=self.options.quant_steps, output_rtol=self.options.output_rtol,
                                     output_atol=self.options.output_atol, confident=confident)
        return compare(reference, outputs, exact=exact, rtol=self.options.rtol, atol=self.options.atol,
                       max_approx_error=self.options.max_approx_error, output_rtol=self.options.output_rtol,
                       output_atol=self.options.output_atol, confident=confident)
