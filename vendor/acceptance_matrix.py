"""The acceptance matrix: every model x every profile with a real-compiler judge, before and after npufix.

    python vendor/acceptance_matrix.py --models DIR --out docs/acceptance-matrix.md \\
        --npufix before=OLD_CHECKOUT --npufix after=NEW_CHECKOUT

DIR is what vendor/export_real_models.py wrote (DIR/models.json). For each model and profile: the judge's verdict
on the original, then for each npufix checkout (run with PYTHONPATH=<checkout>, so branches can be compared
without installing them) `npufix MODEL -o OUT --target T [--input-shape ...]`'s exit code, the judge's verdict on
OUT and the CPU ops it added / removed where the compiler reports placement. The judges are vendor/judge_*.sh and
need their NPUFIX_* variables (vendor/install_*.sh); a profile whose judge is not installed is skipped and said so.
Every result is cached in --work (JSON lines), verdicts by the judged file's digest (one compile per distinct
model and judge; an output identical to its original shares its verdict): a second run only judges what is
missing, and --render alone rewrites the markdown from the cache; --notes appends a hand-written explanation of the
cells (vendor/acceptance_notes.md). Runs outside CI (hours; real compilers).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


# profile -> (judge script, its arguments, env var that must be set, compiler name)
JUDGES = {
    "bm1684x": ("judge_tpu_mlir.sh", ["--processor", "bm1684x"], "NPUFIX_TPU_MLIR", "tpu-mlir"),
    "rv1106": ("judge_rknn.sh", ["--platform", "rv1106"], "NPUFIX_RKNN_PYTHON", "rknn-toolkit2"),
    "rk3566": ("judge_rknn.sh", ["--platform", "rk3566"], "NPUFIX_RKNN_PYTHON", "rknn-toolkit2"),
    "rk3588": ("judge_rknn.sh", ["--platform", "rk3588"], "NPUFIX_RKNN_PYTHON", "rknn-toolkit2"),
    "k210": ("judge_nncase.sh", [], "NPUFIX_NNCASE_PYTHON", "nncase"),
    "ethos-u55": ("judge_vela.sh", ["--accelerator", "ethos-u55-256"], "NPUFIX_VELA_PYTHON", "vela"),
}
# (column name, profile whose output is judged, judge of another compiler): QDQ models only. There is no QNN
# profile; Qualcomm's HTP judges the quantized outputs of other profiles.
CROSS = {
    "htp-v73 (bm1684x output)": ("bm1684x", ("judge_qnn.sh", ["--htp-arch", "73"], "NPUFIX_QNN_PYTHON",
                                             "onnxruntime-qnn")),
    "htp-v73 (rv1106 output)": ("rv1106", ("judge_qnn.sh", ["--htp-arch", "73"], "NPUFIX_QNN_PYTHON",
                                           "onnxruntime-qnn")),
}
# "PROFILE learned" -> (profile file, PROFILE's judge): a profile written by `npufix probe` against PROFILE's
# compiler (--learned PROFILE=FILE), judged beside the built-in one
LEARNED: dict[str, tuple[str, tuple]] = {}
VERSION_PROBE = {
    "NPUFIX_TPU_MLIR": ("{}/python", "tpu_mlir"),
    "NPUFIX_RKNN_PYTHON": ("{}", "rknn-toolkit2"),
    "NPUFIX_NNCASE_PYTHON": ("{}", "nncase"),
    "NPUFIX_VELA_PYTHON": ("{}", "ethos-u-vela"),
    "NPUFIX_QNN_PYTHON": ("{}", "onnxruntime-qnn"),
}


def shape_args(entry: dict) -> list[str]:
    return [f"{name}:{','.join(map(str, dims))}" for name, dims in (entry.get("input_shapes") or {}).items()]


class Cache:
    """JSON lines keyed by a tuple of strings; append-only, last line wins."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.rows: dict[str, dict] = {}
        self.reload()

    def reload(self) -> None:
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    row = json.loads(line)
                    self.rows[row["key"]] = row

    def get(self, *key: str) -> dict | None:
        """The cached row; on a miss the file is read again (another run of the matrix may have added it)."""
        if "|".join(key) not in self.rows:
            self.reload()
        return self.rows.get("|".join(key))

    def put(self, row: dict, *key: str) -> dict:
        row = dict(row, key="|".join(key))
        self.rows[row["key"]] = row
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        return row


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def judge(judge_spec: tuple, model: str, entry: dict, work: str, timeout: float) -> dict:
    script, extra, _, _ = judge_spec
    os.makedirs(work, exist_ok=True)
    out = os.path.join(work, "verdict.json")
    if os.path.exists(out):
        os.remove(out)
    cmd = [os.path.join(HERE, script), model, *extra, "--json", out, "--workdir", os.path.join(work, "judge"),
           *[a for s in shape_args(entry) for a in ("--input-shape", s)]]
    started = time.time()
    try:
        done = subprocess.run(["nice", "-n", "10", *cmd], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:  # the compiler said nothing yet: neither accepted nor rejected
        return {"verdict": "no verdict", "message": f"judge timeout after {timeout:.0f} s", "cpu_ops": None,
                "seconds": round(time.time() - started, 1)}
    if os.path.exists(out):
        return json.load(open(out, encoding="utf-8"))
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
    return {"verdict": "judge failed", "message": tail[0][-300:], "cpu_ops": None,
            "seconds": round(time.time() - started, 1)}


def run_npufix(checkout: str, python: str, model: str, entry: dict, target: str, out: str) -> dict:
    env = dict(os.environ, PYTHONPATH=checkout)
    cmd = [python, "-m", "onnx_npu_fix", model, "-o", out, "--target", target,
           *[a for s in shape_args(entry) for a in ("--input-shape", s)], *entry.get("npufix_args", [])]
    started = time.time()
    # run in the output's directory: `python -m` puts the working directory first on sys.path, so from inside
    # another checkout that checkout's package would run instead of PYTHONPATH's
    done = subprocess.run(["nice", "-n", "10", *cmd], capture_output=True, text=True, env=env, timeout=3600,
                          cwd=os.path.dirname(out))
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    unfixed = [ln.strip() for ln in lines if ln.lstrip().startswith("unfixed")]
    return {"exit": done.returncode, "unfixed": unfixed[:6], "last": lines[-1][-300:] if lines else "",
            "written": os.path.exists(out), "seconds": round(time.time() - started, 1)}


def cpu_delta(before: dict | None, after: dict | None) -> str:
    """CPU ops added / removed by type ('+2 Reshape -3 Gather'), '' when equal, '?' when not reported."""
    if not before or not after or before.get("cpu_ops") is None or after.get("cpu_ops") is None:
        return "?"
    b = collections.Counter(op for op, _ in before["cpu_ops"])
    a = collections.Counter(op for op, _ in after["cpu_ops"])
    parts = [f"+{a[op] - b[op]} {op}" for op in sorted(a) if a[op] > b[op]]
    parts += [f"-{b[op] - a[op]} {op}" for op in sorted(b) if b[op] > a[op]]
    return " ".join(parts) or "="


def judge_spec(column: str) -> tuple:
    """The judge of a column: its own, a learned profile's compiler's, or a cross column's other compiler."""
    return JUDGES[column] if column in JUDGES else (LEARNED.get(column) or CROSS[column])[1]


def tasks(manifest: dict, profiles: list[str]) -> list[tuple[str, str, str, tuple]]:
    """(column, model, target profile, judge spec), model by model with every column of a model together, so an
    interrupted run has judged every profile on the same first models."""
    out = []
    for name in manifest:
        for column in profiles:
            if column in JUDGES:
                out.append((column, name, column, JUDGES[column]))
            elif column in LEARNED:
                out.append((column, name, *LEARNED[column]))
            elif column in CROSS and name.endswith("_qdq"):
                out.append((column, name, *CROSS[column]))
    return out


UNDECIDED = ("no verdict", "judge failed")


def undecided(row: dict | None) -> bool:
    """No verdict yet: never judged, or the judge could not decide (converter failure, timeout, judge crash;
    the Vela rows cached before exit 3 existed say 'onnx2tf:')."""
    return row is None or row["verdict"] in UNDECIDED or (row.get("message") or "").startswith("onnx2tf:")


def verdict_of(cache: Cache, spec_key: str, sha: str) -> dict | None:
    """The judge's verdict on the model with this digest: an output identical to an original (npufix changed
    nothing) shares the original's verdict, and identical outputs of several checkouts or targets share one."""
    return cache.get("output", spec_key, sha) or cache.get("original", spec_key, sha)


def judge_once(args: argparse.Namespace, cache: Cache, spec: tuple, kind: str, model: str, entry: dict,
               work: str, column: str, name: str) -> None:
    """Judge ``model`` unless its digest already has a verdict from this judge (a retry with --retry-undecided
    for one that had none)."""
    spec_key, sha = " ".join([spec[0], *spec[1]]), digest(model)
    known = verdict_of(cache, spec_key, sha)
    if known is not None and not (args.retry_undecided and undecided(known)):
        return
    verdict = judge(spec, model, entry, work, args.timeout)
    cache.put(dict(verdict, model=name, column=column), kind, spec_key, sha)
    log(f"{column} {name} {kind}: {verdict['verdict']} {' '.join(verdict.get('message', '').split())[:120]}")


def run_all(args: argparse.Namespace, manifest: dict, cache: Cache, checkouts: dict[str, str]) -> None:
    """Round by round: the originals and the first checkout on every (model, column), then the next checkout;
    one judge at a time (the compilers each take the machine's cores)."""
    for label, checkout in checkouts.items():
        for column, name, target, spec in tasks(manifest, args.profiles):
            if not os.environ.get(spec[2]) or stopped(args):
                continue
            entry = manifest[name]
            model = os.path.join(args.models, entry["file"])
            base = os.path.join(args.work, column.replace(" ", "_").replace("(", "").replace(")", ""), name)
            if not args.npufix_only:
                judge_once(args, cache, spec, "original", model, entry, os.path.join(base, "original"), column, name)
            # one npufix run per target (a learned profile's by its file name)
            out = os.path.join(args.work, os.path.basename(target), name, label, f"{name}.onnx")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            fixed = cache.get("npufix", label, target, name)
            # exit 2 is a usage error of this call (e.g. a dynamic input the manifest gave no shape): run it again
            rerun = args.retry_undecided and fixed is not None and fixed["exit"] == 2
            if fixed is None or rerun or (fixed["written"] and not os.path.exists(out)):
                fixed = cache.put(dict(run_npufix(checkout, args.python, model, entry, target, out),
                                       model=name, target=target, checkout=label), "npufix", label, target, name)
                log(f"{target} {name} npufix[{label}]: exit {fixed['exit']}")
            if fixed["written"] and os.path.exists(out):
                if not args.npufix_only:
                    judge_once(args, cache, spec, "output", out, entry, os.path.join(base, label, "judge"), column,
                               name)
                cache.put({"digest": digest(out)}, "output-of", label, column, name)


def stopped(args: argparse.Namespace) -> bool:
    """--stop-at HH:MM (UTC): launch nothing new after it, so a bounded session can still render what it has."""
    return bool(args.stop_at) and time.strftime("%H:%M", time.gmtime()) >= args.stop_at


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def versions() -> list[str]:
    found = []
    for var, (python, dist) in VERSION_PROBE.items():
        if os.environ.get(var):
            exe = python.format(os.environ[var])
            done = subprocess.run([exe, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                                  capture_output=True, text=True)
            found.append(f"{dist} {done.stdout.strip() or '?'}")
    return found


def short(verdict: dict | None) -> str:
    if verdict is None:
        return "—"
    if verdict["verdict"] == "accepted":
        cpu = verdict.get("cpu_ops")
        return "ok" if cpu is None else f"ok, {len(cpu)} CPU"
    if verdict["verdict"] in ("no verdict", "judge failed") or (verdict.get("message") or "").startswith("onnx2tf:"):
        return f"n/a: `{' '.join((verdict.get('message') or '').split())[:90]}`"
    message = " ".join((verdict.get("message") or "").split()).replace("|", "/").replace("`", "'")
    return f"**no**: `{message[:110]}`"


def exit_cell(fixed: dict | None) -> str:
    """npufix's exit code; with the reason when it wrote nothing."""
    if fixed is None:
        return "—"
    if fixed["exit"] in (0, 1):
        return str(fixed["exit"])
    reason = " ".join(fixed.get("last", "").split()).replace("|", "/").replace("`", "'")
    return f"{fixed['exit']}: `{reason[:140]}`"


def commit_of(checkout: str) -> str:
    done = subprocess.run(["git", "-C", checkout, "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return done.stdout.strip()[:90] or "?"


TALLIES = ("judged", "no verdict", "won", "lost", "silent", "cpu+", "npufix failed")


def tally(counts: collections.Counter, label: str, original: dict | None, output: dict | None,
          fixed: dict | None) -> None:
    """Count one (model, checkout) cell into the summary; undecided verdicts count as "no verdict" only."""
    if fixed and fixed["exit"] not in (0, 1):
        counts[label, "npufix failed"] += 1
    if not original or not output:
        return
    if undecided(original) or undecided(output):
        counts[label, "no verdict"] += 1
        return
    before, after = original["verdict"] == "accepted", output["verdict"] == "accepted"
    counts[label, "judged"] += 1
    counts[label, "original ok"] += before
    counts[label, "kept"] += before and after
    counts[label, "won"] += after and not before
    counts[label, "lost"] += before and not after
    counts[label, "silent"] += not after and bool(fixed) and fixed["exit"] == 0
    counts[label, "cpu+"] += "+" in cpu_delta(original, output)


def render(args: argparse.Namespace, manifest: dict, cache: Cache, checkouts: dict[str, str]) -> str:
    labels = list(checkouts)
    lines = [
        "# Acceptance matrix: real exports x real compilers, before and after npufix",
        "",
        f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by "
        f"`python vendor/acceptance_matrix.py` ({', '.join(versions()) or 'no judge installed'}). "
        "Checkouts: " + "; ".join(f"{lb} = `{commit_of(co)}`" for lb, co in checkouts.items()) + ". Models: "
        f"vendor/export_real_models.py ({len(manifest)} models; not committed).",
        "",
        "Columns per checkout: npufix's exit code with `--target` (1 = written with unfixed constraints), the "
        "judge's verdict on its output, and the CPU ops the output adds (+) or removes (-) against the original "
        "where the compiler reports placement (`=`: same; `?`: not reported). `—`: not run.",
        "",
    ]
    summary = []
    for column, *_ in [(c,) for c in args.profiles]:
        rows = [t for t in tasks(manifest, [column])]
        if not rows:
            continue
        spec = rows[0][3]
        spec_key = " ".join([spec[0], *spec[1]])
        head = "| model | original |" + "".join(f" npufix ({lb}) | output ({lb}) | CPU ± ({lb}) |" for lb in labels)
        table = [f"## {column} ({spec[3]})", "", head, "|" + "---|" * (2 + 3 * len(labels))]
        counts = collections.Counter()
        for _, name, target, _ in rows:
            model = os.path.join(args.models, manifest[name]["file"])
            original = cache.get("original", spec_key, digest(model)) if os.path.exists(model) else None
            cells = [name, short(original)]
            for label in labels:
                fixed = cache.get("npufix", label, target, name)
                ref = cache.get("output-of", label, column, name)
                output = verdict_of(cache, spec_key, ref["digest"]) if ref else None
                cells += [exit_cell(fixed), short(output), cpu_delta(original, output)]
                tally(counts, label, original, output, fixed)
            table.append("| " + " | ".join(cells) + " |")
        lines += table + [""]
        for label in labels:
            summary.append(f"| {column} | {label} | " + " | ".join(str(counts[label, k]) for k in TALLIES[:2])
                           + f" | {counts[label, 'kept']}/{counts[label, 'original ok']} | "
                           + " | ".join(str(counts[label, k]) for k in TALLIES[2:]) + " |")
    head = ["## Summary", "",
            "judged: models with a verdict on the original and on npufix's output; no verdict: one of the two has "
            "none (the converter before the compiler failed, or the judge timed out); kept: outputs accepted where "
            "the original is accepted / originals accepted; won: rejected as exported, accepted after npufix; "
            "lost: accepted as exported, rejected after npufix; silent: rejected after npufix while npufix exited "
            "0 (its `--target` run found no unfixed constraint, so `--check --target` on its output passes too); "
            "cpu+: outputs with more CPU ops of some type than the original; npufix failed: no output written (exit "
            "2 or more, its message in the npufix column).", "",
            "| profile | checkout | judged | no verdict | kept | won | lost | silent | cpu+ | npufix failed |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    return "\n".join(lines[:6] + head + summary + [""] + lines[6:]) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", required=True, help="directory written by vendor/export_real_models.py")
    p.add_argument("--out", required=True, help="the markdown to write")
    p.add_argument("--npufix", action="append", default=[], metavar="LABEL=CHECKOUT",
                   help="an npufix checkout to test (repeatable; default: this one)")
    p.add_argument("--python", default=sys.executable, help="Python with npufix's dependencies")
    p.add_argument("--profiles", default=",".join([*JUDGES, *CROSS]), type=lambda s: s.split(","))
    p.add_argument("--learned", action="append", default=[], metavar="PROFILE=FILE.toml",
                   help="also judge npufix's output for FILE (written by `npufix probe` against PROFILE's compiler) "
                        "as column 'PROFILE learned' (repeatable)")
    p.add_argument("--only", action="append", default=[], help="only these models, judged in this order (repeatable)")
    p.add_argument("--work", default=None, help="scratch + cache directory (default: MODELS/matrix-work)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds for one judge run")
    p.add_argument("--render", action="store_true", help="only rewrite the markdown from the cache")
    p.add_argument("--retry-undecided", action="store_true",
                   help="judge again what has no verdict in the cache (converter failure, timeout)")
    p.add_argument("--npufix-only", action="store_true",
                   help="only run the checkouts' npufix (no compiler): a second process can prepare a later round")
    p.add_argument("--stop-at", metavar="HH:MM", help="UTC time after which no new compile or npufix run starts")
    p.add_argument("--notes", metavar="FILE.md",
                   help="markdown appended after the tables: what the cells the run cannot explain mean (written by "
                        "hand, from the compilers' logs; vendor/acceptance_notes.md)")
    args = p.parse_args()
    args.models = os.path.abspath(args.models)
    args.work = os.path.abspath(args.work or os.path.join(args.models, "matrix-work"))
    os.makedirs(args.work, exist_ok=True)
    manifest = json.load(open(os.path.join(args.models, "models.json"), encoding="utf-8"))
    if args.only:
        manifest = {k: manifest[k] for k in args.only if k in manifest}  # in the order given
    checkouts = dict(s.split("=", 1) for s in args.npufix) or {"this": os.path.dirname(HERE)}
    for spec in args.learned:
        profile, path = spec.split("=", 1)
        LEARNED[f"{profile} learned"] = (os.path.abspath(path), JUDGES[profile])
        args.profiles.append(f"{profile} learned")
    cache = Cache(os.path.join(args.work, "results.jsonl"))
    missing = sorted({judge_spec(c)[2] for c in args.profiles if not os.environ.get(judge_spec(c)[2])})
    if missing:
        log("not judged (variable unset): " + ", ".join(missing))
    if not args.render:
        run_all(args, manifest, cache, checkouts)
    text = render(args, manifest, cache, checkouts)
    if args.notes:
        with open(args.notes, encoding="utf-8") as f:
            text += "\n" + f.read()
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    log(f"wrote {args.out}: " + shlex.join(sys.argv[1:]))


if __name__ == "__main__":
    main()
