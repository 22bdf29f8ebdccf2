"""A fake CUDA memory history for a CPU-only torch, for testing oomdbg's recorder without a GPU.

Every tensor storage the program creates is treated as a block of CUDA device memory, seen through a
TorchDispatchMode (new storages in the outputs of every op) and freed when the storage dies (polled through
StorageWeakRef before each new allocation and each read of the history). Over that, this module replaces the
parts of torch.cuda and torch.cuda.memory the recorder calls, following PyTorch's own sources for the
release named by FAKECUDA_TORCH:

- torch.cuda.memory._record_memory_history: 2.0 takes (enabled: bool, record_context=True,
  trace_alloc_max_entries=1, trace_alloc_record_context=False, device=None, record_context_cpp=False);
  2.1 on dispatch a bool to that legacy form and a string ("all", "state", None) to
  _record_memory_history_impl(enabled, context, stacks, max_entries, device), to which 2.5 adds
  clear_history and 2.7 compile_context and global_record_annotations;
- torch.cuda.memory._snapshot and _dump_snapshot, in the schema of that release (docs/pytorch-snapshots.md
  §10): 2.0 legacy history blocks and no times, 2.1 block addresses and frames, 2.3 time_us, 2.5
  allocator_settings and external_annotations, 2.7 user_metadata and compile_context with
  _set_memory_metadata;
- torch._C._cuda_attach_out_of_memory_observer (2.0 on): observers are called with (device, alloc,
  device_allocated, device_free) before the OutOfMemoryError is raised, when FAKECUDA_CAPACITY bytes would
  be exceeded;
- torch.cuda.memory.memory_stats_as_nested_dict: allocation.all.{current, peak, allocated, freed}, and {}
  before CUDA is initialised, as in PyTorch (the recorder starts while it is initialising);
- torch.cuda initialisation: is_available, device_count, current_device, is_initialized and _lazy_init,
  which runs torch.cuda._queued_calls at the first allocation, as CUDA initialises at the first CUDA tensor.

The allocator caches nothing: each block is its own segment (segment_alloc before the alloc, segment_free
after the free), at the storage's real address, its size the storage's bytes rounded up to 64 (the CPU
allocator's alignment, so that blocks never overlap).

It also keeps the truth a test compares the recorder with: truth_phase(phase, iteration) says what the
program is doing, truth_tag(tensor, category) what a tensor is; at exit the allocations, in trace order,
with the phase and iteration of their allocation and the category of their block, are written as JSON to
FAKECUDA_TRUTH.
"""

import atexit
import json
import os
import sys
import time
import traceback

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

VERSIONS = ("2.0", "2.1", "2.3", "2.5", "2.7")


def _ge(v, w):
    return tuple(int(x) for x in v.split(".")) >= tuple(int(x) for x in w.split("."))


def _storage(t):
    s = t.storage()
    return getattr(s, "_storage", s)


