"""cachealloc.record(), stop() and dump() without torch or the extension: a
stand-in torch module and a stand-in extension record what the package asks
of them, so the Python side is checked where the extension cannot be built.

    python3 python/tests/test_session.py
"""
import pathlib
import sys
import types
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import cachealloc  # noqa: E402
from cachealloc import _native  # noqa: E402


class FakeExtension:
    """The C entry points of libcachealloc_torch.so, recording each call."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name,) + args)
            return 0
        return call


def fake_torch(calls):
    torch = types.ModuleType("torch")
    memory = types.SimpleNamespace(
        _record_memory_history=lambda **kwargs: calls.append(("_record_memory_history", kwargs)))
    torch.cuda = types.SimpleNamespace(memory=memory)
    return torch


class RecordTest(unittest.TestCase):
    def setUp(self):
        self.lib = FakeExtension()
        self.saved = (_native._lib, sys.modules.get("torch"))
        _native._lib = self.lib
        sys.modules["torch"] = fake_torch(self.lib.calls)

    def tearDown(self):
        _native._lib, torch = self.saved
        if torch is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = torch

    def names(self):
        return [call[0] for call in self.lib.calls]

    def test_a_stream_path_reaches_the_extension_before_recording_starts(self):
        cachealloc.record(stream=pathlib.Path("/tmp/run.{device}.bin"), stacks="none")
        self.assertEqual(self.names(), ["cachealloc_torch_set_stacks", "cachealloc_torch_set_stream",
                                        "cachealloc_torch_set_torch_frames", "_record_memory_history"])
        self.assertEqual(self.lib.calls[1], ("cachealloc_torch_set_stream", b"/tmp/run.{device}.bin"))
        self.assertEqual(self.lib.calls[2], ("cachealloc_torch_set_torch_frames", 1))
        self.assertEqual(self.lib.calls[3][1]["enabled"], "all")

    def test_a_recording_without_stream_clears_an_earlier_one(self):
        cachealloc.record(stream="run.bin")
        cachealloc.record()
        self.assertEqual(self.lib.calls[-3], ("cachealloc_torch_set_stream", None))

    def test_an_empty_stream_path_is_refused_before_anything_changes(self):
        with self.assertRaises(ValueError):
            cachealloc.record(stream="")
        self.assertEqual(self.lib.calls, [])

    def test_torch_frames_off_reaches_the_extension_and_torch_still_records(self):
        cachealloc.record(stacks="none", python=True, torch_frames=False)
        self.assertIn(("cachealloc_torch_set_torch_frames", 0), self.lib.calls)
        self.assertEqual(self.lib.calls[-1][1]["context"], "all")  # our recorder's frames stay on

    def test_stop_ends_recording_through_torch(self):
        cachealloc.stop()
        self.assertEqual(self.lib.calls, [("_record_memory_history", {"enabled": None})])

    def test_the_extension_declares_the_stream_entry_point(self):
        # load() sets the ctypes signature of every entry point it uses
        source = (pathlib.Path(_native.__file__)).read_text()
        self.assertIn("cachealloc_torch_set_stream.argtypes = [ctypes.c_char_p]", source)
        extension = pathlib.Path(__file__).resolve().parents[1] / "src" / "torch_allocator.cpp"
        self.assertIn("int cachealloc_torch_set_stream(const char* path)", extension.read_text())


if __name__ == "__main__":
    unittest.main()
