# A Llama-family causal LM written module for module as HF transformers writes it (models/llama/
# modeling_llama.py, v4.49: LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half, apply_rotary_pos_emb, repeat_kv,
# eager_attention_forward, LlamaAttention, LlamaMLP, LlamaDecoderLayer, LlamaModel with
# _prepare_4d_causal_attention_mask_with_cache_position and reentrant gradient checkpointing, LlamaForCausalLM
# with loss/loss_utils.py's ForCausalLMLoss; Qwen2's q/k/v biases), and LoRA as peft's tuners/lora/layer.py
# Linear computes it, with the base frozen and enable_input_require_grads under checkpointing. It imports no
# transformers and no peft: it is the reference oomdbg's Llama is compared with.
#
# Modes (the first argument), each reading a JSON list of cases from the second and printing a JSON list:
#   saved   the bytes autograd keeps for backward after the forward and the loss, once per storage, without
#           parameters and buffers (as testdata/nanogpt.py counts them), for each case, as PyTorch 2 keeps
#           them: PyTorch 1.13's MeanBackward1 saves its input (RMSNorm's pow(2) output), where PyTorch 2's
#           saves only its sizes and numel (derivatives.yaml: mean.dim, mean_backward(grad,
#           self.sym_sizes(), dim, self.sym_numel(), keepdim)); the storages only MeanBackward1 saves are
#           left out of the count, and the script prints them on stderr
#   count   [all parameters, trainable parameters] of the model of each case, built on the meta device
#
# A case is a dict: batch, seq, d, heads, kv_heads, layers, vocab, ffn, tied, qkv_bias, amp ("f32" or
# "bf16": CPU autocast to bfloat16, whose rules for these ops are CUDA's, checked below), dtype (the
# parameters' dtype, "f32" or "bf16"), checkpoint (bool), lora (null or {r, alpha, targets}).
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def check_cpu_autocast():
    """Fails unless CPU autocast gives every op of the model the dtype CUDA autocast gives it."""
    bf16, f32 = torch.bfloat16, torch.float32
    x, h = torch.randn(2, 4, 8), torch.randn(2, 4, 8).to(bf16)
    with torch.autocast("cpu", dtype=bf16):
        got = {
            "linear": F.linear(x, torch.randn(3, 8)).dtype,
            "matmul": torch.matmul(x, x.transpose(-2, -1)).dtype,
            "embedding": F.embedding(torch.tensor([1]), torch.randn(4, 8)).dtype,
            "pow of float32": x.pow(2).dtype,
            "mean of float32": x.mean(-1, keepdim=True).dtype,
            "rsqrt of float32": torch.rsqrt(x.abs() + 1).dtype,
            "mul 16-bit by float32": (h * x).dtype,
            "add 16-bit and float32": (h + x).dtype,
            "silu": F.silu(h).dtype,
            "neg": (-h).dtype,
            "cat": torch.cat((h, h), -1).dtype,
            "softmax with dtype": F.softmax(h, -1, dtype=f32).dtype,
            "cross_entropy of float32": F.cross_entropy(x[0], torch.tensor([0, 1, 2, 3])).dtype,
        }
    want = {"linear": bf16, "matmul": bf16, "embedding": f32, "pow of float32": f32, "mean of float32": f32,
            "rsqrt of float32": f32, "mul 16-bit by float32": f32, "add 16-bit and float32": f32, "silu": bf16,
            "neg": bf16, "cat": bf16, "softmax with dtype": f32, "cross_entropy of float32": f32}
    if got != want:
        raise SystemExit(f"PyTorch {torch.__version__}: CPU autocast gives {got}, the comparison needs {want}")


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, head_dim, base, device=None):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float().to(device) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = 1.0

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        with torch.autocast(device_type="cpu", enabled=False):
            freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos()
            sin = emb.sin()
        cos = cos * self.attention_scaling
        sin = sin * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = attn_weights + causal_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class LlamaAttention(nn.Module):
    def __init__(self, c, device=None):
        super().__init__()
        self.head_dim = c["d"] // c["heads"]
        self.num_key_value_groups = c["heads"] // c["kv_heads"]
        self.scaling = self.head_dim ** -0.5
        bias = c.get("qkv_bias", False)
        self.q_proj = nn.Linear(c["d"], c["heads"] * self.head_dim, bias=bias, device=device)
        self.k_proj = nn.Linear(c["d"], c["kv_heads"] * self.head_dim, bias=bias, device=device)
        self.v_proj = nn.Linear(c["d"], c["kv_heads"] * self.head_dim, bias=bias, device=device)
        self.o_proj = nn.Linear(c["heads"] * self.head_dim, c["d"], bias=False, device=device)

    def forward(self, hidden_states, position_embeddings, attention_mask):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        attn_output, attn_weights = eager_attention_forward(self, query_states, key_states, value_states,
                                                            attention_mask, scaling=self.scaling)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class LlamaMLP(nn.Module):
    def __init__(self, c, device=None):
        super().__init__()
        self.gate_proj = nn.Linear(c["d"], c["ffn"], bias=False, device=device)
        self.up_proj = nn.Linear(c["d"], c["ffn"], bias=False, device=device)
        self.down_proj = nn.Linear(c["ffn"], c["d"], bias=False, device=device)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c, device=None):
        super().__init__()
        self.self_attn = LlamaAttention(c, device)
        self.mlp = LlamaMLP(c, device)
        self.input_layernorm = LlamaRMSNorm(c["d"], eps=1e-5, device=device)
        self.post_attention_layernorm = LlamaRMSNorm(c["d"], eps=1e-5, device=device)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None,
                output_attentions=False, use_cache=False, cache_position=None, position_embeddings=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, self_attn_weights = self.self_attn(hidden_states, position_embeddings, attention_mask)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return (hidden_states,)