class Allocator:
    def __init__(self, version, capacity):
        self.version = version
        self.capacity = capacity
        self.live = {}  # storage cdata -> [weakref, addr, block size, requested, frames, alloc seq]
        self.trace = []
        self.max_entries = 0
        self.recording = False
        self.context = None  # None, "state", "alloc", "all"
        self.stacks = "python"
        self.allocated = self.freed = 0
        self.current = self.peak = 0
        self.observers = []
        self.metadata = ""
        self.initialized = self.initializing = False
        self.truth_phase, self.truth_iteration = "setup", -1
        self.truth = []  # by recorded alloc: [addr, size, phase, iteration, category]
        self.truth_live = {}  # cdata -> index in truth

    # -- tracking storages --

    def seen(self, tensors):
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            try:
                st = _storage(t)
                n = st.nbytes()
            except Exception:
                continue
            if n == 0:
                continue
            key = st._cdata
            have = self.live.get(key)
            if have is not None and not have[0].expired():
                continue
            self.new_block(st, key, n)

    def new_block(self, st, key, n):
        if not self.initialized:
            torch.cuda._lazy_init()  # CUDA starts at the first allocation
        self.sweep()
        size = (n + 63) // 64 * 64
        frames = self.frames()
        if self.capacity and self.current + size > self.capacity:
            self.oom(n, frames)
        addr = st.data_ptr()
        self.allocated += 1
        self.current += size
        self.peak = max(self.peak, self.current)
        seq = -1
        if self.recording:
            self.record("segment_alloc", addr, size, frames)
            self.record("alloc", addr, n, frames)
            seq = len(self.truth)
            self.truth.append([addr, n, self.truth_phase, self.truth_iteration, None])
        self.live[key] = [StorageWeakRef(st), addr, size, n, frames, seq]

    def sweep(self):
        dead = [k for k, v in self.live.items() if v[0].expired()]
        for k in dead:
            _, addr, size, n, frames, seq = self.live.pop(k)
            self.freed += 1
            self.current -= size
            if self.recording:
                f = frames if self.context == "all" else frames
                self.record("free_requested", addr, n, f)
                self.record("free_completed", addr, n, f)
                self.record("segment_free", addr, size, None)  # as in the real files: no frames

    def oom(self, n, frames):
        free = max(self.capacity - self.current, 0)
        rounded = (n + 511) // 512 * 512
        if self.recording:
            e = self.entry("oom", None, rounded, frames)
            e["device_free"] = free
            self.append(e)
        for obs in list(self.observers):
            obs(0, n, self.current, free)
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate %d bytes. GPU 0 has a total capacity of %d bytes of which "
            "%d bytes is free. (fake CUDA)" % (n, self.capacity, free))

    def frames(self):
        if not self.recording or self.context in (None, "state"):
            return None
        out = []
        for fs in reversed(traceback.extract_stack()[:-4]):
            if fs.filename == __file__ or fs.filename.endswith("_python_dispatch.py"):
                continue
            out.append({"filename": fs.filename, "line": fs.lineno or 0, "name": fs.name})
        if self.stacks == "all":
            out.insert(0, {"filename": "", "line": 0,
                           "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"})
        return out

    def entry(self, action, addr, size, frames):
        e = {"action": action}
        if addr is not None:
            e["addr"] = addr
        e["size"] = size
        e["stream"] = 0
        if _ge(self.version, "2.3"):
            e["time_us"] = time.time_ns() // 1000
        if _ge(self.version, "2.7"):
            e["compile_context"] = "N/A"
            e["user_metadata"] = self.metadata
        if frames is not None:
            e["frames"] = frames
        return e

    def record(self, action, addr, size, frames):
        self.append(self.entry(action, addr, size, frames))

    def append(self, e):
        self.trace.append(e)
        if len(self.trace) > self.max_entries:
            del self.trace[: len(self.trace) - self.max_entries]

    # -- the API --

    def record_history(self, enabled, context="all", stacks="all", max_entries=sys.maxsize, clear=False):
        if enabled not in (None, "state", "all"):
            raise RuntimeError("expected state to be 'state', 'all', or None")
        if context not in (None, "state", "alloc", "all"):
            raise RuntimeError("expected context to be 'state', 'alloc', 'all', or None")
        if stacks not in ("python", "all"):
            raise RuntimeError("expected stacks to be 'python', or 'all'")
        if enabled is None or clear:
            self.trace = []
        self.recording = enabled is not None
        self.context, self.stacks = context, stacks
        self.max_entries = 1 if enabled == "state" else max_entries

    def snapshot(self):
        self.sweep()
        v = self.version
        segments = []
        for _, addr, size, n, frames, _seq in sorted(self.live.values(), key=lambda x: x[1]):
            fr = frames or []
            seg = {"device": 0, "address": addr, "total_size": size, "allocated_size": size, "active_size": size,
                   "requested_size": n, "stream": 0, "segment_type": "small" if size <= 1 << 20 else "large",
                   "segment_pool_id": (0, 0)}
            if _ge(v, "2.1"):
                seg["is_expandable"] = False
                seg["frames"] = fr
                block = {"address": addr, "size": size, "requested_size": n, "state": "active_allocated",
                         "frames": fr}
            else:
                block = {"size": size, "requested_size": n, "state": "active_allocated",
                         "history": [{"addr": addr, "real_size": n, "frames": fr}]}
            seg["blocks"] = [block]
            segments.append(seg)
        out = {"segments": segments, "device_traces": [list(self.trace)]}
        if _ge(v, "2.5"):
            out["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                         "garbage_collection_threshold": 0.0, "expandable_segments": False,
                                         "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                                         "pinned_use_cuda_host_register": False,
                                         "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}
            out["external_annotations"] = []
        if self.recording:
            # The entry of this call goes into the history after the copy, as in PyTorch.
            self.append(self.entry("snapshot", 0, self.current, None))
        return out

    def stats(self):
        self.sweep()
        return {"allocation": {"all": {"current": len(self.live), "peak": len(self.live),
                                       "allocated": self.allocated, "freed": self.freed}},
                "allocated_bytes": {"all": {"current": self.current, "peak": self.peak}}}

    def tag(self, t, category):
        try:
            key = _storage(t)._cdata
        except Exception:
            return
        have = self.live.get(key)
        if have is not None and have[5] >= 0:
            self.truth[have[5]][4] = category


class _Mode(TorchDispatchMode):
    def __init__(self, alloc):
        super().__init__()
        self.alloc = alloc

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.alloc.seen((out,))
        elif isinstance(out, (tuple, list)):
            self.alloc.seen(out)
        return out


_alloc = None


def truth_phase(phase, iteration=None):
    if _alloc is not None:
        _alloc.truth_phase = phase
        if iteration is not None:
            _alloc.truth_iteration = iteration


def truth_tag(tensor, category):
    if _alloc is not None:
        _alloc.tag(tensor, category)


def _write_truth(path):
    with open(path, "w") as f:
        json.dump({"allocs": _alloc.truth}, f)


def install(version=None, capacity=None):
    """Makes this CPU-only torch look like a CUDA build with the history API of release version."""
    global _alloc
    version = version or os.environ.get("FAKECUDA_TORCH", "2.3")
    if version not in VERSIONS:
        raise ValueError("FAKECUDA_TORCH: want one of %s, got %r" % (", ".join(VERSIONS), version))
    if capacity is None:
        capacity = int(os.environ.get("FAKECUDA_CAPACITY", "0") or 0)
    a = _alloc = Allocator(version, capacity)
    cuda, mem = torch.cuda, torch.cuda.memory
    torch.version.cuda = "12.1"

    def _lazy_init():
        if a.initialized or a.initializing:
            return
        a.initializing = True
        try:
            for call, _ in list(cuda._queued_calls):
                call()
            cuda._queued_calls.clear()
        finally:
            a.initializing = False
        a.initialized = True

    cuda._lazy_init = _lazy_init
    # torch's own queued checks (_check_capability, _check_cubins) ask the real device: there is none.
    cuda._queued_calls.clear()
    cuda.is_initialized = lambda: a.initialized
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    # As PyTorch's: {} until CUDA is initialised, which it is not yet while its queued calls run.
    mem.memory_stats_as_nested_dict = lambda device=None: a.stats() if a.initialized else {}

    def _snapshot(device=None):
        return a.snapshot()

    def _dump_snapshot(filename="dump_snapshot.pickle"):
        import pickle

        with open(filename, "wb") as f:
            pickle.dump(_snapshot(), f)

    mem._snapshot, mem._dump_snapshot = _snapshot, _dump_snapshot

    def _record_memory_history_legacy(enabled, record_context=True, trace_alloc_max_entries=1,
                                      trace_alloc_record_context=False, device=None, record_context_cpp=False,
                                      clear_history=False, compile_context=False, global_record_annotations=False):
        # The C++ side: ALLOC context when trace_alloc_record_context, else STATE when record_context.
        context = "alloc" if trace_alloc_record_context else ("state" if record_context else None)
        a.record_history("all" if enabled else None, context, "all" if record_context_cpp else "python",
                         trace_alloc_max_entries, clear_history)

    if version == "2.0":
        def _record_memory_history(enabled: bool, record_context=True, trace_alloc_max_entries=1,
                                   trace_alloc_record_context=False, device=None, record_context_cpp=False):
            _record_memory_history_legacy(enabled, record_context, trace_alloc_max_entries,
                                          trace_alloc_record_context, device, record_context_cpp)
        if hasattr(mem, "_record_memory_history_impl"):
            del mem._record_memory_history_impl
    else:
        if _ge(version, "2.7"):
            def _record_memory_history_impl(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                                            device=None, clear_history=False, compile_context=False,
                                            global_record_annotations=False):
                a.record_history(enabled, context, stacks, max_entries, clear_history)
        elif _ge(version, "2.5"):
            def _record_memory_history_impl(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                                            device=None, clear_history=False):
                a.record_history(enabled, context, stacks, max_entries, clear_history)
        else:
            def _record_memory_history_impl(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                                            device=None):
                a.record_history(enabled, context, stacks, max_entries)

        def _record_memory_history(enabled="all", *args, **kwargs):
            if isinstance(enabled, bool):
                return _record_memory_history_legacy(enabled, *args, **kwargs)
            return _record_memory_history_impl(enabled, *args, **kwargs)

        mem._record_memory_history_impl = _record_memory_history_impl
    mem._record_memory_history = _record_memory_history
    torch._C._cuda_attach_out_of_memory_observer = a.observers.append
    if _ge(version, "2.7"):
        def _set_memory_metadata(metadata):
            a.metadata = metadata

        mem._set_memory_metadata = _set_memory_metadata
        mem._get_memory_metadata = lambda: a.metadata
    elif hasattr(mem, "_set_memory_metadata"):
        del mem._set_memory_metadata
    path = os.environ.get("FAKECUDA_TRUTH")
    if path:
        atexit.register(_write_truth, path)
    _Mode(a).__enter__()  # for the rest of the program
