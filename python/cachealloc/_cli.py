"""The cachealloc-analyze console command: runs the C++ CLI that pip install
built into this package, with the same arguments, stdin, stdout and exit code."""
import os
import pathlib
import sys

CLI = pathlib.Path(__file__).resolve().parent / "bin" / "cachealloc-analyze"


def main():
    if not os.access(CLI, os.X_OK):
        sys.stderr.write("cachealloc-analyze: %s is missing: pip install ./python builds it\n" % CLI)
        return 2
    # exec, not a child: signals, the terminal and the exit status are the CLI's own.
    os.execv(str(CLI), ["cachealloc-analyze"] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