class LlamaModel(nn.Module):
    def __init__(self, c, device=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["d"], device=device)
        self.layers = nn.ModuleList([LlamaDecoderLayer(c, device) for _ in range(c["layers"])])
        self.norm = LlamaRMSNorm(c["d"], eps=1e-5, device=device)
        self.rotary_emb = LlamaRotaryEmbedding(c["d"] // c["heads"], 10000.0, device)
        self.gradient_checkpointing = False

    def forward(self, input_ids):
        inputs_embeds = self.embed_tokens(input_ids)
        cache_position = torch.arange(0, inputs_embeds.shape[1])
        position_ids = cache_position.unsqueeze(0)
        causal_mask = self._prepare_4d_causal_attention_mask_with_cache_position(
            sequence_length=inputs_embeds.shape[1], target_length=inputs_embeds.shape[1] + 1,
            dtype=inputs_embeds.dtype, cache_position=cache_position, batch_size=inputs_embeds.shape[0])
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for decoder_layer in self.layers:
            if self.gradient_checkpointing and self.training:
                layer_outputs = checkpoint(decoder_layer.__call__, hidden_states, causal_mask, position_ids, None,
                                           False, False, cache_position, position_embeddings, use_reentrant=True)
            else:
                layer_outputs = decoder_layer(hidden_states, attention_mask=causal_mask, position_ids=position_ids,
                                              cache_position=cache_position, position_embeddings=position_embeddings)
            hidden_states = layer_outputs[0]
        return self.norm(hidden_states)

    @staticmethod
    def _prepare_4d_causal_attention_mask_with_cache_position(sequence_length, target_length, dtype,
                                                              cache_position, batch_size):
        min_dtype = torch.finfo(dtype).min
        causal_mask = torch.full((sequence_length, target_length), fill_value=min_dtype, dtype=dtype)
        if sequence_length != 1:
            causal_mask = torch.triu(causal_mask, diagonal=1)
        causal_mask *= torch.arange(target_length) > cache_position.reshape(-1, 1)
        return causal_mask[None, None, :, :].expand(batch_size, 1, -1, -1)


def ForCausalLMLoss(logits, labels, vocab_size, ignore_index=-100):
    logits = logits.float()
    labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
    shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1)
    return nn.functional.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction="mean")


class LlamaForCausalLM(nn.Module):
    def __init__(self, c, device=None):
        super().__init__()
        self.model = LlamaModel(c, device)
        self.lm_head = nn.Linear(c["d"], c["vocab"], bias=False, device=device)
        self.vocab_size = c["vocab"]
        if c["tied"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, labels):
        hidden_states = self.model(input_ids)
        logits = self.lm_head(hidden_states[:, slice(0, None), :])
        loss = ForCausalLMLoss(logits, labels, self.vocab_size)
        return loss, logits


