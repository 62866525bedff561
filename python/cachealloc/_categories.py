"""track_categories(): exact categories from torch's own state, recorded
beside the allocations they name.

The analyzer otherwise infers what each allocation is from its frames,
annotations and lifetime. While a tracker runs, the recording states it:

- parameter: every parameter and buffer of the modules given, now (and
  again at each optimizer step, so parameters a step replaces are named too);
- gradient: each parameter's .grad once AccumulateGrad has written it
  (Tensor.register_post_accumulate_grad_hook);
- optimizer_state: every CUDA tensor in the optimizers' state after each
  step (Optimizer.register_step_post_hook);
- activation: every CUDA tensor saved for backward, as
  torch.autograd.graph.saved_tensors_hooks sees it, apart from parameters.

A category names the whole allocation (its storage), from its allocation to
its free. Allocations no hook names keep the inferred categories.
"""
import torch

from . import _native

_CODES = ("parameter", "gradient", "optimizer_state", "activation")


def _storage(tensor):
    """(device index, the allocation's address, its bytes), or None for a
    tensor not on a CUDA device or without storage of its own."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        return None
    storage = tensor.untyped_storage()
    address = storage.data_ptr()
    if address == 0:
        return None
    return tensor.device.index, address, storage.nbytes()


class CategoryTracker:
    """The hooks of track_categories(); stop() (or leaving the with block)
    removes them. saved_bytes: the distinct storages saved for backward so
    far, in bytes (what the activation hook saw)."""

    def __init__(self, modules, optimizers):
        self._lib = _native.load()
        self._modules = list(modules)
        self._optimizers = list(optimizers)
        self._handles = []
        self._parameter_addresses = set()
        self._saved = {}
        self._saved_hooks = None
        self.saved_bytes = 0

    def _tag(self, tensor, category):
        where = _storage(tensor)
        if where is None:
            return None
        device, address, _ = where
        _native.check(self._lib.cachealloc_torch_tag_category(device, address, category.encode()))
        return where

    def _tag_parameters(self):
        for module in self._modules:
            for tensor in list(module.parameters()) + list(module.buffers()):
                where = self._tag(tensor, "parameter")
                if where is not None:
                    self._parameter_addresses.add(where[1])

    def _pack(self, tensor):
        where = _storage(tensor)
        if where is not None and where[1] not in self._parameter_addresses:
            device, address, size = where
            if address not in self._saved:
                self._saved[address] = size
                self.saved_bytes += size
            _native.check(self._lib.cachealloc_torch_tag_category(device, address, b"activation"))
        return tensor

    def start(self):
        self._tag_parameters()
        for module in self._modules:
            for parameter in module.parameters():
                if parameter.requires_grad:
                    self._handles.append(parameter.register_post_accumulate_grad_hook(self._after_accumulate))
        for optimizer in self._optimizers:
            self._handles.append(optimizer.register_step_post_hook(self._after_step))
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._saved_hooks.__enter__()
        return self

    def _after_accumulate(self, parameter):  # a hook: returns None
        self._tag(parameter.grad, "gradient")

    def _after_step(self, optimizer, args, kwargs):
        for state in optimizer.state.values():
            for value in state.values():
                self._tag(value, "optimizer_state")
        self._tag_parameters()

    def forget_saved(self):
        """Starts a new count of saved_bytes (say, before each forward pass)."""
        self._saved.clear()
        self.saved_bytes = 0

    def stop(self):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
        # The hooks referred back to the tracker: without the modules and
        # optimizers here too, nothing keeps a model alive after stop().
        self._modules.clear()
        self._optimizers.clear()
        self._parameter_addresses.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def track_categories(modules=(), optimizers=()):
    """Records exact categories for the allocations of `modules` (a module or
    a list) and `optimizers` (an optimizer or a list) while recording runs:
    call it after cachealloc.record(). Returns a CategoryTracker, also a
    context manager:

        cachealloc.record()
        with cachealloc.track_categories(model, optimizer):
            train()
        cachealloc.dump("run.bin")     # summary: categories 'exact'

    Needs the torch extension (cachealloc.torch.install())."""
    if isinstance(modules, torch.nn.Module):
        modules = [modules]
    if isinstance(optimizers, torch.optim.Optimizer):
        optimizers = [optimizers]
    return CategoryTracker(modules, optimizers).start()
