"""oomdbg's recorder for PyTorch jobs, run by `oomdbg record -- COMMAND`.

`oomdbg record` writes this module and a sitecustomize beside it into a private directory and puts that
first on PYTHONPATH. When the job imports torch the recorder installs its hooks; when the job first uses
CUDA it turns on torch.cuda.memory's history and attaches to the allocator's out-of-memory observer. It
dumps ordinary PyTorch snapshots (what torch.cuda.memory._dump_snapshot writes, so memory_viz opens them)
with one key added, "oomdbg", that says what the allocator cannot:

- marks: where each iteration and phase begins (forward, backward, recompute, optimizer, zero_grad, eval),
  and, where PyTorch has no per-allocation metadata, where each module's forward begins and ends;
- tags: which blocks hold parameters, gradients, optimizer state and the batch, taken from the modules and
  optimizers the hooks saw.

Each mark and tag carries the allocator's own counts of allocations and frees at that moment
(memory_stats' allocation.all.allocated and .freed), which place it exactly in the trace, and the time,
which places it where the counts cannot. The recorder only reads: it never changes what the job computes,
its output or its exit status. Settings arrive in OOMDBG_RECORD_* environment variables.
"""

import atexit
import collections
import functools
import os
import pickle
import signal
import sys
import threading
import time
import weakref

_PREFIX = "oomdbg record: "
FORMAT = 1  # the "oomdbg" key's format

# Phases, as oomdbg names them.
SETUP, DATA, FORWARD, BACKWARD, RECOMPUTE, OPTIMIZER, ZERO_GRAD, EVAL = (
    "setup", "data", "forward", "backward", "recompute", "optimizer", "zero_grad", "eval")


def _say(key, message):
    """Prints message on stderr once per job: the flag travels to child processes in the environment."""
    flag = "OOMDBG_RECORD_SAID_" + key
    if os.environ.get(flag):
        return
    os.environ[flag] = "1"
    try:
        sys.stderr.write(_PREFIX + message + "\n")
        sys.stderr.flush()
    except Exception:
        pass


def _env_int(name, default):
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


class _Config:
    def __init__(self, env):
        self.dir = env.get("OOMDBG_RECORD_DIR", "")
        self.entries = max(_env_int("OOMDBG_RECORD_ENTRIES", 1000000), 1)
        self.stacks = env.get("OOMDBG_RECORD_STACKS", "python")
        if self.stacks not in ("python", "all", "none"):
            self.stacks = "python"
        self.every = max(_env_int("OOMDBG_RECORD_EVERY", 0), 0)
        self.keep = max(_env_int("OOMDBG_RECORD_KEEP", 3), 1)
        self.scopes = env.get("OOMDBG_RECORD_SCOPES", "1") != "0"
        self.tool = env.get("OOMDBG_RECORD_TOOL", "oomdbg record")


class _State:
    def __init__(self):
        self.torch = None
        self.config = None
        self.installed = False
        self.started = False
        self.pid = None
        self.lock = threading.RLock()
        self.phase = SETUP
        self.iteration = -1
        self.in_iteration = False
        self.steps = 0
        self.backward_depth = 0
        self.marks = collections.deque(maxlen=1 << 18)
        self.scopes = collections.deque(maxlen=1 << 20)
        self.tags = collections.deque(maxlen=1 << 20)
        self.roots = weakref.WeakSet()
        self.optimizers = weakref.WeakSet()
        self.names = weakref.WeakKeyDictionary()  # module -> its path in the root module
        self.param_names = {}  # id(parameter) -> (weak reference, its name in the root module): tensors compare
        # elementwise, so they cannot key a WeakKeyDictionary
        self.state_sizes = weakref.WeakKeyDictionary()  # optimizer -> len(state) when last tagged
        self.tagged = {}  # id(parameter) -> (weak reference, its address, weak reference to its grad) last tagged
        self.notes = []
        self.exception = None
        self.counts_ok = True
        self.last_counts = {}
        self.metadata = None  # torch.cuda.memory._set_memory_metadata, where PyTorch has it (≈2.7+)
        self.rank_name = None
        self.end_reason = None
        self.handles = []  # the global hooks' handles
        self.in_zero_grad = False
        self.previous_handlers = {}


_S = _State()
_tls = threading.local()


def _now_us():
    return time.time_ns() // 1000


