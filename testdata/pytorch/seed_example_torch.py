# The seed example's four steps in PyTorch, for a side-by-side comparison.
import torch
def report(step):
    print(f"{step} - allocated: {torch.cuda.memory_allocated() / 2**20:.2f}MB, "
          f"reserved: {torch.cuda.memory_reserved() / 2**20:.2f}MB")
x = torch.empty(1000, 1000, device='cuda'); report('init')
y = torch.empty(5000, 5000, device='cuda'); report('after alloc')
del y; report('after free')
torch.cuda.empty_cache(); report('after empty_cache')
