#!/usr/bin/env python3
"""Hostile-input campaign over every subcommand of cachealloc-analyze.

    fuzz/campaign.py --cli build/bin/cachealloc-analyze [--inputs 2500] [--jobs N]
                     [--seed 1] [--out campaign-out]

Makes --inputs inputs from the recordings under testdata/ and
analyzer/testdata/ (files of up to 64 KiB: our format, PyTorch pickles):

  - first stage: byte mutations (bytes overwritten, inserted, deleted,
    a span repeated, the file cut short);
  - second stage, shaped to get past the readers' framing: pickles with
    their FRAME opcodes removed, then mutated opcode by opcode (integer
    arguments set to edge values, strings replaced by other actions, by
    control characters or invalid UTF-8, whole opcodes deleted or
    repeated); our format mutated inside the body with body_size corrected;
    some of them gzip- or zstd-compressed;
  - hand-made hostile files (compression bombs, endless zeros, wrapped
    sizes, deep nesting, escapes in names, ...).

The inputs are made by campaign_inputs.py.

Each input goes through every subcommand that `--help` lists (the reports
in JSON and in a table or CSV, export of every table, convert to both
formats and the result read back, flamegraph, html, replay, replay --sweep,
recommend, check, diff and ranks against the file it came from), each run
under a 2 GiB address-space limit (ulimit -v) with a 10 s timeout, in an
empty folder of its own. Every run is put in the classes it fails (FAILURES
below); the counts per class are printed, and up to 5 reproducers per class
(the input and the command) are kept under OUT/repro/CLASS/. Exit status:
0 when every class is at 0, 1 otherwise.

Python 3 standard library only.
"""

import argparse
import collections
import concurrent.futures
import csv
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from campaign_inputs import make_inputs

ROOT = Path(__file__).resolve().parent.parent
csv.field_size_limit(sys.maxsize)
ADDRESS_SPACE_KIB = 2 * 1024 * 1024  # ulimit -v: 2 GiB
TIMEOUT_S = 10
ABSURD = 2**50  # bytes no GPU has: a figure above it is garbage or a wrapped total

FAILURES = {
    "crash": "killed by a signal",
    "exit_other": "exit status other than 0 or 2 (check: 0-3), or an internal error",
    "multi_line_error": "exit 2 without exactly one line 'cachealloc-analyze: error: ...' on stderr",
    "invalid_output": "JSON that does not parse, output that is not UTF-8, an SVG that is not XML",
    "ragged_csv": "a CSV record with another number of fields than its header",
    "stray_files": "files left behind other than the ones asked for (none after a failure)",
    "timeout": f"still running after {TIMEOUT_S} s",
    "absurd_figure": f"a byte figure above 2^50 or below -2^50 in JSON",
    "control_bytes": "a raw control character in a table or on stderr",
    "partial_stdout": "output on stdout before an error exit",
    "readback": "a file convert wrote that cachealloc-analyze cannot read",
}

REPORTS = ["summary", "segments", "fragmentation", "timeline", "peak", "top", "leaks", "oom", "events"]
EXPORT_TABLES = ["timeline", "events", "segments", "sites", "perfetto"]
SMALL_GRID = ["--sweep-axis", "expandable_segments=False,True", "--sweep-axis", "roundup_power2_divisions=0,4",
              "--sweep-axis", "max_split_size_mb=unlimited"]

# --------------------------------------------------------------------------- commands


def subcommands(cli: str):
    """The subcommands `--help` lists."""
    text = subprocess.run([cli, "--help"], capture_output=True, text=True, check=True).stdout
    names, inside = [], False
    for line in text.splitlines():
        if line.startswith("Subcommands:"):
            inside = True
            continue
        if inside:
            match = re.match(r"^  (\S+)\s", line)
            if match:
                names.append(match.group(1))
            elif line.strip() == "" and names:
                break
    return names