def _note(key, message):
    """Says once that a feature is missing, and keeps it in the dump's notes."""
    if message not in _S.notes:
        _S.notes.append(message)
    _say(key, message)


def _guard(f):
    """The recorder's side of a hook: an error in it is said once and swallowed, so the job goes on as it
    would have without the recorder."""

    @functools.wraps(f)
    def guarded(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except Exception as e:
            _say("HOOK", "a hook failed (%s in %s: %s); the job goes on, the dumps may lack some tags"
                 % (type(e).__name__, f.__name__, e))
            return None

    return guarded


# ---- arming: start when the job imports torch ----


def install(environ=None):
    """Arms the recorder: it starts when the job imports torch. Called by the sitecustomize beside this file."""
    env = os.environ if environ is None else environ
    if not env.get("OOMDBG_RECORD_DIR") or _S.installed:
        return
    _S.installed = True
    _S.config = _Config(env)
    if "torch" in sys.modules:
        _activate(sys.modules["torch"])
        return
    _watch("torch", _activate)


class _Watcher:
    """A meta path finder that runs a function after a module is first imported, without changing how it
    is found or loaded: it wraps the loader's exec_module of that one import."""

    def __init__(self, name, after):
        self.name, self.after = name, after

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        import importlib.util

        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, after = spec.loader.exec_module, self.after

        def exec_then_arm(module):
            exec_module(module)
            try:
                after(module)
            except Exception as e:
                _say("ARM", "could not hook %s (%s: %s); the job runs without it" % (name, type(e).__name__, e))

        spec.loader.exec_module = exec_then_arm
        return spec


def _watch(name, after):
    if name in sys.modules:
        after(sys.modules[name])
    else:
        sys.meta_path.insert(0, _Watcher(name, after))


def _activate(torch):
    _S.torch = torch
    version = getattr(torch, "version", None)
    if getattr(version, "cuda", None) is None and getattr(version, "hip", None) is None:
        _say("NOCUDA", "this torch (%s) was built without CUDA: nothing is recorded, the job runs as it is"
             % getattr(torch, "__version__", "?"))
        return
    _install_hooks(torch)
    atexit.register(_at_exit)
    _install_signals()
    cuda = torch.cuda
    if cuda.is_initialized():
        _start()
    elif hasattr(cuda, "_lazy_call"):
        # Queued calls run when the job initialises CUDA, before its first allocation; a process that never
        # does (torchrun's launcher, a data worker) records nothing and costs nothing.
        cuda._lazy_call(_start)
    else:
        _note("LAZY", "torch.cuda._lazy_call is missing: recording starts at the first hook instead")


# ---- starting the allocator's history ----


def _start():
    if _S.started:
        return
    torch = _S.torch
    mem = torch.cuda.memory
    cfg = _S.config
    try:
        _record_history(mem, cfg)
    except Exception as e:
        _say("HISTORY", "could not turn on torch.cuda.memory's history (%s: %s); the job runs without recording"
             % (type(e).__name__, e))
        return
    _S.started, _S.pid = True, os.getpid()
    try:
        os.register_at_fork(after_in_child=_forked)
    except AttributeError:
        pass
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        _note("OOM", "this PyTorch has no out-of-memory observer: no snapshot is taken at an OOM, only at exit")
    else:
        attach(_on_oom)
    if cfg.scopes and hasattr(mem, "_set_memory_metadata"):
        _S.metadata = mem._set_memory_metadata
    _S.last_counts = {}
    _mark("phase", SETUP)


def _record_history(mem, cfg):
    """Turns on the history with the keywords this PyTorch takes: the string API (2.1 on, with
    _record_memory_history_impl), the boolean one of 2.0 (trace_alloc_max_entries), or 1.13's, which keeps
    no trace."""
    import inspect

    stacks = cfg.stacks
    impl = getattr(mem, "_record_memory_history_impl", None)
    if impl is not None:
        params = inspect.signature(impl).parameters
        kw = {"context": None if stacks == "none" else "all", "max_entries": cfg.entries}
        if "stacks" in params:
            kw["stacks"] = "python" if stacks == "none" else stacks
        mem._record_memory_history("all", **kw)
        return
    params = inspect.signature(mem._record_memory_history).parameters
    if "trace_alloc_max_entries" in params:
        kw = {"trace_alloc_max_entries": cfg.entries, "trace_alloc_record_context": stacks != "none",
              "record_context": stacks != "none"}
        if "record_context_cpp" in params:
            kw["record_context_cpp"] = stacks == "all"
        mem._record_memory_history(True, **kw)
        return
    mem._record_memory_history(True)
    _note("TRACE", "this PyTorch (%s) keeps no allocation history: the dumps hold the final state only"
          % getattr(_S.torch, "__version__", "?"))


def _forked():
    # A forked child (a data-loader worker) cannot use its parent's CUDA state: it records nothing.
    _S.started = False


# ---- marks ----


def _counts(device=None):
    """The allocator's cumulative allocations and frees on the current device: where in the trace "now" is.
    (-1, -1) when they cannot be read or went backwards (reset_accumulated_memory_stats), and from then on."""
    if not _S.counts_ok:
        return -1, -1, -1
    try:
        torch = _S.torch
        dev = torch.cuda.current_device() if device is None else device
        stats = torch.cuda.memory.memory_stats_as_nested_dict(dev)
        if not stats and not torch.cuda.is_initialized():
            # CUDA is starting (the recorder starts from its queued calls), and memory_stats answers {} until
            # it has: nothing is allocated yet.
            return dev, 0, 0
        a = stats["allocation"]["all"]
        allocs, frees = int(a["allocated"]), int(a["freed"])
    except Exception:
        _S.counts_ok = False
        return -1, -1, -1
    last = _S.last_counts.get(dev)
    if last is not None and (allocs < last[0] or frees < last[1]):
        _S.counts_ok = False
        _note("COUNTS", "the allocator's counts were reset during the run: later marks are placed by time")
        return dev, -1, -1
    _S.last_counts[dev] = (allocs, frees)
    return dev, allocs, frees


def _mark(kind, name):
    dev, a, f = _counts()
    _S.marks.append((_now_us(), dev, a, f, kind, name, _S.iteration))


def _set_phase(phase):
    if phase != _S.phase:
        _S.phase = phase
        _mark("phase", phase)


def _begin_iteration():
    _S.iteration += 1
    _S.in_iteration = True
    _mark("iteration", str(_S.iteration))


# ---- tags: what a block holds ----


def _tensors(x, depth=0):
    """The tensors in a module's arguments: tensors, and those in lists, tuples and dicts, two levels down."""
    torch = _S.torch
    if isinstance(x, torch.Tensor):
        yield x
    elif depth < 2 and isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v, depth + 1)
    elif depth < 2 and isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v, depth + 1)