class LoraLinear(nn.Module):
    """peft's lora.Linear: base_layer, lora_A/lora_B ModuleDicts keyed by adapter name, scaling alpha/r."""

    def __init__(self, base_layer, r, alpha, device=None):
        super().__init__()
        self.base_layer = base_layer
        self.lora_dropout = nn.ModuleDict({"default": nn.Identity()})
        self.lora_A = nn.ModuleDict({"default": nn.Linear(base_layer.in_features, r, bias=False, device=device)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, base_layer.out_features, bias=False, device=device)})
        self.scaling = {"default": alpha / r}

    def forward(self, x):
        result = self.base_layer(x)
        torch_result_dtype = result.dtype
        lora_A, lora_B = self.lora_A["default"], self.lora_B["default"]
        dropout, scaling = self.lora_dropout["default"], self.scaling["default"]
        if x.dtype != lora_A.weight.dtype:  # _cast_input_dtype
            x = x.to(dtype=lora_A.weight.dtype)
        result = result + lora_B(lora_A(dropout(x))) * scaling
        return result.to(torch_result_dtype)


TARGETS = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def apply_lora(model, lora, device=None):
    """get_peft_model: adapters on the target modules (float32), everything else frozen."""
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers:
        for t in lora["targets"]:
            parent_name, child = TARGETS[t].split(".")
            parent = getattr(layer, parent_name)
            setattr(parent, child, LoraLinear(getattr(parent, child), lora["r"], lora["alpha"], device))


def build(c, device=None):
    torch.manual_seed(0)
    model = LlamaForCausalLM(c, device)
    if c.get("dtype") == "bf16":
        model = model.to(torch.bfloat16)
    if c.get("lora"):
        apply_lora(model, c["lora"], device)
    return model


def saved_bytes(c):
    model = build(c)
    model.train()
    if c.get("checkpoint"):
        model.model.gradient_checkpointing = True
        if c.get("lora"):  # enable_input_require_grads
            model.model.embed_tokens.register_forward_hook(lambda m, i, o: o.requires_grad_(True))
    state = {t.storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen = {}

    def pack(t):
        st = t.storage()
        if st.data_ptr() not in state and not (t.dim() == 0 and t.dtype == torch.float64):
            seen[st.data_ptr()] = st.nbytes()
        return t

    idx = torch.randint(0, c["vocab"], (c["batch"], c["seq"]))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=c.get("amp") == "bf16"):
        loss, logits = model(idx, idx)
    mean_only = saved_only_by_mean(loss.grad_fn)
    if mean_only:
        print(f"{c}: left out {sum(seen[p] for p in mean_only)} bytes 1.13's MeanBackward1 saves", file=sys.stderr)
    loss.backward()  # the graph must be whole: backward runs through it once
    return sum(n for p, n in seen.items() if p not in mean_only)


def saved_only_by_mean(root):
    """The storages MeanBackward1 nodes save as self and no other node saves."""
    mean, other, stack, visited = set(), set(), [root], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in visited:
            continue
        visited.add(fn)
        for attr in dir(fn):
            if attr.startswith("_saved_"):
                v = getattr(fn, attr)
                if isinstance(v, torch.Tensor):
                    (mean if type(fn).__name__ == "MeanBackward1" and attr == "_saved_self" else other).add(
                        v.storage().data_ptr())
        stack.extend(n for n, _ in fn.next_functions)
    return mean - other


def count(c):
    model = build(c, device="meta")
    params = list(model.parameters())  # each parameter once, tied weights included once
    return [sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)]


if __name__ == "__main__":  # families.py imports the modules above
    mode, cases = sys.argv[1], json.loads(sys.argv[2])
    if mode == "saved":
        check_cpu_autocast()
        print(json.dumps([saved_bytes(c) for c in cases]))
    elif mode == "count":
        print(json.dumps([count(c) for c in cases]))
    else:
        raise SystemExit(f"unknown mode {mode}")
