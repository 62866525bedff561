"""Finds and loads libcachealloc_torch.so, the torch extension that
pip install ./python builds where torch and the CUDA toolkit are found."""
import ctypes
import os
import pathlib

_HERE = pathlib.Path(__file__).resolve().parent
_lib = None


class NotAvailable(RuntimeError):
    """The extension cannot be loaded here; the message is one line that says why."""


def extension_status():
    """What pip install recorded for the extension: "built" or "not built (why)";
    "unknown" when the package runs from the source tree."""
    try:
        from . import _build_info
    except ImportError:
        return "unknown (not installed by pip install ./python)"
    return _build_info.TORCH_EXTENSION


def cli_path():
    """The cachealloc-analyze binary inside the package."""
    return _HERE / "bin" / "cachealloc-analyze"


def library_path():
    """The extension: $CACHEALLOC_TORCH_LIBRARY, else the copy inside this
    package (pip install ./python), else a CMake build tree's build/lib/ (the
    package run from the source tree)."""
    env = os.environ.get("CACHEALLOC_TORCH_LIBRARY")
    if env:
        return pathlib.Path(env)
    for candidate in (_HERE / "libcachealloc_torch.so",
                      _HERE.parent.parent / "build" / "lib" / "libcachealloc_torch.so"):
        if candidate.exists():
            return candidate
    raise NotAvailable(
        "cachealloc: the torch extension (libcachealloc_torch.so) is %s: install torch and the CUDA toolkit, "
        "then pip install ./python again, or set CACHEALLOC_TORCH_LIBRARY to its path" % extension_status())


def load():
    """The extension, loaded once; NotAvailable without torch or without it."""
    global _lib
    if _lib is None:
        try:
            import torch  # noqa: F401  (torch's libraries first: the extension links them)
        except ImportError as error:
            raise NotAvailable("cachealloc: torch is not importable here (%s): cachealloc.torch needs PyTorch 2.11 "
                               "with CUDA" % error) from None
        lib = ctypes.CDLL(str(library_path()))
        lib.cachealloc_torch_install.restype = ctypes.c_int
        lib.cachealloc_torch_error.restype = ctypes.c_char_p
        lib.cachealloc_torch_annotate.argtypes = [ctypes.c_int, ctypes.c_char_p]
        lib.cachealloc_torch_dump.argtypes = [ctypes.c_int, ctypes.c_char_p]
        lib.cachealloc_torch_dump.restype = ctypes.c_int
        lib.cachealloc_torch_set_stacks.argtypes = [ctypes.c_char_p]
        lib.cachealloc_torch_set_stacks.restype = ctypes.c_int
        lib.cachealloc_torch_set_stream.argtypes = [ctypes.c_char_p]
        lib.cachealloc_torch_set_stream.restype = ctypes.c_int
        lib.cachealloc_torch_set_torch_frames.argtypes = [ctypes.c_int]
        lib.cachealloc_torch_tag_category.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_char_p]
        lib.cachealloc_torch_tag_category.restype = ctypes.c_int
        _lib = lib
    return _lib


def check(rc):
    """Raises the extension's last error when rc is not 0."""
    if rc != 0:
        raise RuntimeError("cachealloc: " + load().cachealloc_torch_error().decode(errors="replace"))
