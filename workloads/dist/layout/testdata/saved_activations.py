"""Counts the bytes one tensor-parallel rank of a Megatron GPT layer saves for its backward pass, measured
with PyTorch's own saved-tensor hooks on the CPU.

argv[1] is a JSON list of configurations (s, b, h, a, g, kv, f, gated, t, recompute, dtype). Each layer is
rank 0 of t: column-parallel Q, K, V and first MLP linears with a/t heads and f/t columns, row-parallel
output projection and second MLP linear (the all-reduces change no sizes on one process), as in
megatron/core/transformer (attention.py, dot_product_attention.py, mlp.py, fused_bias_swiglu.py). Dropout
is torch.native_dropout, whose one-byte mask is what the GPU's dropout saves (the CPU's torch.dropout saves
a mask of the input's dtype instead). Saved tensors are counted once per storage, parameters excluded, and
the norms' per-token mean and rstd and repeat_interleave's head index left out (the paper counts none of
them: they do not grow with s*b*h). Prints the byte counts as a JSON list.
"""

import json
import math
import sys

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

P = 0.1


def dropout(x):
    return torch.native_dropout(x, P, True)[0]


class SwiGLUFunction(torch.autograd.Function):
    """megatron/core/fusions/fused_bias_swiglu.py's SwiGLUFunction: saves its input only."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        gate, up = torch.chunk(x, 2, -1)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            gate, up = torch.chunk(x, 2, -1)
            y = F.silu(gate) * up
        return torch.autograd.grad(y, x, grad)


class Layer(torch.nn.Module):
    def __init__(self, c, dtype):
        super().__init__()
        h, t, kv = c["h"], c["t"], c["kv"]
        self.c = c
        self.heads, self.groups = c["a"] // t, c["g"] // t
        self.ln1 = torch.nn.LayerNorm(h, dtype=dtype)
        self.q = torch.nn.Linear(h, self.heads * kv, bias=False, dtype=dtype)
        self.k = torch.nn.Linear(h, self.groups * kv, bias=False, dtype=dtype)
        self.v = torch.nn.Linear(h, self.groups * kv, bias=False, dtype=dtype)
        self.o = torch.nn.Linear(self.heads * kv, h, bias=False, dtype=dtype)
        self.ln2 = torch.nn.LayerNorm(h, dtype=dtype)
        width = c["f"] // t
        self.fc1 = torch.nn.Linear(h, 2 * width if c["gated"] else width, bias=False, dtype=dtype)
        self.fc2 = torch.nn.Linear(width, h, bias=False, dtype=dtype)

    def core(self, q, k, v):
        """DotProductAttention.forward: K and V repeated to every head, scores, softmax, dropout, context."""
        s, b, kv = q.shape[0], q.shape[1], self.c["kv"]
        if self.groups != self.heads:
            k = k.repeat_interleave(self.heads // self.groups, dim=2)
            v = v.repeat_interleave(self.heads // self.groups, dim=2)
        q = q.reshape(s, b * self.heads, kv).transpose(0, 1)
        k = k.reshape(s, b * self.heads, kv).transpose(0, 1)
        v = v.reshape(s, b * self.heads, kv).transpose(0, 1)
        scores = torch.bmm(q, k.transpose(1, 2)) * (1 / math.sqrt(kv))
        probs = dropout(torch.softmax(scores, -1))
        return torch.bmm(probs, v)  # [b*heads, s, kv]

    def layer(self, x):
        s, b, kv = x.shape[0], x.shape[1], self.c["kv"]
        y = self.ln1(x)
        q = self.q(y).view(s, b, self.heads, kv)
        k = self.k(y).view(s, b, self.groups, kv)
        v = self.v(y).view(s, b, self.groups, kv)
        if self.c["recompute"] == "selective":
            ctx = checkpoint(self.core, q, k, v, use_reentrant=True)
        else:
            ctx = self.core(q, k, v)
        ctx = ctx.transpose(0, 1).reshape(s, b, self.heads * kv)
        x = x + dropout(self.o(ctx))
        y = self.fc1(self.ln2(x))
        y = SwiGLUFunction.apply(y) if self.c["gated"] else F.gelu(y)
        return x + dropout(self.fc2(y))

    def forward(self, x):
        if self.c["recompute"] == "full":
            return checkpoint(self.layer, x, use_reentrant=True)
        return self.layer(x)


def saved_bytes(c):
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[c["dtype"]]
    torch.manual_seed(0)
    layer = Layer(c, dtype)
    params = {p.data_ptr() for p in layer.parameters()}
    storages = {}

    def pack(t):
        storage = t.storage()
        ptr = storage.data_ptr()
        # Parameters, scalars, the norms' [s, b, 1] statistics and repeat_interleave's int64 index (a/t
        # entries, whatever s and b) are not activations.
        index = t.dtype == torch.int64 and t.dim() == 1
        if ptr not in params and t.dim() > 0 and t.shape[-1] != 1 and not index:
            storages[ptr] = storage.nbytes()
        return t

    x = torch.randn(c["s"], c["b"], c["h"], dtype=dtype, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    out.float().sum().backward()  # the graph is whole: every saved tensor was needed
    return sum(storages.values())


json.dump([saved_bytes(c) for c in json.loads(sys.argv[1])], sys.stdout)