class Run:
    """One command: arguments, the files it is asked to write, how to check it."""

    def __init__(self, sub, args, fmt="table", outputs=(), allowed=(0, 2), readback=None, kind=None):
        self.sub, self.args, self.fmt = sub, args, fmt
        self.outputs, self.allowed, self.readback, self.kind = list(outputs), allowed, readback, kind


def commands_for(index: int, path: Path, base, names):
    """Every subcommand on one input."""
    p = str(path)
    other = str(base) if base is not None else p
    side = "table" if index % 2 == 0 else "csv"
    runs = []
    for report in REPORTS:
        runs.append(Run(report, [report, p, "--format", "json"], "json"))
        if side == "csv":
            runs.append(Run(report, [report, p, "--format", "csv", "-o", "out/"], "csv_dir", outputs=["out"]))
        else:
            runs.append(Run(report, [report, p], "table"))
    runs.append(Run("events", ["events", p, "--all-events", "--format", "csv"], "csv"))
    runs.append(Run("events", ["events", p, "--all-events", "--format", "json"], "json"))
    for table in EXPORT_TABLES:
        fmt = "json" if table == "perfetto" else "csv"
        runs.append(Run("export", ["export", p, "--what", table], fmt))
    runs.append(Run("convert", ["convert", p, "-o", "back.bin"], "none", outputs=["back.bin"], readback="back.bin"))
    runs.append(Run("convert", ["convert", p, "-o", "back.pickle"], "none", outputs=["back.pickle"],
                    readback="back.pickle"))
    runs.append(Run("flamegraph", ["flamegraph", p, "-o", "flame.svg"], "none", outputs=["flame.svg"], kind="svg"))
    runs.append(Run("flamegraph", ["flamegraph", p, "--collapsed"], "table"))
    runs.append(Run("html", ["html", p, "-o", "report.html"], "none", outputs=["report.html"], kind="html"))
    runs.append(Run("replay", ["replay", p, "--format", "json"], "json"))
    runs.append(Run("replay", ["replay", p, "--set", "expandable_segments=True", "--capacity", "1GiB"], "table"))
    runs.append(Run("replay", ["replay", p, "--sweep", "--threads", "2", "--format", "json"] + SMALL_GRID, "json"))
    runs.append(Run("replay", ["replay", p, "--sweep", "--threads", "2", "--capacity", "512MiB"] + SMALL_GRID,
                    "table"))
    runs.append(Run("recommend", ["recommend", p, "--threads", "2", "--format", "json"], "json"))
    runs.append(Run("check", ["check", p, "--max-peak-reserved", "1GiB", "--max-leaked", "0",
                              "--max-fragmentation", "30%"], "table", allowed=(0, 1, 2, 3)))
    runs.append(Run("check", ["check", p, "--max-peak-allocated", "100MiB", "--format", "json"], "json",
                    allowed=(0, 1, 2, 3)))
    runs.append(Run("diff", ["diff", other, p, "--format", "json"], "json"))
    runs.append(Run("diff", ["diff", p, other, "--by", "allocated_over_run"], "table"))
    runs.append(Run("ranks", ["ranks", other, p, "--format", "json"], "json"))
    missing = set(names) - {r.sub for r in runs}
    if missing:
        raise SystemExit(f"campaign: no command for the subcommand(s) {sorted(missing)}: add them to commands_for()")
    return runs


# --------------------------------------------------------------------------- checks

CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")  # tab and newline are a table's own
SIZE_KEY = re.compile(r"bytes|size|reserved|allocated|active|requested|cached|free|leaked|inactive|total|"
                      r"headroom|cap$|capacity|peak")
NOT_SIZE_KEY = re.compile(r"address|time|event|_ns$|index|count|rank|stream|device$|segments|allocs|frees|ooms|"
                          r"retries|share|fraction|ratio|percent|scale|points|threads|_vs_|imbalance|blocks|"
                          r"keyframes|buckets|id$|line|frames|calls|splits|merges")