def _point():
    """Now, as marks and tags record it: the time, the device and its counts, the iteration."""
    dev, a, f = _counts()
    return (_now_us(), dev, a, f, _S.iteration)


def _tag_records(items, point):
    """The tag records of (tensor, category, name) items alive at point. A tensor on no memory (meta, empty)
    has nothing to tag; one on the host is tagged too and matches no device block."""
    t, dev, a, f, it = point
    out = []
    for tensor, category, name in items:
        try:
            n = tensor.numel() * tensor.element_size()
            addr = tensor.data_ptr()
        except Exception:
            continue
        if n > 0 and addr != 0:
            out.append((t, dev, a, f, it, addr, n, category, name))
    return out


def _tag_all(items):
    if items:
        _S.tags.extend(_tag_records(items, _point()))


def _tag_inputs(args, kwargs):
    torch = _S.torch
    items = []
    for x in (args, kwargs):
        for t in _tensors(x):
            # The batch: no autograd history, not a weight. An activation has a grad_fn.
            if t.grad_fn is None and not t.requires_grad and not isinstance(t, torch.nn.Parameter):
                items.append((t, "input", ""))
    if items:
        _tag_all(items)


def _name_modules(root):
    if root in _S.names:
        return
    try:
        for name, m in root.named_modules():
            if m not in _S.names:
                _S.names[m] = name or type(root).__name__
        for name, p in root.named_parameters():
            if _param_name(p) == "":
                _S.param_names[id(p)] = (weakref.ref(p), name)
    except Exception:
        pass


def _param_name(p):
    have = _S.param_names.get(id(p))
    return have[1] if have is not None and have[0]() is p else ""


def _param_items(params, with_grads):
    items = []
    for p in params:
        name = _param_name(p)
        items.append((p, "parameter", name))
        g = p.grad
        if with_grads and g is not None:
            items.append((g, "gradient", name + ".grad" if name else ""))
    return items


