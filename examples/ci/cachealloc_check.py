"""GPU memory budgets for CI jobs written in Python (pytest, unittest, plain scripts).

No torch needed: it runs `cachealloc-analyze check` on a recording (our snapshot
or a PyTorch memory-snapshot pickle from torch.cuda.memory._dump_snapshot) and
turns its verdict into a Python result.

    from cachealloc_check import assert_within_budget
    def test_training_step_fits():
        assert_within_budget("run.pickle", max_peak_reserved="20GiB", max_fragmentation="30%")

check_budget() returns the list of exceeded budgets (one line each, empty when all
are met); assert_within_budget() raises AssertionError listing them. Bad input
(an unreadable file, a malformed budget) raises ValueError with the tool's line.
The tool is found as $CACHEALLOC_ANALYZE, else `cachealloc-analyze` on PATH.
"""
import os
import shutil
import subprocess
import sys

_OPTIONS = {
    "max_peak_reserved": "--max-peak-reserved",
    "max_peak_allocated": "--max-peak-allocated",
    "max_fragmentation": "--max-fragmentation",
    "max_leaked": "--max-leaked",
}


def _tool():
    tool = os.environ.get("CACHEALLOC_ANALYZE") or shutil.which("cachealloc-analyze")
    if not tool:
        raise FileNotFoundError("cachealloc-analyze not found: set CACHEALLOC_ANALYZE or put it on PATH")
    return tool


def check_budget(recording, **budgets):
    """Returns the exceeded budgets, one line each ([] when all are met).

    budgets: max_peak_reserved, max_peak_allocated, max_leaked (bytes: an int or
    text such as "20GiB"), max_fragmentation (a share: 0.3 or "30%").
    """
    command = [_tool(), "check", os.fspath(recording)]
    for name, value in budgets.items():
        if name not in _OPTIONS:
            raise TypeError("unknown budget %r (known: %s)" % (name, ", ".join(_OPTIONS)))
        if value is not None:
            command += [_OPTIONS[name], str(value)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == 0:
        return []
    if done.returncode == 1:
        return [line for line in done.stdout.splitlines() if line and not line.startswith("note:")]
    raise ValueError(done.stderr.strip() or "cachealloc-analyze check exited with %d" % done.returncode)


def assert_within_budget(recording, **budgets):
    exceeded = check_budget(recording, **budgets)
    if exceeded:
        raise AssertionError("%s exceeds its GPU memory budget:\n  %s" % (recording, "\n  ".join(exceeded)))


if __name__ == "__main__":
    # python3 cachealloc_check.py FILE max_peak_reserved=20GiB ... : exit 0 met, 1 exceeded, 2 bad input.
    if len(sys.argv) < 3:
        sys.exit("usage: cachealloc_check.py FILE BUDGET=VALUE...")
    try:
        lines = check_budget(sys.argv[1], **dict(arg.split("=", 1) for arg in sys.argv[2:]))
    except (ValueError, TypeError) as error:
        print("cachealloc_check: error: %s" % error, file=sys.stderr)
        sys.exit(2)
    for line in lines:
        print(line)
    sys.exit(1 if lines else 0)