def absurd_figures(value, key="", path=""):
    """Paths of byte figures out of any GPU's range."""
    found = []
    if isinstance(value, dict):
        for k, v in value.items():
            found += absurd_figures(v, str(k), f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += absurd_figures(v, key, f"{path}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        k = key.lower()
        if SIZE_KEY.search(k) and not NOT_SIZE_KEY.search(k) and abs(value) > ABSURD:
            found.append(f"{path}={value}")
    return found


def reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def check_json(text: bytes, classes):
    try:
        document = json.loads(text.decode("utf-8"), parse_constant=reject_constant)
    except (UnicodeDecodeError, ValueError):
        classes.add("invalid_output")
        return
    if absurd_figures(document):
        classes.add("absurd_figure")


def check_csv(text: bytes, classes):
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        classes.add("invalid_output")
        return
    try:
        rows = list(csv.reader(io.StringIO(decoded, newline="")))
    except csv.Error:
        classes.add("invalid_output")
        return
    if rows and any(len(row) != len(rows[0]) for row in rows):
        classes.add("ragged_csv")


def check_run(run: Run, rc, out: bytes, err: bytes, folder: Path, cli, readback_rc):
    """The classes this run fails."""
    classes = set()
    if rc is None:
        return {"timeout"}
    if rc < 0:
        classes.add("crash")
    elif rc not in run.allowed or b"internal error" in err:
        classes.add("exit_other")
    if CONTROL.search(err):
        classes.add("control_bytes")
    if rc == 2:
        lines = err.decode("utf-8", "replace").splitlines()
        if len(lines) != 1 or not lines[0].startswith("cachealloc-analyze: error: "):
            classes.add("multi_line_error")
    failed = rc != 0 and not (run.sub == "check" and rc in (1, 3))
    if failed and out:
        classes.add("partial_stdout")
    left = sorted(p.name for p in folder.iterdir() if p.name != "tmp") + sorted(
        "tmp/" + p.name for p in (folder / "tmp").iterdir())
    expected = [] if failed else sorted(run.outputs)
    if left != expected:
        classes.add("stray_files")
    if failed:
        return classes
    if run.fmt == "json":
        check_json(out, classes)
    elif run.fmt == "csv":
        check_csv(out, classes)
    elif run.fmt == "csv_dir" and (folder / "out").is_dir():
        for table in sorted((folder / "out").iterdir()):
            check_csv(table.read_bytes(), classes)
    elif run.fmt == "table":
        try:
            out.decode("utf-8")
        except UnicodeDecodeError:
            classes.add("invalid_output")
        if CONTROL.search(out):
            classes.add("control_bytes")
    if run.kind in ("svg", "html") and (folder / run.outputs[0]).exists():
        page = (folder / run.outputs[0]).read_bytes()
        try:
            page.decode("utf-8")
            if run.kind == "svg":
                ElementTree.fromstring(page)
        except (UnicodeDecodeError, ElementTree.ParseError):
            classes.add("invalid_output")
    if run.readback is not None and readback_rc is not None and readback_rc[0] != 0:
        classes.add("readback")
    elif run.readback is not None and readback_rc is not None:
        check_json(readback_rc[1], classes)
    return classes


def limited(cli, args):
    return ["sh", "-c", f'ulimit -v {ADDRESS_SPACE_KIB} && exec "$0" "$@"', cli] + args


def execute(cli, args, folder: Path):
    """(exit status or None on timeout, stdout, stderr); a signal is a negative status."""
    env = dict(os.environ, TMPDIR=str(folder / "tmp"))
    process = subprocess.Popen(limited(cli, args), cwd=folder, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.communicate()
        return None, b"", b""


def run_one(cli, run: Run, scratch: Path, number: int):
    folder = scratch / f"run{number}"
    (folder / "tmp").mkdir(parents=True)
    try:
        rc, out, err = execute(cli, run.args, folder)
        readback = None
        if run.readback is not None and rc == 0 and (folder / run.readback).exists():
            # Read back in a folder of its own, so its files are not this run's.
            back = scratch / f"back{number}"
            (back / "tmp").mkdir(parents=True)
            target = back / run.readback
            shutil.move(str(folder / run.readback), target)
            brc, bout, _ = execute(cli, ["summary", str(target), "--format", "json"], back)
            shutil.move(str(target), folder / run.readback)
            readback = (brc, bout)
            shutil.rmtree(back, ignore_errors=True)
        classes = check_run(run, rc, out, err, folder, cli, readback)
        return classes, rc, err[:400]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- main


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", default=str(ROOT / "build" / "bin" / "cachealloc-analyze"))
    parser.add_argument("--inputs", type=int, default=2500, help="inputs to make (hostile and bases included)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="campaign-out")
    parser.add_argument("--sample", type=int, default=0,
                        help="run only this many of the inputs, picked at random (a quick look; 0: all)")
    options = parser.parse_args()
    cli = str(Path(options.cli).resolve())
    out = Path(options.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    (out / "inputs").mkdir(parents=True)
    rng = random.Random(options.seed)
    names = subcommands(cli)
    inputs = make_inputs(options.inputs, rng, out / "inputs")
    if options.sample:
        inputs = random.Random(options.seed).sample(inputs, min(options.sample, len(inputs)))
    jobs = []
    for index, (path, base, how) in enumerate(inputs):
        for run in commands_for(index, path, base, names):
            jobs.append((path, how, run))
    print(f"campaign: {len(jobs)} commands over {len(inputs)} inputs, subcommands {', '.join(names)}; "
          f"{options.jobs} at a time, ulimit -v {ADDRESS_SPACE_KIB} KiB, timeout {TIMEOUT_S} s", flush=True)
    counts = collections.Counter()
    per_sub = collections.Counter()
    exits = collections.Counter()
    kinds = collections.Counter(how for _, _, how in inputs)
    kept = collections.defaultdict(list)
    where = collections.defaultdict(collections.Counter)
    scratch = Path(tempfile.mkdtemp(prefix="campaign-"))
    with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
        futures = {pool.submit(run_one, cli, run, scratch, n): (path, how, run)
                   for n, (path, how, run) in enumerate(jobs)}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            path, how, run = futures[future]
            classes, rc, err = future.result()
            per_sub[run.sub] += 1
            exits[rc] += 1
            for c in classes:
                counts[c] += 1
                where[c][run.sub] += 1
                if len(kept[c]) < 5:
                    kept[c].append((path, run.args, rc, err))
            if done % 5000 == 0:
                print(f"  {done} of {len(jobs)}", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    for c, examples in kept.items():
        folder = out / "repro" / c
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "commands.txt", "w") as notes:
            for path, args, rc, err in examples:
                shutil.copyfile(path, folder / path.name)
                shown = " ".join(a if a != str(path) else path.name for a in args)
                notes.write(f"cachealloc-analyze {shown}\n  exit {rc}; stderr: {err!r}\n")
    print(f"inputs: {len(inputs)} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})")
    print(f"commands per subcommand: {', '.join(f'{k} {v}' for k, v in sorted(per_sub.items()))}")
    print(f"exit statuses: {', '.join(f'{k} {v}' for k, v in sorted(exits.items(), key=lambda kv: str(kv[0])))}")
    print("failures per class:")
    for c, why in FAILURES.items():
        subs = ", ".join(f"{k} {v}" for k, v in sorted(where[c].items()))
        print(f"  {c:17s} {counts[c]:7d}  {why}{f' ({subs})' if subs else ''}")
    summary = {"commands": len(jobs), "inputs": len(inputs), "kinds": kinds, "per_subcommand": per_sub,
               "exits": {str(k): v for k, v in exits.items()}, "failures": {c: counts[c] for c in FAILURES},
               "failures_per_subcommand": {c: dict(where[c]) for c in FAILURES if where[c]}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0 if sum(counts.values()) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
