"""Two ways to count the bytes a piece of PyTorch code keeps alive on the CPU (needs PyTorch).

:class:`StorageTracker` is a ``TorchDispatchMode``: every storage an operator creates (an output
whose storage is not one of the operator's inputs', so views and in-place results are not new)
is held by a weak reference until it is freed. It knows at every moment which storages made
inside it are alive, and the largest total they reached (``peak``), as
``torch.cuda.max_memory_allocated`` counts, less the caching allocator's rounding. It works on
real and on fake tensors (``FakeTensorMode``: shapes and dtypes only), so the same count runs at
a real model's width. Storages made outside (parameters, inputs) are not counted.

:func:`allocator_trace` reads the CPU allocator itself, through the profiler's memory events
(every ``c10`` allocation and free, with the allocator's running total): what the tracker cannot
see, such as buffers made by compiled (inductor) code or by a kernel outside the dispatcher, is
in it. On eager code both must agree, which the tests check.
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves


@dataclass(frozen=True)
class Storage:
    """One storage an operator created: which operator, the first tensor's dtype and shape."""

    op: str
    dtype: str
    shape: tuple
    nbytes: int
    order: int
    phase: str = ""


def _plain(value) -> list:
    """The plain tensors in ``value``: a wrapper subclass (DTensor, Float8 tensors) holds no
    storage of its own, only the tensors it wraps (its ``__tensor_flatten__``)."""
    found = []
    for tensor in tree_leaves(value):
        if not isinstance(tensor, torch.Tensor):
            continue
        if is_traceable_wrapper_subclass(tensor):
            names, _ = tensor.__tensor_flatten__()
            found += _plain([getattr(tensor, name) for name in names])
        else:
            found.append(tensor)
    return found


def _storages(value) -> list:
    return [t.untyped_storage() for t in _plain(value)]


class StorageTracker(TorchDispatchMode):
    """Live storages created inside the mode, their current total and its peak (bytes)."""

    def __init__(self):
        super().__init__()
        self._alive: dict[int, tuple] = {}   # id(storage) -> (weak reference, Storage)
        self.current = 0
        self.peak = 0
        self.at_peak: list[Storage] = []   # what was alive when the peak was reached
        self.phase = ""                    # a label the caller sets; each storage records it
        self._order = 0

    def __enter__(self):
        # FSDP2 frees and re-allocates unsharded parameters by resizing their storage in place
        # (resize_(0), resize_(n)), which no dispatch mode sees: follow it, as FSDPMemTracker does.
        original = self._original_resize = torch.UntypedStorage.resize_

        def resize_(storage, size):
            result = original(storage, size)
            self._resized(storage)
            return result

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._original_resize
        return super().__exit__(*exc)

    def _resized(self, storage) -> None:
        entry = self._alive.get(id(storage))
        if entry is None or entry[0]() is not storage:
            return
        reference, item = entry
        size = int(storage.nbytes())
        self.current += size - item.nbytes
        grown = replace(item, nbytes=size, phase=self.phase) if size > item.nbytes else replace(item, nbytes=size)
        self._alive[id(storage)] = (reference, grown)
        self._note_peak()

    def _note_peak(self) -> None:
        if self.current > self.peak:
            self.peak = self.current
            self.at_peak = self.alive()

    def _freed(self, key: int, reference) -> None:
        entry = self._alive.get(key)
        if entry is not None and entry[0] is reference:
            del self._alive[key]
            self.current -= entry[1].nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(s) for s in _storages((args, kwargs))}
        for tensor in _plain(out):
            storage = tensor.untyped_storage()
            key = id(storage)
            if key in inputs or (key in self._alive and self._alive[key][0]() is storage):
                continue
            reference = weakref.ref(storage, functools.partial(self._freed, key))
            item = Storage(str(func).removeprefix("aten."), str(tensor.dtype).removeprefix("torch."),
                           tuple(tensor.shape), int(storage.nbytes()), self._order, self.phase)
            self._order += 1
            self._alive[key] = (reference, item)
            self.current += item.nbytes
        self._note_peak()
        return out

    def alive(self, exclude=()) -> list[Storage]:
        """The storages made inside that are still alive, in creation order, less those behind
        the tensors ``exclude`` (e.g. the output)."""
        skip = {id(s) for s in _storages(exclude)}
        found = [(key, item) for key, (reference, item) in self._alive.items()
                 if reference() is not None and key not in skip and item.nbytes]
        return [item for _, item in sorted(found, key=lambda pair: pair[1].order)]

    def reset_peak(self) -> None:
        self.peak = self.current
        self.at_peak = self.alive()


def allocator_trace(fn) -> tuple[int, int]:
    """(peak, end): the CPU allocator's largest and last total while ``fn()`` runs, above the
    total it had when ``fn`` started (bytes). ``fn``'s return value is kept until the end."""
    from torch._C._profiler import _EventType

    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as profile:
        kept = fn()
    events = []
    todo = list(profile.profiler.kineto_results.experimental_event_tree())
    while todo:
        node = todo.pop()
        if node.typed[0] == _EventType.Allocation:
            events.append((node.start_time_ns, node.typed[1].alloc_size))
        todo += node.children
    del kept
    current = peak = 0
    for _, size in sorted(events, key=lambda event: event[0]):
        current += size
        peak = max(peak, current)
    return peak, current
