"""pip install ./python, offline, in a fresh venv: the console command runs
the CLI with its arguments, stdin, stdout and exit code, and without torch
cachealloc.torch.install() raises one line.

    python3 python/tests/test_pip_install.py build/bin/cachealloc-analyze

The CLI given is packaged as built (CACHEALLOC_PREBUILT_CLI), so the test
takes seconds; the CMake path of setup.py is the same code after that
point. Exit 77 (skipped) where no python3 here has setuptools >= 61, wheel
and venv, which --no-build-isolation needs.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "testdata" / "synthetic_2k_native.bin"
PROBE = ("import setuptools, wheel, venv, sys; "
         "sys.exit(0 if int(setuptools.__version__.split('.')[0]) >= 61 else 1)")


def build_python():
    for candidate in (sys.executable, "/usr/bin/python3"):
        if candidate and os.path.exists(candidate) and \
                subprocess.run([candidate, "-c", PROBE], capture_output=True).returncode == 0:
            return candidate
    return None


def run(command, **kwargs):
    return subprocess.run([str(c) for c in command], capture_output=True, **kwargs)


def check(condition, what, result=None):
    if not condition:
        detail = ""
        if result is not None:
            detail = "\n--- stdout\n%s\n--- stderr\n%s" % (result.stdout.decode(errors="replace")[-3000:],
                                                           result.stderr.decode(errors="replace")[-3000:])
        sys.exit("FAIL: %s%s" % (what, detail))
    print("ok:", what)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: test_pip_install.py CACHEALLOC_ANALYZE")
    cli = pathlib.Path(sys.argv[1]).resolve()
    python = build_python()
    if python is None:
        print("skipped: no python3 with setuptools >= 61, wheel and venv for pip install --no-build-isolation")
        return 77
    with tempfile.TemporaryDirectory(prefix="cachealloc-pip-") as tmp:
        tmp = pathlib.Path(tmp)
        # A copy of python/: the in-tree build leaves build/ and *.egg-info beside the sources.
        source = tmp / "python"
        shutil.copytree(ROOT / "python", source,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "bin",
                                                      "_build_info.py", "*.so"))
        venv = tmp / "venv"
        created = run([python, "-m", "venv", "--system-site-packages", venv])
        check(created.returncode == 0, "a venv of %s" % python, created)
        env = dict(os.environ, CACHEALLOC_PREBUILT_CLI=str(cli), PIP_NO_INDEX="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
        installed = run([venv / "bin" / "python", "-m", "pip", "install", "-v", "--no-build-isolation", source],
                        env=env, cwd=tmp)
        check(installed.returncode == 0, "pip install --no-build-isolation ./python, offline", installed)
        check(b"cachealloc: built: cachealloc-analyze; the torch extension: not built" in
              installed.stdout + installed.stderr,
              "the build says in one line what it built", installed)

        entry = venv / "bin" / "cachealloc-analyze"
        check(entry.exists(), "cachealloc-analyze is on the venv's PATH")
        path_env = dict(os.environ, PATH="%s%s%s" % (venv / "bin", os.pathsep, os.environ.get("PATH", "")))
        for arguments, stdin in ((["summary", SAMPLE], None), (["summary", "--format", "json", "-"], SAMPLE),
                                 (["summary", tmp / "missing.bin"], None), (["no-such-command"], None)):
            feed = SAMPLE.read_bytes() if stdin else None
            through_pip = run(["cachealloc-analyze"] + arguments, env=path_env, input=feed, cwd=tmp)
            direct = run([cli] + arguments, input=feed, cwd=tmp)
            what = "cachealloc-analyze %s%s" % (" ".join(str(a) for a in arguments), " < sample" if stdin else "")
            check(through_pip.returncode == direct.returncode and through_pip.stdout == direct.stdout and
                  through_pip.stderr.replace(str(cli).encode(), b"cachealloc-analyze") ==
                  direct.stderr.replace(str(cli).encode(), b"cachealloc-analyze"),
                  "%s: the same exit code (%d), stdout and stderr as the binary" % (what, direct.returncode),
                  through_pip)
        check(run(["cachealloc-analyze", "summary", tmp / "missing.bin"], env=path_env).returncode == 2,
              "bad input exits 2 through the console command")

        venv_python = venv / "bin" / "python"
        has_torch = run([venv_python, "-c", "import torch"], cwd=tmp).returncode == 0
        if not has_torch:
            refused = run([venv_python, "-c", "import cachealloc.torch as t; t.install()"], cwd=tmp)
            last = refused.stderr.decode(errors="replace").strip().splitlines()[-1:]
            check(refused.returncode != 0 and last and
                  last[0].startswith("cachealloc._native.NotAvailable: cachealloc: torch is not importable here"),
                  "without torch, cachealloc.torch.install() raises one clear line", refused)
        status = run([venv_python, "-m", "cachealloc"], cwd=tmp)
        check(status.returncode == 0 and b"the torch extension: not built (CACHEALLOC_PREBUILT_CLI skips CMake)"
              in status.stdout, "python -m cachealloc says what pip install built", status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