def _new_param_items(params):
    """The parameters and gradients not tagged yet in their present form: a parameter whose memory moved, a
    gradient that is a new tensor (set_to_none frees the last one; one zeroed in place stays the same)."""
    items = []
    tagged = _S.tagged
    for p in params:
        try:
            g = p.grad
            addr = p.data_ptr()  # a tensor without storage (a DTensor's wrapper) has none
        except Exception:
            continue
        have = tagged.get(id(p))
        if have is not None and have[0]() is p and have[1] == addr and (g is None or have[2]() is g):
            continue
        tagged[id(p)] = (weakref.ref(p), addr, weakref.ref(g) if g is not None else _none_ref)
        name = _param_name(p)
        items.append((p, "parameter", name))
        if g is not None:
            items.append((g, "gradient", name + ".grad" if name else ""))
    return items


def _none_ref():
    return None


def _optimizer_params(opt):
    for group in getattr(opt, "param_groups", ()):
        yield from group.get("params", ())


def _state_items(opt):
    torch = _S.torch
    items = []
    for p, st in list(getattr(opt, "state", {}).items()):
        name = _param_name(p) if isinstance(p, torch.Tensor) else ""
        if isinstance(st, dict):
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    items.append((v, "optimizer_state", (name + "." if name else "") + str(k)))
    return items


def _tag_state_if_new(opt):
    n = len(getattr(opt, "state", ()))
    if _S.state_sizes.get(opt) != n:
        _S.state_sizes[opt] = n
        _tag_all(_state_items(opt))


# ---- hooks ----


def _depth():
    return getattr(_tls, "depth", 0)


@_guard
def _forward_pre(module, args):
    d = _depth()
    _tls.depth = d + 1
    if not _S.started:
        return None
    if d == 0:
        _root_forward(module, args)
    if _S.config.scopes:
        _enter_scope(module)
    return None


@_guard
def _forward_post(module, args, output):
    d = _depth()
    _tls.depth = max(d - 1, 0)
    if _S.started and _S.config.scopes:
        _exit_scope(module)
    return None


def _caller_kwargs():
    # Global forward pre-hooks get no kwargs (model(**batch) passes the batch that way); they are the
    # locals of Module._call_impl, which calls the hooks.
    try:
        f = sys._getframe(3)
        for _ in range(4):
            if f is None:
                return {}
            if f.f_code.co_name in ("_call_impl", "inner"):
                kw = f.f_locals.get("kwargs")
                if isinstance(kw, dict):
                    return kw
            f = f.f_back
    except Exception:
        pass
    return {}


def _root_forward(module, args):
    torch = _S.torch
    _S.roots.add(module)
    _name_modules(module)
    if _S.backward_depth > 0:
        _set_phase(RECOMPUTE)
        return
    if not (module.training and torch.is_grad_enabled()):
        _set_phase(EVAL)
        return
    if not _S.in_iteration:
        _begin_iteration()
    _tag_inputs(args, _caller_kwargs())
    _set_phase(FORWARD)


def _enter_scope(module):
    name = _S.names.get(module)
    if name is None:
        name = type(module).__name__
    stack = getattr(_tls, "scopes", None)
    if stack is None:
        stack = _tls.scopes = []
    stack.append(name)
    if _S.metadata is not None:
        try:
            _S.metadata(name)
            return
        except Exception:
            _S.metadata = None
    _S.scopes.append((_now_us(), 1, name))


def _exit_scope(module):
    stack = getattr(_tls, "scopes", None)
    if not stack:
        return
    name = stack.pop()
    if _S.metadata is not None:
        try:
            _S.metadata(stack[-1] if stack else "")
            return
        except Exception:
            _S.metadata = None
    _S.scopes.append((_now_us(), 0, name))


def _reset_module_depth():
    # A forward that raised left its post-hooks unrun; nothing runs inside a forward here.
    _tls.depth = 0
    if getattr(_tls, "scopes", None):
        _tls.scopes = []
        if _S.metadata is not None:
            try:
                _S.metadata("")
            except Exception:
                pass


@_guard
def _backward_begin():
    before = _S.phase
    _S.backward_depth += 1
    if _S.backward_depth == 1:
        _set_phase(BACKWARD)
    return before


