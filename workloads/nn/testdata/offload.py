# What torchtune's OffloadActivations (training/_activation_offloading.py) moves to host memory, as PyTorch
# saves the tensors: its pack hook around the model's forward up to the output head, which runs under
# NoOpManager, with the loss computed outside, as torchtune's recipes do. Used by oomdbg's tests.
#
# The hook here records each tensor packed instead of copying it (PyTorch's CPU build has no pinned memory):
# a tensor is offloaded when its view's bytes (element_size * nelement) are at least 1024 and it is not an
# nn.Parameter itself (a view of one is offloaded). Without streams (use_streams=False) nothing else keeps the
# device tensor, so what stays on the device for backward is what the hook does not offload.
#
# Arguments: the model ("gpt" or "llama") and a JSON list of cases (gpt: [batch, seq, d, heads, layers,
# vocab, amp]; llama: testdata/llama.py's dicts). It prints, per case, [host, device]: the pinned host bytes
# (each copy a block of the caching host allocator, its bytes rounded up to a power of two) and the bytes
# left saved on the device, once per storage, without parameters and buffers. PyTorch 1.13's MeanBackward1
# saves its input where PyTorch 2 does not (see testdata/llama.py): packs of storages only it saves are left
# out of both counts, and the script says so on stderr.
import json
import sys

import torch
import torch.nn.functional as F

import llama
import nanogpt


def pow2(n):
    return 1 << (n - 1).bit_length()


def measure(model, inside, outside, amp, mean_node=None):
    state = {t.storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    packs, kept = [], {}  # offload packs (storage, bytes, offloaded); what stays on the device

    def pack_offload(t):
        n = t.element_size() * t.nelement()
        if not (t.dim() == 0 and t.dtype == torch.float64):
            packs.append((t.storage().data_ptr(), t.storage().nbytes(), n >= 1024 and not isinstance(t, torch.nn.Parameter), n))
        return t

    def pack_plain(t):
        if not (t.dim() == 0 and t.dtype == torch.float64):
            kept[t.storage().data_ptr()] = t.storage().nbytes()
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16"):
        with torch.autograd.graph.saved_tensors_hooks(pack_offload, lambda t: t):
            hidden = inside()
        with torch.autograd.graph.saved_tensors_hooks(pack_plain, lambda t: t):
            loss = outside(hidden)
    mean_only = llama.saved_only_by_mean(loss.grad_fn) if mean_node else set()
    if mean_only:
        print(f"left out the packs of {len(mean_only)} storages only 1.13's MeanBackward1 saves", file=sys.stderr)
    host = 0
    for ptr, nbytes, offloaded, n in packs:
        if ptr in mean_only:
            continue
        if offloaded:  # a view of a parameter too: its storage is the parameter's, the copy is new
            host += pow2(n)
        else:
            kept[ptr] = nbytes
    device = sum(b for p, b in kept.items() if p not in state and p not in mean_only)
    loss.backward()
    return [host, device]


def gpt(batch, seq, d, heads, layers, vocab, amp):
    nanogpt.CUDA_RULES = amp == "bf16"
    torch.manual_seed(0)
    m = nanogpt.GPT(vocab, seq, layers, heads, d, 0.0)
    idx = torch.randint(0, vocab, (batch, seq))

    def inside():  # GPT.forward up to the head
        pos = torch.arange(0, seq, dtype=torch.long)
        x = m.transformer.drop(m.transformer.wte(idx) + m.transformer.wpe(pos))
        for block in m.transformer.h:
            x = block(x)
        return m.transformer.ln_f(x)

    def outside(x):
        logits = m.lm_head(x).view(-1, vocab)
        if nanogpt.CUDA_RULES:
            return F.nll_loss(F.log_softmax(logits, 1, dtype=logits.dtype), idx.view(-1), ignore_index=-1)
        return F.cross_entropy(logits, idx.view(-1), ignore_index=-1)

    return measure(m, inside, outside, amp)


def llama_case(c):
    m = llama.build(c)
    m.train()
    if c.get("checkpoint"):
        m.model.gradient_checkpointing = True
        if c.get("lora"):  # enable_input_require_grads
            m.model.embed_tokens.register_forward_hook(lambda mod, i, o: o.requires_grad_(True))
    idx = torch.randint(0, c["vocab"], (c["batch"], c["seq"]))

    def outside(h):
        logits = m.lm_head(h[:, slice(0, None), :])
        return llama.ForCausalLMLoss(logits, idx, c["vocab"])

    return measure(m, lambda: m.model(idx), outside, c.get("amp"), mean_node=True)


if __name__ == "__main__":
    which, cases = sys.argv[1], json.loads(sys.argv[2])
    nanogpt.check_cpu_autocast()
    llama.check_cpu_autocast()
    print(json.dumps([gpt(*c) if which == "gpt" else llama_case(c) for c in cases]))
