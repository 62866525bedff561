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

A trace that does not cover the whole run (the ring overflowed, or the history
was switched on mid-run) gives only lower bounds for the peaks. A budget such a
bound meets is not confirmed: check_budget() raises BudgetUnconfirmed (an
AssertionError, so the test fails) unless accept_lower_bounds=True. Our own
recorder's snapshots carry the allocator's peaks and always conclude.
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


class BudgetUnconfirmed(AssertionError):
    """No budget is exceeded, but one is met only by a lower bound."""

    def __init__(self, lines):
        super().__init__("budget not confirmed:\n  " + "\n  ".join(lines))
        self.lines = lines


def _tool():
    tool = os.environ.get("CACHEALLOC_ANALYZE") or shutil.which("cachealloc-analyze")
    if not tool:
        raise FileNotFoundError("cachealloc-analyze not found: set CACHEALLOC_ANALYZE or put it on PATH")
    return tool


def check_budget(recording, accept_lower_bounds=False, **budgets):
    """Returns the exceeded budgets, one line each ([] when all are met).

    budgets: max_peak_reserved, max_peak_allocated, max_leaked (bytes: an int or
    text such as "20GiB"), max_fragmentation (a share: 0.3 or "30%").
    Raises BudgetUnconfirmed when none is exceeded but one is met only by a
    lower bound, unless accept_lower_bounds.
    """
    command = [_tool(), "check", os.fspath(recording)]
    if accept_lower_bounds:
        command.append("--accept-lower-bounds")
    for name, value in budgets.items():
        if name not in _OPTIONS:
            raise TypeError("unknown budget %r (known: %s)" % (name, ", ".join(_OPTIONS)))
        if value is not None:
            command += [_OPTIONS[name], str(value)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == 0:
        return []
    lines = [line for line in done.stdout.splitlines() if line and not line.startswith("note:")]
    if done.returncode == 1:
        return [line for line in lines if " cannot be confirmed" not in line]
    if done.returncode == 3:
        raise BudgetUnconfirmed(lines)
    raise ValueError(done.stderr.strip() or "cachealloc-analyze check exited with %d" % done.returncode)


def assert_within_budget(recording, accept_lower_bounds=False, **budgets):
    exceeded = check_budget(recording, accept_lower_bounds, **budgets)
    if exceeded:
        raise AssertionError("%s exceeds its GPU memory budget:\n  %s" % (recording, "\n  ".join(exceeded)))


if __name__ == "__main__":
    # python3 cachealloc_check.py FILE max_peak_reserved=20GiB ... [accept_lower_bounds=1]:
    # exit 0 met, 1 exceeded, 2 bad input, 3 met only by a lower bound.
    if len(sys.argv) < 3:
        print("usage: cachealloc_check.py FILE BUDGET=VALUE... [accept_lower_bounds=1]", file=sys.stderr)
        sys.exit(2)
    try:
        pairs = [arg.split("=", 1) for arg in sys.argv[2:]]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError("each budget is NAME=VALUE, e.g. max_peak_reserved=20GiB")
        options = dict(pairs)
        accept = options.pop("accept_lower_bounds", "0") not in ("0", "", "false", "False")
        lines = check_budget(sys.argv[1], accept, **options)
    except BudgetUnconfirmed as unconfirmed:
        for line in unconfirmed.lines:
            print(line)
        sys.exit(3)
    except (ValueError, TypeError, FileNotFoundError) as error:
        print("cachealloc_check: error: %s" % error, file=sys.stderr)
        sys.exit(2)
    for line in lines:
        print(line)
    sys.exit(1 if lines else 0)