@_guard
def _backward_end(before, inside_forward):
    _S.backward_depth = max(_S.backward_depth - 1, 0)
    if _S.backward_depth == 0:
        _mark("end", BACKWARD)
        if inside_forward and before is not None:  # torch.autograd.grad inside a forward: forward goes on
            _set_phase(before)


def _wrap_backward(fn):
    @functools.wraps(fn)
    def backward(*args, **kwargs):
        if not _S.started:
            return fn(*args, **kwargs)
        inside_forward = _depth() > 0
        before = _backward_begin()
        try:
            return fn(*args, **kwargs)
        finally:
            _backward_end(before, inside_forward)

    backward.__oomdbg_wrapped__ = True
    return backward


@_guard
def _step_pre(opt, args=(), kwargs=None):
    if not _S.started:
        return None
    _reset_module_depth()
    _S.optimizers.add(opt)
    _set_phase(OPTIMIZER)
    # The gradients are whole now; a loop may free them later in any way (set_to_none, del p.grad, the
    # end of the program): say what they are while they are alive.
    _tag_all(_new_param_items(_optimizer_params(opt)))
    return None


@_guard
def _step_post(opt, args=(), kwargs=None):
    if not _S.started:
        return None
    _S.steps += 1
    _tag_state_if_new(opt)
    _mark("end", OPTIMIZER)
    _S.in_iteration = False
    cfg = _S.config
    if cfg.every and _S.steps % cfg.every == 0:
        _dump("step")
    return None


def _wrap_step(fn):
    @functools.wraps(fn)
    def step(self, *args, **kwargs):
        _step_pre(self)
        out = fn(self, *args, **kwargs)
        _step_post(self)
        return out

    step.__oomdbg_wrapped__ = True
    return step


@_guard
def _zero_grad_begin(holder, is_optimizer, set_to_none):
    _reset_module_depth()
    if set_to_none:
        # The gradients are freed now: say what they were while they are alive.
        params = _optimizer_params(holder) if is_optimizer else holder.parameters()
        _tag_all(_new_param_items(params))
    if is_optimizer:
        _S.optimizers.add(holder)
    _set_phase(ZERO_GRAD)
    _S.in_zero_grad = True


@_guard
def _zero_grad_end():
    _S.in_zero_grad = False
    _mark("end", ZERO_GRAD)


def _wrap_zero_grad(fn, is_optimizer):
    import inspect

    try:
        default = inspect.signature(fn).parameters["set_to_none"].default
    except (KeyError, ValueError, TypeError):
        default = True

    @functools.wraps(fn)
    def zero_grad(self, *args, **kwargs):
        if not _S.started:
            return fn(self, *args, **kwargs)
        _zero_grad_begin(self, is_optimizer, kwargs.get("set_to_none", args[0] if args else default))
        try:
            return fn(self, *args, **kwargs)
        finally:
            _zero_grad_end()

    zero_grad.__oomdbg_wrapped__ = True
    return zero_grad


@_guard
def _clip_begin():
    if _S.backward_depth == 0:
        _set_phase(OPTIMIZER)  # clipping is part of the step


def _wrap_clip(fn):
    @functools.wraps(fn)
    def clip(*args, **kwargs):
        if _S.started:
            _clip_begin()
        return fn(*args, **kwargs)

    clip.__oomdbg_wrapped__ = True
    return clip


def _install_module_hooks(modmod):
    import inspect

    _S.handles.append(modmod.register_module_forward_pre_hook(_forward_pre))
    try:
        always = "always_call" in inspect.signature(modmod.register_module_forward_hook).parameters
    except (TypeError, ValueError):
        always = False
    if always:
        _S.handles.append(modmod.register_module_forward_hook(_forward_post, always_call=True))
    else:
        _S.handles.append(modmod.register_module_forward_hook(_forward_post))


