# Selective activation checkpointing, as torch.utils.checkpoint runs a policy made by
# create_selective_checkpoint_contexts (PyTorch 2.4 and later): each checkpointed block keeps the outputs of
# the ops the policy saves (CheckpointPolicy.MUST_SAVE) besides its inputs, and recomputes everything else.
# Used by oomdbg's tests to count the bytes held for backward after the forward and the loss.
#
# PyTorch 1.13, the reference here, has no create_selective_checkpoint_contexts. The script does what its
# _CachingTorchDispatchMode does during the forward: a TorchDispatchMode around each block sees the ATen ops
# PyTorch's own dispatcher runs (F.linear as addmm or mm, attention's matmuls as bmm, under autocast in the
# dtype autocast gives them) and keeps every output of an op the policy names. Each block runs under the
# reentrant checkpoint, which saves the block's tensor inputs as the non-reentrant one does; its recompute in
# backward is the plain one (the counts are taken before backward, which only checks the graph runs).
#
# Arguments: the model ("gpt" or "llama"), a JSON list of the ops the policy saves ("aten.mm", ...), a JSON
# list of cases: for gpt [batch, seq, d, heads, layers, vocab, amp], for llama testdata/llama.py's dicts.
# It prints a JSON list of bytes, once per storage, without parameters and buffers, as the scripts it
# imports count them. Ops this PyTorch lacks (the fused attention kernels of 2.0) are named on stderr: the
# models here do not call them.
import functools
import json
import sys

import torch
import torch.utils.checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

import llama
import nanogpt


def policy_ops(names):
    ops = set()
    for name in names:
        namespace, op = name.split(".", 1)
        try:
            ops.add(getattr(getattr(torch.ops, namespace), op).default)
        except (AttributeError, RuntimeError):
            print(f"{name}: not in PyTorch {torch.__version__}", file=sys.stderr)
    return ops


class KeepOutputs(TorchDispatchMode):
    """Keeps every output of the ops in ops, as _CachingTorchDispatchMode stores them for MUST_SAVE."""

    def __init__(self, ops, kept):
        super().__init__()
        self.ops, self.kept = ops, kept

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.ops:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            self.kept.extend(t for t in outs if isinstance(t, torch.Tensor))
        return out


def selective(ops, held, fn, *args, use_reentrant=True):
    """checkpoint(fn, *args) with the policy: what the block keeps goes into held."""
    kept = []
    held.append(kept)

    def run(*a):
        with KeepOutputs(ops, kept):
            return fn(*a)

    return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=True)


def held_bytes(model, forward, amp, mean_only=lambda loss: set()):
    """Bytes held for backward after forward() under the policy: what autograd saves outside the blocks
    (the blocks' inputs among them) and what the blocks kept, once per storage."""
    state = {t.storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen = {}

    def pack(t):
        st = t.storage()
        if st.data_ptr() not in state and not (t.dim() == 0 and t.dtype == torch.float64):
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16"):
        loss = forward()
    left_out = mean_only(loss)
    total = {p: n for p, n in seen.items() if p not in left_out}
    for kept in HELD:
        for t in kept:
            st = t.storage()
            if st.data_ptr() not in state:
                total[st.data_ptr()] = st.nbytes()
    loss.backward()  # the graph must be whole: backward runs through it once
    return sum(total.values())


HELD = []


def gpt(ops, batch, seq, d, heads, layers, vocab, amp):
    nanogpt.CUDA_RULES = amp == "bf16"
    torch.manual_seed(0)
    model = nanogpt.GPT(vocab, seq, layers, heads, d, 0.0)
    for block in model.transformer.h:
        block.forward = functools.partial(selective, ops, HELD, block.forward)
    idx = torch.randint(0, vocab, (batch, seq))
    return held_bytes(model, lambda: model(idx, idx), amp)


def llama_case(ops, c):
    model = llama.build(c)
    model.train()
    model.model.gradient_checkpointing = True
    if c.get("lora"):  # enable_input_require_grads
        model.model.embed_tokens.register_forward_hook(lambda m, i, o: o.requires_grad_(True))
    llama.checkpoint = functools.partial(selective, ops, HELD)
    idx = torch.randint(0, c["vocab"], (c["batch"], c["seq"]))
    return held_bytes(model, lambda: model(idx, idx)[0], c.get("amp"), lambda loss: llama.saved_only_by_mean(loss.grad_fn))


if __name__ == "__main__":
    which, ops, cases = sys.argv[1], policy_ops(json.loads(sys.argv[2])), json.loads(sys.argv[3])
    nanogpt.check_cpu_autocast()
    llama.check_cpu_autocast()
    out = []
    for c in cases:
        HELD.clear()
        out.append(gpt(ops, *c) if which == "gpt" else llama_case(ops, c))
    print(json.dumps(out))
