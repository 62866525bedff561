"""pip install ./python: the package, the cachealloc-analyze CLI and, where
torch and the CUDA toolkit are found, the torch extension.

The C++ parts come from one CMake build of the repository this folder sits
in (its parent). The metadata is in pyproject.toml; this file only adds the
CMake step to build_py, so it runs offline with --no-build-isolation and the
setuptools of Debian 12 (66).

Environment:
  CACHEALLOC_UPLOT_DIR    uPlot's dist/ folder for the HTML report, offline
                          (else one that npm put into a build*/ folder of the
                          checkout, else CMake runs npm ci)
  CACHEALLOC_CMAKE_ARGS   more arguments for CMake's configure, split as a
                          shell would (-DCACHEALLOC_TORCH=OFF, -DCMAKE_BUILD_TYPE=RelWithDebInfo)
  CACHEALLOC_PREBUILT_CLI an already built cachealloc-analyze to package
                          instead of running CMake (the torch extension is
                          then not built)
"""
import os
import pathlib
import shlex
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
CLI = "cachealloc-analyze"
EXTENSION = "libcachealloc_torch.so"


class BuildError(SystemExit):
    """One line on stderr and a failed build."""

    def __init__(self, line):
        super().__init__("cachealloc: " + line)


def _target_env():
    """The environment for CMake: pip's build isolation hides the target
    environment's packages (PYTHONPATH to its overlay, PYTHONNOUSERSITE), and
    the extension must see the torch it will run against."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and "pip-build-env" not in p]
    if paths != [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]:
        env.pop("PYTHONNOUSERSITE", None)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    return env


def _uplot_dir(extra_args):
    """uPlot for the HTML report without the network: $CACHEALLOC_UPLOT_DIR,
    else the one npm put into a build folder of this checkout (build*/);
    None lets CMake run npm ci."""
    if any(a.startswith("-DCACHEALLOC_UPLOT_DIR") for a in extra_args):
        return None
    candidates = [pathlib.Path(os.environ["CACHEALLOC_UPLOT_DIR"])] if os.environ.get("CACHEALLOC_UPLOT_DIR") else \
        sorted(ROOT.glob("build*/analyzer/report-npm/node_modules/uplot/dist"))
    for candidate in candidates:
        if (candidate / "uPlot.iife.min.js").is_file() and (candidate / "uPlot.min.css").is_file():
            return candidate.resolve()
    if os.environ.get("CACHEALLOC_UPLOT_DIR"):
        raise BuildError("CACHEALLOC_UPLOT_DIR=%s holds no uPlot.iife.min.js and uPlot.min.css"
                         % os.environ["CACHEALLOC_UPLOT_DIR"])
    return None


def _run(command, env, what):
    print("cachealloc: " + " ".join(shlex.quote(str(c)) for c in command), flush=True)
    try:
        subprocess.run([str(c) for c in command], check=True, env=env)
    except FileNotFoundError:
        raise BuildError("%s: %s is not installed (CMake >= 3.25 and a C++20 compiler are needed; README.md, Install)"
                         % (what, command[0]))
    except subprocess.CalledProcessError:
        raise BuildError("%s failed (CMake's messages above; the build needs cereal, CLI11, zlib, zstd, "
                         "Boost.Stacktrace, and uPlot from npm or CACHEALLOC_UPLOT_DIR: README.md, Install)" % what)


def _cmake_build(build_dir):
    """Configures and builds the CLI, and the extension where CMake found
    torch and CUDA. Returns (cli path, extension path or None, why not)."""
    if not (ROOT / "CMakeLists.txt").exists() or not (ROOT / "cli").is_dir():
        raise BuildError("the C++ sources are not beside python/ (%s has no CMakeLists.txt): "
                         "pip install ./python from a checkout of the repository" % ROOT)
    env = _target_env()
    build_dir.mkdir(parents=True, exist_ok=True)
    configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                 "-DCACHEALLOC_BUILD_TESTS=OFF", "-DCACHEALLOC_BUILD_BENCH=OFF",
                 "-DPython3_EXECUTABLE=" + sys.executable]
    if not (build_dir / "CMakeCache.txt").exists() and shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    extra = shlex.split(os.environ.get("CACHEALLOC_CMAKE_ARGS", ""))
    uplot = _uplot_dir(extra)
    if uplot is not None:
        configure.append("-DCACHEALLOC_UPLOT_DIR=%s" % uplot)
    configure += extra
    _run(configure, env, "CMake's configure")
    status_file = build_dir / "cachealloc_torch_extension.txt"
    status = status_file.read_text().strip() if status_file.exists() else "not configured"
    targets = [CLI] + (["cachealloc_torch"] if status == "ON" else [])
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    _run(["cmake", "--build", build_dir, "--parallel", jobs, "--target"] + targets, env, "the CMake build")
    cli = build_dir / "bin" / CLI
    extension = build_dir / "lib" / EXTENSION if status == "ON" else None
    return cli, extension, status


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        package = pathlib.Path(self.build_lib) / "cachealloc"
        prebuilt = os.environ.get("CACHEALLOC_PREBUILT_CLI")
        if prebuilt:
            cli, extension, why = pathlib.Path(prebuilt), None, "CACHEALLOC_PREBUILT_CLI skips CMake"
            if not cli.is_file():
                raise BuildError("CACHEALLOC_PREBUILT_CLI=%s is not a file" % prebuilt)
        else:
            build_temp = pathlib.Path(self.get_finalized_command("build").build_temp)
            cli, extension, why = _cmake_build(build_temp.resolve() / "cmake")
        (package / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(cli, package / "bin" / CLI)
        os.chmod(package / "bin" / CLI, 0o755)
        stale = package / EXTENSION
        if stale.exists():
            stale.unlink()
        if extension is not None:
            shutil.copy2(extension, package / EXTENSION)
            torch_line = "built"
        else:
            torch_line = "not built (%s)" % why
        (package / "_build_info.py").write_text(
            '"""What pip install built (written by setup.py)."""\n'
            "CLI = %r\nTORCH_EXTENSION = %r\n" % (CLI, torch_line))
        print("cachealloc: built: %s; the torch extension: %s" % (CLI, torch_line), flush=True)


def _require_wheel():
    """setuptools before 70 builds wheels through the wheel package; pip's
    build isolation installs it, --no-build-isolation takes the environment's."""
    if not {"bdist_wheel", "dist_info", "editable_wheel"} & set(sys.argv[1:]):
        return
    try:
        import wheel  # noqa: F401
    except ImportError:
        raise BuildError("this environment has no wheel package, which setuptools %s needs to build: "
                         "install Debian's python3-wheel and make the venv with --system-site-packages, "
                         "or pip install wheel" % __import__("setuptools").__version__)


class BinaryDistribution(Distribution):
    """The wheel carries native code: a platform wheel, never py3-none-any."""

    def has_ext_modules(self):
        return True


_require_wheel()
setup(cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)