def _install_hooks(torch):
    from torch.nn.modules import module as modmod

    _install_module_hooks(modmod)

    import torch.autograd as autograd

    for name in ("backward", "grad"):
        fn = getattr(autograd, name)
        if not getattr(fn, "__oomdbg_wrapped__", False):
            setattr(autograd, name, _wrap_backward(fn))

    optmod = sys.modules.get("torch.optim.optimizer")
    Optimizer = torch.optim.Optimizer
    if optmod is not None and hasattr(optmod, "register_optimizer_step_pre_hook"):
        optmod.register_optimizer_step_pre_hook(_step_pre)
        optmod.register_optimizer_step_post_hook(_step_post)
    else:
        # Before 2.0 there are no global optimizer hooks: wrap each optimizer class's step once, as
        # torch.optim itself wraps it for the profiler.
        init = Optimizer.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            cls = type(self)
            step = cls.__dict__.get("step")
            if step is not None and not getattr(step, "__oomdbg_wrapped__", False):
                cls.step = _wrap_step(step)

        Optimizer.__init__ = __init__
    for cls, is_opt in ((Optimizer, True), (torch.nn.Module, False)):
        if not getattr(cls.zero_grad, "__oomdbg_wrapped__", False):
            cls.zero_grad = _wrap_zero_grad(cls.zero_grad, is_opt)

    import torch.nn.utils as nnutils

    clipmod = sys.modules.get("torch.nn.utils.clip_grad")
    for mod in (nnutils, clipmod):
        if mod is not None and hasattr(mod, "clip_grad_norm_"):
            if not getattr(mod.clip_grad_norm_, "__oomdbg_wrapped__", False):
                mod.clip_grad_norm_ = _wrap_clip(mod.clip_grad_norm_)

    _watch("transformers.trainer_callback", _hook_transformers)
    for name in ("lightning.pytorch", "pytorch_lightning"):
        _watch(name, _hook_lightning)


@_guard
def _framework_step_begin(*_args, **_kwargs):
    """A trainer's callback at the start of a training step: the iteration begins before its batch moves."""
    if _S.started and not _S.in_iteration:
        _reset_module_depth()
        _begin_iteration()
        _set_phase(DATA)


