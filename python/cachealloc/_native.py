"""Finds and loads libcachealloc_torch.so (built by CMake where torch is found)."""
import ctypes
import os
import pathlib

_lib = None


def library_path():
    """The extension: $CACHEALLOC_TORCH_LIBRARY, else the copy inside this
    package (pip install ./python after the build), else the build tree's."""
    env = os.environ.get("CACHEALLOC_TORCH_LIBRARY")
    if env:
        return pathlib.Path(env)
    here = pathlib.Path(__file__).resolve().parent
    for candidate in (here / "libcachealloc_torch.so",
                      here.parent.parent / "build" / "lib" / "libcachealloc_torch.so"):
        if candidate.exists():
            return candidate
    raise RuntimeError(
        "cachealloc: libcachealloc_torch.so not found: build it with CMake on a machine with torch "
        "(cmake -S . -B build && cmake --build build), then pip install ./python, "
        "or set CACHEALLOC_TORCH_LIBRARY to its path")


def load():
    global _lib
    if _lib is None:
        import torch  # noqa: F401  (torch's libraries first: the extension links them)
        lib = ctypes.CDLL(str(library_path()))
        lib.cachealloc_torch_install.restype = ctypes.c_int
        lib.cachealloc_torch_error.restype = ctypes.c_char_p
        lib.cachealloc_torch_annotate.argtypes = [ctypes.c_int, ctypes.c_char_p]
        lib.cachealloc_torch_dump.argtypes = [ctypes.c_int, ctypes.c_char_p]
        lib.cachealloc_torch_dump.restype = ctypes.c_int
        lib.cachealloc_torch_set_stacks.argtypes = [ctypes.c_char_p]
        lib.cachealloc_torch_set_stacks.restype = ctypes.c_int
        _lib = lib
    return _lib


def check(rc):
    if rc != 0:
        raise RuntimeError("cachealloc: " + load().cachealloc_torch_error().decode(errors="replace"))
