# A GPT decoder with nanoGPT's structure (model.py of karpathy/nanoGPT): token and position embeddings,
# dropout, pre-LayerNorm blocks of causal self-attention (without flash) and MLP, final LayerNorm, tied LM
# head, cross-entropy. Used by oomdbg's tests to count what PyTorch saves for backward.
#
# With "bf16" as the second argument the forward runs under CPU autocast to bfloat16 with CUDA autocast's
# rules. CPU autocast applies the same rules as CUDA's to every op of this model (checked below) but two, and
# for those two the script makes the very call CUDA autocast makes:
#   - softmax: CUDA lists it as fp32_set_opt_dtype (aten/src/ATen/autocast_mode.h), so autocast calls
#     softmax(x, dim, dtype=float32); CPU autocast does not list it;
#   - cross_entropy: CUDA does not list it, so it runs as cross_entropy_loss_symint composes it
#     (aten/src/ATen/native/LossNLL.cpp): nll_loss(log_softmax(x, dim, x.dtype)); CPU autocast lists it as
#     fp32. nll_loss is fp32 in both.
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

CUDA_RULES = False


def check_cpu_autocast():
    """Fails unless CPU autocast gives every op of the model the dtype CUDA autocast gives it."""
    bf16, f32 = torch.bfloat16, torch.float32
    x, h = torch.randn(2, 4, 8), torch.randn(2, 4, 8).to(bf16)
    w = torch.randn(8, requires_grad=True)
    with torch.autocast("cpu", dtype=bf16):
        got = {
            "linear": F.linear(x, torch.randn(3, 8)).dtype,
            "matmul": torch.matmul(x, x.transpose(-2, -1)).dtype,
            "layer_norm of float32": F.layer_norm(x, (8,), w, w).dtype,
            "embedding": F.embedding(torch.tensor([1]), torch.randn(4, 8)).dtype,
            "add": (x + h).dtype,
            "gelu": F.gelu(h).dtype,
            "masked_fill": h.masked_fill(h > 0, 0).dtype,
            "softmax with dtype": F.softmax(h, -1, dtype=f32).dtype,
            "log_softmax with dtype": F.log_softmax(h, -1, dtype=bf16).dtype,
            "nll_loss": F.nll_loss(h[0], torch.tensor([0, 1, 2, 3])).dtype,
        }
    want = {"linear": bf16, "matmul": bf16, "layer_norm of float32": f32, "embedding": f32, "add": f32, "gelu": bf16,
            "masked_fill": bf16, "softmax with dtype": f32, "log_softmax with dtype": bf16, "nll_loss": f32}
    if got != want:
        raise SystemExit(f"PyTorch {torch.__version__}: CPU autocast gives {got}, the comparison needs {want}")


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, block, dropout):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd = heads, d
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1, dtype=torch.float32) if CUDA_RULES else F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, d, dropout):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, d, heads, block, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, block, dropout)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, d, dropout):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d), wpe=nn.Embedding(block, d), drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(d, heads, block, dropout) for _ in range(layers)]), ln_f=nn.LayerNorm(d)))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        logits, targets = logits.view(-1, logits.size(-1)), targets.view(-1)
        if CUDA_RULES:
            return F.nll_loss(F.log_softmax(logits, 1, dtype=logits.dtype), targets, ignore_index=-1)
        return F.cross_entropy(logits, targets, ignore_index=-1)


def saved_bytes(batch, seq, d, heads, layers, vocab):
    """Bytes PyTorch keeps for backward after the forward pass and the loss, once per storage, without
    parameters, buffers and wrapped Python scalars (0-dim float64 tensors that live on the host on CUDA)."""
    torch.manual_seed(0)
    model = GPT(vocab, seq, layers, heads, d, 0.0)
    state = {t.storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen = {}

    def pack(t):
        st = t.storage()
        if st.data_ptr() not in state and not (t.dim() == 0 and t.dtype == torch.float64):
            seen[st.data_ptr()] = st.nbytes()
        return t

    idx = torch.randint(0, vocab, (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=CUDA_RULES):
        model(idx, idx)
    return sum(seen.values())


if __name__ == "__main__":  # selective.py imports the modules above
    if len(sys.argv) > 2 and sys.argv[2] == "bf16":
        check_cpu_autocast()
        CUDA_RULES = True
    print(json.dumps([saved_bytes(*shape) for shape in json.loads(sys.argv[1])]))