def _hook_transformers(tc):
    class OomdbgRecordCallback(tc.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            _framework_step_begin()

    if OomdbgRecordCallback not in tc.DEFAULT_CALLBACKS:
        tc.DEFAULT_CALLBACKS.append(OomdbgRecordCallback)


def _hook_lightning(pl):
    Callback, Trainer = getattr(pl, "Callback", None), getattr(pl, "Trainer", None)
    if Callback is None or Trainer is None or getattr(Trainer.__init__, "__oomdbg_wrapped__", False):
        return

    class OomdbgRecordCallback(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            _framework_step_begin()

    init = Trainer.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        cbs = kwargs.get("callbacks")
        cbs = [] if cbs is None else (list(cbs) if isinstance(cbs, (list, tuple)) else [cbs])
        kwargs["callbacks"] = cbs + [OomdbgRecordCallback()]
        init(self, *args, **kwargs)

    __init__.__oomdbg_wrapped__ = True
    Trainer.__init__ = __init__


# ---- dumps ----


def _rank_name():
    if _S.rank_name is None:
        rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")
        if rank is not None and rank.isdigit():
            _S.rank_name = "rank" + rank
        else:
            # One process without a rank is rank 0; any other one that records is named by its pid.
            try:
                fd = os.open(os.path.join(_S.config.dir, ".rank0.claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                _S.rank_name = "rank0"
            except OSError:
                _S.rank_name = "pid%d" % os.getpid()
    return _S.rank_name


def _dump_path(kind):
    base = os.path.join(_S.config.dir, _rank_name())
    if kind == "step":
        return "%s.step%08d.pickle" % (base, _S.steps)
    return "%s.%s.pickle" % (base, kind)


def _payload(reason):
    torch = _S.torch
    counts = []
    try:
        n = torch.cuda.device_count()
    except Exception:
        n = 0
    for d in range(n):
        _, a, f = _counts(d)
        counts.append({"device": d, "allocs": a, "frees": f})
    # What is alive now: every weight, gradient and optimizer state of the models and optimizers seen.
    point = (_now_us(), -1, -1, -1, _S.iteration)  # counts -1: at the dump, the end of the trace
    items = []
    seen = set()
    for opt in list(_S.optimizers):
        items.extend(_state_items(opt))
        params = list(_optimizer_params(opt))
        seen.update(id(p) for p in params)
        items.extend(_param_items(params, True))
    for root in list(_S.roots):
        try:
            params = [p for p in root.parameters() if id(p) not in seen]
        except Exception:
            continue
        seen.update(id(p) for p in params)
        items.extend(_param_items(params, True))
    tags = list(_S.tags) + _tag_records(items, point)
    marks = [{"time_us": t, "device": d, "allocs": a, "frees": f, "kind": k, "name": n, "iteration": it}
             for (t, d, a, f, k, n, it) in list(_S.marks)]
    marks.extend({"time_us": t, "device": -1, "allocs": -1, "frees": -1, "kind": "enter" if e else "exit",
                  "name": n, "iteration": -1} for (t, e, n) in list(_S.scopes))
    marks.sort(key=lambda m: m["time_us"])
    return {
        "format": FORMAT,
        "tool": _S.config.tool,
        "torch": str(getattr(torch, "__version__", "")),
        "reason": reason,
        "rank": _env_int("RANK", -1),
        "local_rank": _env_int("LOCAL_RANK", -1),
        "world_size": _env_int("WORLD_SIZE", -1),
        "pid": os.getpid(),
        "steps": _S.steps,
        "time_us": _now_us(),
        "counts": counts,
        "counts_exact": _S.counts_ok,
        "scopes_in_metadata": _S.metadata is not None,
        "notes": list(_S.notes),
        "marks": marks,
        "tags": [{"time_us": t, "device": d, "allocs": a, "frees": f, "iteration": it, "address": addr,
                  "size": n, "category": c, "name": name}
                 for (t, d, a, f, it, addr, n, c, name) in tags],
    }


def _dump(kind, reason=None):
    """Writes a snapshot with oomdbg's tags; kind names the file (step, oom, end)."""
    if not _S.started or os.getpid() != _S.pid:
        return
    with _S.lock:
        try:
            payload = _payload(reason or kind)
            snap = _S.torch.cuda.memory._snapshot()
            if isinstance(snap, dict):
                snap["oomdbg"] = payload
            path = _dump_path(kind)
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                # memory_viz reads protocols up to 4 in the releases people have.
                pickle.dump(snap, f, protocol=min(pickle.DEFAULT_PROTOCOL, 4))
            os.replace(tmp, path)
            if kind == "step":
                _roll()
        except Exception as e:
            _say("DUMP", "could not write a snapshot (%s: %s)" % (type(e).__name__, e))


def _roll():
    prefix = _rank_name() + ".step"
    try:
        files = sorted(f for f in os.listdir(_S.config.dir) if f.startswith(prefix) and f.endswith(".pickle"))
    except OSError:
        return
    for f in files[:-_S.config.keep]:
        try:
            os.remove(os.path.join(_S.config.dir, f))
        except OSError:
            pass


@_guard
def _on_oom(device, alloc, device_allocated, device_free):
    # Called by the caching allocator after it gave up and before it raises: the snapshot holds the trace
    # up to the failing request. A step may call it more than once; the newest state wins.
    if _S.steps > 0 and not (_S.in_iteration or _S.in_zero_grad or _S.backward_depth or _depth()):
        # Out of memory after a step and before the next forward, outside zero_grad: loading the next batch.
        _begin_iteration()
        _set_phase(DATA)
    _dump("oom")


@_guard
def _at_exit():
    reason = _S.end_reason or "exit"
    if _S.exception is not None:
        reason = "exception: " + _S.exception
    _dump("end", reason)


def _excepthook(hook):
    @functools.wraps(hook)
    def excepthook(typ, value, tb):
        _S.exception = getattr(typ, "__name__", str(typ))
        return hook(typ, value, tb)

    return excepthook


def _install_signals():
    sys.excepthook = _excepthook(sys.excepthook)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, handler in ((getattr(signal, "SIGUSR1", None), _on_usr1), (getattr(signal, "SIGTERM", None), _on_term)):
        if sig is None:
            continue
        try:
            _S.previous_handlers[sig] = signal.signal(sig, handler)
        except (ValueError, OSError):
            pass


def _on_usr1(signum, frame):
    if _S.started and os.getpid() == _S.pid:
        _dump("step", "SIGUSR1")
        return
    _chain(signum, frame)


def _on_term(signum, frame):
    if _S.started and os.getpid() == _S.pid:
        _S.end_reason = "SIGTERM"
        _dump("end", "SIGTERM")
    _chain(signum, frame)


def _chain(signum, frame):
    """Does what the signal did before the recorder was there: the job's own handler, or the default,
    so that the job dies of the signal as it would have."""
    prev = _S.previous_handlers.get(signum, signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)
        return
    if prev == signal.SIG_IGN:
        return
    if signum == getattr(signal, "SIGTERM", None):
        _S.started = False  # no second snapshot from the exit handler
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
