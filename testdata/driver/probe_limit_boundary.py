# How close to cudaMemGetInfo's free memory cudaMalloc still succeeds, on the H200. In a PyTorch
# process after make_sequence.py's preamble, physical memory with no address (cuMemCreate) holds all but
# about 1 GiB; then cudaMalloc tries sizes a few MiB either side of the free memory, once for a request
# that needs a new VA chunk and once for one that fits in an existing chunk's slack (the hold adjusted
# each time so that the slack is what is at stake). Prints one line per try.
#
#   python3 probe_limit_boundary.py
import ctypes, glob, os, sys
import torch

MiB = 1 << 20
torch.empty(1, device='cuda'); torch.cuda.empty_cache()  # make_sequence.py's preamble
cudart = None
for name in ['libcudart.so.13'] + glob.glob(os.path.join(os.path.dirname(torch.__file__), '..', 'nvidia', '*', 'lib', 'libcudart.so*')):
    try:
        cudart = ctypes.CDLL(name); break
    except OSError:
        pass
cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
cudart.cudaFree.argtypes = [ctypes.c_void_p]
cu = ctypes.CDLL('libcuda.so.1')
class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [('type', ctypes.c_int), ('handle_types', ctypes.c_int), ('location_type', ctypes.c_int),
                ('location_id', ctypes.c_int), ('win32', ctypes.c_void_p), ('compression', ctypes.c_ubyte),
                ('rdma', ctypes.c_ubyte), ('usage', ctypes.c_ushort), ('reserved', ctypes.c_ubyte * 4)]
prop = Prop(type=1, location_type=1, location_id=torch.cuda.current_device())

def free_memory():
    return torch.cuda.mem_get_info()[0]
def hold(nbytes):
    handles, left = [], nbytes // (2 * MiB) * (2 * MiB)
    while left:
        piece, handle = min(left, 1 << 30), ctypes.c_ulonglong()
        assert cu.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(piece), ctypes.byref(prop), ctypes.c_ulonglong(0)) == 0
        handles.append(handle); left -= piece
    return handles
def unhold(handles):
    for h in handles: assert cu.cuMemRelease(h) == 0
def malloc(n):
    ptr = ctypes.c_void_p()
    status = cudart.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(n))
    if status != 0:
        cudart.cudaGetLastError(); return None
    return ptr.value

base_hold = hold(free_memory() - 1024 * MiB)
F = free_memory()
print(f'free after the hold: {F / MiB:.4f} MiB')
for k in range(-1, 4):  # a new chunk of floor(F) - 2k MiB
    n = (F // (2 * MiB) - k) * 2 * MiB
    p = malloc(n)
    print(f'new chunk: cudaMalloc({n / MiB:.0f} MiB) with {F / MiB:.4f} MiB free, free - size = {(F - n) / MiB:+.4f} MiB: '
          + ('ok' if p else 'fails'))
    if p: cudart.cudaFree(ctypes.c_void_p(p))
anchor = malloc(34 * MiB)  # a 64 MiB chunk with 30 MiB of slack above the allocation
if not anchor: sys.exit('cudaMalloc(34 MiB) failed with ' + str(free_memory()) + ' bytes free')
for k in range(-1, 4):
    extra = hold(free_memory() - (30 + 2 * k) * MiB)
    f = free_memory()
    p = malloc(30 * MiB)
    where = '' if not p else (' (in the slack)' if p == anchor + 34 * MiB else f' (elsewhere: anchor{(p - anchor) / MiB:+.0f} MiB)')
    print(f'slack: cudaMalloc(30 MiB) with {f / MiB:.4f} MiB free, free - size = {(f - 30 * MiB) / MiB:+.4f} MiB: '
          + ('ok' if p else 'fails') + where)
    if p: cudart.cudaFree(ctypes.c_void_p(p))
    unhold(extra)
cudart.cudaFree(ctypes.c_void_p(anchor)); unhold(base_hold)
