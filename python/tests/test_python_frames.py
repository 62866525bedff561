"""Python frames captured by our own recorder (libcachealloc_python.so): a
Python program allocates through the C ABI (libcachealloc.so, ctypes) on the
simulated device, and cachealloc-analyze names its own functions, file and
line, innermost first, after the native frames where both are recorded.

    python3 python/tests/test_python_frames.py BUILD/lib BUILD/bin/cachealloc-analyze FIXTURE.so
"""
import ctypes
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import unittest

LIB, ANALYZE, FIXTURE = sys.argv[1:4] if len(sys.argv) >= 4 else (None, None, None)
del sys.argv[1:4]
os.environ["CACHEALLOC_DEVICE"] = "simulated"
HERE = str(pathlib.Path(__file__).resolve())
STACKS = {"none": 0, "native": 1, "python": 3, "native+python": 4}
MiB = 1 << 20


class HistoryOptions(ctypes.Structure):
    _fields_ = [("enabled", ctypes.c_int), ("max_entries", ctypes.c_uint64), ("stacks", ctypes.c_int),
                ("max_frames", ctypes.c_uint32), ("stacks_on_free", ctypes.c_int), ("dump_on_oom", ctypes.c_char_p)]


def load(loader):
    """libcachealloc.so through `loader`: CDLL releases the GIL around each
    call, as PyTorch's ops do before they allocate; PyDLL keeps it."""
    lib = loader(os.path.join(LIB, "libcachealloc.so"))
    lib.cachealloc_malloc.restype = ctypes.c_void_p
    lib.cachealloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    lib.cachealloc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.cachealloc_dump_snapshot.argtypes = [ctypes.c_char_p]
    return lib


RELEASING = load(ctypes.CDLL)
HOLDING = load(ctypes.PyDLL)
PYTHON_FRAMES = ctypes.PyDLL(os.path.join(LIB, "libcachealloc_python.so"))


def line_of(marker):
    """The line of this file that ends with `# <marker>`."""
    for number, text in enumerate(pathlib.Path(HERE).read_text().splitlines(), 1):
        if text.rstrip().endswith("# " + marker):
            return number
    raise AssertionError("no line marked " + marker)


def site(function, marker):
    return "%s (%s:%d)" % (function, HERE, line_of(marker))


def innermost(lib, size):
    return lib.cachealloc_malloc(size, 0)  # innermost


def middle(lib, size):
    return innermost(lib, size)  # middle


def outermost(lib, size):
    return middle(lib, size)  # outermost


def thread_a_allocates(lib, barrier, out):
    barrier.wait()
    for _ in range(200):
        out.append(lib.cachealloc_malloc(MiB, 0))  # thread a


def thread_b_allocates(lib, barrier, out):
    barrier.wait()
    for _ in range(200):
        out.append(lib.cachealloc_malloc(2 * MiB, 0))  # thread b


class PythonFramesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if PYTHON_FRAMES.cachealloc_python_frames_supported() != 1:
            raise AssertionError("libcachealloc_python.so walks no frames of CPython %s" % sys.version.split()[0])
        if PYTHON_FRAMES.cachealloc_python_install() != 0:
            raise AssertionError("cachealloc_python_install failed")

    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.live = []

    def tearDown(self):
        for ptr in self.live:
            RELEASING.cachealloc_free(ptr, 0, 0)
        self.folder.cleanup()

    def record(self, stacks):
        options = HistoryOptions()
        RELEASING.cachealloc_history_options_init(ctypes.byref(options))
        options.stacks = STACKS[stacks]
        options.max_frames = 64
        self.assertEqual(RELEASING.cachealloc_record_history(ctypes.byref(options)), 0)

    def sites(self, *flags):
        path = os.path.join(self.folder.name, "run.bin")
        self.assertEqual(RELEASING.cachealloc_dump_snapshot(path.encode()), 0)
        out = subprocess.run([ANALYZE, "top", path, "--format", "json", "--limit", "0"] + list(flags),
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)["sites"]

    def full_stacks(self):
        return [s["stack"] for s in self.sites("--all-frames", "--frames", "0")]

    def expected_python_frames(self):
        return [site("innermost", "innermost"), site("middle", "middle"), site("outermost", "outermost")]

    def check_python_only(self, lib):
        self.record("python")
        self.live.append(outermost(lib, MiB))
        (stack,) = self.full_stacks()
        self.assertEqual(stack[:3], self.expected_python_frames())
        self.assertTrue(all(".py:" in frame for frame in stack), stack)

    def test_python_frames_with_the_gil_released_name_each_function_innermost_first(self):
        self.check_python_only(RELEASING)

    def test_python_frames_with_the_gil_held_name_each_function_innermost_first(self):
        self.check_python_only(HOLDING)

    def test_the_site_is_the_innermost_python_function_and_line(self):
        for stacks in ("python", "native+python"):
            with self.subTest(stacks=stacks):
                self.record(stacks)
                self.live.append(outermost(RELEASING, MiB))
                self.assertEqual([s["stack"][0] for s in self.sites()], [site("innermost", "innermost")])

    def test_native_and_python_frames_merge_native_first_and_leave_out_the_interpreter(self):
        self.record("native+python")
        self.live.append(outermost(RELEASING, MiB))
        (stack,) = self.full_stacks()
        first_python = next(i for i, frame in enumerate(stack) if ".py:" in frame)
        native, python = stack[:first_python], stack[first_python:]
        self.assertGreaterEqual(len(native), 1, stack)
        self.assertEqual(python[:3], self.expected_python_frames())
        self.assertTrue(all(".py:" in frame for frame in python), stack)
        interpreter = os.path.realpath(sys.executable)
        for frame in native:
            self.assertNotIn(interpreter, frame)
            self.assertNotIn("libpython", frame)
            self.assertFalse(frame.startswith("0x7ff") and "(" not in frame, "a bare stack address: " + frame)

    def test_two_python_threads_allocating_at_once_get_their_own_frames(self):
        self.record("python")
        barrier = threading.Barrier(2)
        a, b = [], []
        threads = [threading.Thread(target=thread_a_allocates, args=(RELEASING, barrier, a)),
                   threading.Thread(target=thread_b_allocates, args=(RELEASING, barrier, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.live += a + b
        counts = {s["stack"][0]: s["allocations"] for s in self.sites()}
        self.assertEqual(counts, {site("thread_a_allocates", "thread a"): 200,
                                  site("thread_b_allocates", "thread b"): 200})
        for stack in self.full_stacks():
            own = "thread_a" if "thread_a" in stack[0] else "thread_b"
            other = "thread_b" if own == "thread_a" else "thread_a"
            self.assertFalse(any(other in frame for frame in stack), stack)

    def test_a_thread_that_never_ran_python_gets_native_frames_only(self):
        fixture = ctypes.CDLL(FIXTURE)
        fixture.allocate_on_native_thread.restype = ctypes.c_void_p
        fixture.allocate_on_native_thread.argtypes = [ctypes.c_size_t]
        self.record("native+python")
        self.live.append(fixture.allocate_on_native_thread(MiB))
        (stack,) = self.full_stacks()
        self.assertGreaterEqual(len(stack), 1)
        self.assertFalse(any(".py:" in frame for frame in stack), stack)
        RELEASING.cachealloc_free(self.live.pop(), 0, 0)
        self.record("python")
        self.live.append(fixture.allocate_on_native_thread(MiB))
        (only,) = self.sites()
        self.assertNotIn(".py:", only["stack"][0])


if __name__ == "__main__":
    unittest.main()
