# Calls cudaMalloc and cudaFree directly (ctypes) in a PyTorch process, after make_sequence.py's
# preamble, so that the CUDA context is the one every conformance sequence sees, and writes each call
# with the address the driver returned: ground truth for the simulated device's driver address model
# (tests/test_simulated_addresses.cpp) on calls PyTorch never makes. PyTorch asks cudaMalloc only for
# multiples of 2 MiB; this asks for any size. With --device-free, physical memory with no address
# (cuMemCreate, as make_sequence.py's CONF_DEVICE_FREE) holds all but about that many bytes, so that
# cudaMalloc fails for lack of memory.
#
#   python3 probe_cudamalloc.py OUT.calls SEED N_OPS [--device-free BYTES] [--at-least BYTES]
#
# --at-least draws sizes again until they are at least that large. OUT.calls, one call a line ('#' lines
# are comments):
#   base ADDRESS               B: a first cudaMalloc of 2 MiB, freed at once, landed at B + 30 MiB
#   device_free BYTES          free memory after the hold (only with --device-free)
#   malloc BYTES ADDRESS FREE  ADDRESS in hex, or 'fail'; FREE: cudaMemGetInfo's free after the call
#   free ADDRESS FREE
import argparse, ctypes, glob, os, random, sys, time
import torch

parser = argparse.ArgumentParser()
parser.add_argument('out'); parser.add_argument('seed', type=int); parser.add_argument('n_ops', type=int)
parser.add_argument('--device-free', type=int, default=0)
parser.add_argument('--at-least', type=int, default=1)
args = parser.parse_args()

torch.empty(1, device='cuda'); torch.cuda.empty_cache()  # make_sequence.py's preamble

def load_cudart():
    candidates = ['libcudart.so.13'] + glob.glob(os.path.join(os.path.dirname(torch.__file__), '..', 'nvidia', '*', 'lib', 'libcudart.so*')) + \
        ['/usr/local/cuda/lib64/libcudart.so.13']
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    sys.exit('libcudart not found')
cudart = load_cudart()
cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
cudart.cudaFree.argtypes = [ctypes.c_void_p]
cudart.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]

def free_memory():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) == 0
    return free.value

rng = random.Random(args.seed)
MiB = 1 << 20
def size():
    while True:
        n = draw_size()
        if n >= args.at_least: return n
def draw_size():
    r = rng.random()
    if args.device_free:  # under the limit: what PyTorch asks for, multiples of 2 MiB
        return 2 * MiB * rng.randint(10, 160)
    if r < 0.25:
        return rng.choice([1, 512, 513, 4096, 65536, 100000, MiB, MiB + 1, 2 * MiB - 1, rng.randint(1, 2 * MiB - 1)])
    if r < 0.55: return rng.randint(2 * MiB + 1, 100 * MiB)                 # not multiples of 2 MiB
    if r < 0.75: return 2 * MiB * rng.randint(1, 48)                        # multiples of 2 MiB
    if r < 0.90: return 32 * MiB * rng.randint(1, 4) + rng.choice([0, 0, -512, 1, 2 * MiB])  # at and around 32 MiB multiples
    return rng.randint(100 * MiB, 600 * MiB)

def malloc(n):
    ptr = ctypes.c_void_p()
    status = cudart.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(n))
    if status == 2:  # cudaErrorMemoryAllocation
        cudart.cudaGetLastError()
        return None
    assert status == 0, status
    return ptr.value

first = malloc(2 * MiB)
assert cudart.cudaFree(ctypes.c_void_p(first)) == 0
held = None
lines = [f'# cudaMalloc/cudaFree from PyTorch {torch.__version__}\'s process on {torch.cuda.get_device_name()}, '
         f'{time.strftime("%Y-%m-%d")}: probe_cudamalloc.py {" ".join(sys.argv[2:])}', f'base {hex(first - 30 * MiB)}']
if args.device_free:
    # The hold of make_sequence.py's CONF_DEVICE_FREE.
    cu = ctypes.CDLL('libcuda.so.1')
    class Prop(ctypes.Structure):  # CUmemAllocationProp
        _fields_ = [('type', ctypes.c_int), ('handle_types', ctypes.c_int), ('location_type', ctypes.c_int),
                    ('location_id', ctypes.c_int), ('win32', ctypes.c_void_p), ('compression', ctypes.c_ubyte),
                    ('rdma', ctypes.c_ubyte), ('usage', ctypes.c_ushort), ('reserved', ctypes.c_ubyte * 4)]
    prop = Prop(type=1, location_type=1, location_id=torch.cuda.current_device())
    granularity = ctypes.c_size_t()
    assert cu.cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(prop), 0) == 0
    held, left = [], (free_memory() - args.device_free) // granularity.value * granularity.value
    while left:
        piece, handle = min(left, 1 << 30), ctypes.c_ulonglong()
        assert cu.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(piece), ctypes.byref(prop), ctypes.c_ulonglong(0)) == 0
        held.append(handle); left -= piece
    lines.append(f'device_free {free_memory()}')

live = []
failures = 0
for i in range(args.n_ops):
    if live and (rng.random() < 0.45 or len(live) > 40):
        address = live.pop(rng.randrange(len(live)))
        assert cudart.cudaFree(ctypes.c_void_p(address)) == 0
        lines.append(f'free {hex(address)} {free_memory()}')
        continue
    n = size()
    address = malloc(n)
    if address is None:
        failures += 1
        lines.append(f'malloc {n} fail {free_memory()}')
        continue
    live.append(address)
    lines.append(f'malloc {n} {hex(address)} {free_memory()}')
for address in live:
    assert cudart.cudaFree(ctypes.c_void_p(address)) == 0
with open(args.out, 'w') as f:
    f.write('\n'.join(lines) + '\n')
print(os.path.basename(args.out), sum(l.startswith('malloc') for l in lines), 'mallocs,', failures, 'failed')
