# The model families HF transformers writes beside Llama's, module for module as transformers 4.51 writes them,
# for oomdbg's tests to count what PyTorch saves for backward and how many parameters each model has:
#   mixtral     MixtralForCausalLM (models/mixtral): MixtralSparseMoeBlock, its router, top-k softmax routing
#               renormalised, the loop over experts (torch.where, the token gather, index_add_), and
#               load_balancing_loss_func when the router logits are output
#   qwen2_moe   Qwen2MoeForCausalLM: q/k/v biases, top-k normalised only with norm_topk_prob, a shared expert
#               with a sigmoid gate
#   qwen3_moe   Qwen3MoeForCausalLM: q_norm and k_norm on each head, no biases, no shared expert
#   gemma2      Gemma2ForCausalLM: Gemma's RMSNorm (1 + weight, in float32), the embeddings scaled by
#               sqrt(hidden_size), four norms a layer, GeGLU (gelu tanh), attention and final logit soft-capping,
#               query_pre_attn_scalar, sliding-window attention on even layers (the mask rebuilt in the layer)
#   gemma3      Gemma3ForCausalLM (the text model): as gemma2 with q_norm and k_norm, no soft-capping, a local
#               rotary embedding for the sliding layers (every layer but each sliding_window_pattern-th)
#   phi3        Phi3ForCausalLM: fused qkv_proj and gate_up_proj, residual dropouts, Mistral's mask
#   bert        BertForMaskedLM and BertForSequenceClassification (models/bert, eager attention): embeddings
#               (word, position, token type) with LayerNorm and dropout, the padding mask extended and added to
#               the scores, post-LayerNorm layers, the MLM head (tied decoder with its own bias) or the pooler
#               and classifier
# Without importing transformers or peft: the Llama pieces come from llama.py beside this file, LoRA is
# llama.py's LoraLinear, and the dropouts are torch.native_dropout, which saves the one-byte mask CUDA's fused
# dropout saves (the CPU's F.dropout saves a float mask instead).
#
# Modes (the first argument), each reading a JSON list of cases from the second and printing a JSON list:
#   saved   the bytes autograd keeps for backward after the forward and the loss, once per storage, without
#           parameters, buffers and host scalars (Python numbers, Gemma 2's normalizer), as llama.py counts
#           them (and leaving out what only PyTorch 1.13's MeanBackward1 saves, as it does); a storage counts
#           while a tensor saved of it is alive at the end of the forward
#   count   [all parameters, trainable parameters] of each case's model, built on the meta device; a LoRA
#           classifier counts the copy peft's modules_to_save trains and the frozen original
#
# A case is a dict: family, batch, seq, d, heads, kv_heads, head_dim, layers, vocab, ffn, tied, amp, dtype,
# checkpoint, lora ({r, alpha, targets} with the short names of TARGETS); for the mixtures of experts experts,
# topk, moe_ffn, shared_ffn, norm_topk, aux (router_aux_loss_coef; 0: the router logits are not output) and
# routing (for each layer, the experts each token goes to: the top-k indices are replaced by it, so that the
# gathers have the shapes the test chose); for Gemma query_scale, attn_softcap, final_softcap, sliding_window,
# sliding_pattern (gemma3); for Phi-3 sliding_window, dropout (resid_pdrop); for BERT task ("mlm" or
# "classify"), labels, type_vocab, max_pos, dropout and lengths (each sample's tokens; the rest is padding
# with attention_mask 0).
import copy
import json
import weakref
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from llama import (LlamaRMSNorm, LlamaRotaryEmbedding, ForCausalLMLoss, LoraLinear, apply_rotary_pos_emb,
                   check_cpu_autocast, repeat_kv, saved_only_by_mean)


DEV = None  # the device modules are built on: None (the cpu) or "meta" for counting


def Linear(i, o, bias=True):
    return nn.Linear(i, o, bias=bias, device=DEV)


def Embedding(n, d, padding_idx=None):
    return nn.Embedding(n, d, padding_idx=padding_idx, device=DEV)


class CudaLayerNorm(nn.LayerNorm):
    """nn.LayerNorm as CUDA autocast runs it (fp32: 16-bit inputs, weight and bias cast to float32), which CPU
    autocast does not list."""

    def forward(self, x):
        if not AMP:
            return super().forward(x)
        return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), self.bias.float(), self.eps)


def LayerNorm(d, eps):
    return CudaLayerNorm(d, eps=eps, device=DEV)


def dropout(x, p, training):
    """nn.Dropout as CUDA runs it: native_dropout, saving a bool mask; nothing at p = 0."""
    if p == 0 or not training:
        return x
    return torch.native_dropout(x, p, True)[0]


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim, device=DEV))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


def head_dim(c):
    return c.get("head_dim") or c["d"] // c["heads"]


def norm(c, dim):
    if c["family"] in ("gemma2", "gemma3"):
        return GemmaRMSNorm(dim, eps=1e-6)
    return LlamaRMSNorm(dim, eps=1e-5, device=DEV)


def eager_attention(module, q, k, v, mask, scaling, softcap=None):
    key_states = repeat_kv(k, module.groups)
    value_states = repeat_kv(v, module.groups)
    w = torch.matmul(q, key_states.transpose(2, 3)) * scaling
    if softcap is not None:
        w = w / softcap
        w = torch.tanh(w)
        w = w * softcap
    if mask is not None:
        w = w + mask[:, :, :, : key_states.shape[-2]]
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    w = dropout(w, module.attn_dropout, module.training)
    out = torch.matmul(w, value_states)
    return out.transpose(1, 2).contiguous()


class Attention(nn.Module):
    """LlamaAttention's shape with each family's differences: Qwen2's q/k/v biases, Qwen3's and Gemma 3's q_norm
    and k_norm, Gemma's scaling and soft-capping, Phi-3's fused qkv_proj."""

    def __init__(self, c, layer):
        super().__init__()
        f, d, hd = c["family"], c["d"], head_dim(c)
        self.c, self.family, self.hd = c, f, hd
        self.heads, self.kvh = c["heads"], c["kv_heads"]
        self.groups = self.heads // self.kvh
        self.scaling = (c.get("query_scale", hd) if f in ("gemma2", "gemma3") else hd) ** -0.5
        self.softcap = c.get("attn_softcap") if f == "gemma2" else None
        self.attn_dropout = 0.0
        if f == "phi3":
            self.qkv_proj = Linear(d, (self.heads + 2 * self.kvh) * hd, bias=False)
        else:
            bias = f == "qwen2_moe"
            self.q_proj = Linear(d, self.heads * hd, bias=bias)
            self.k_proj = Linear(d, self.kvh * hd, bias=bias)
            self.v_proj = Linear(d, self.kvh * hd, bias=bias)
        self.o_proj = Linear(self.heads * hd, d, bias=False)
        if f == "qwen3_moe":
            self.q_norm = LlamaRMSNorm(hd, eps=1e-5, device=DEV)
            self.k_norm = LlamaRMSNorm(hd, eps=1e-5, device=DEV)
        if f == "gemma3":
            self.q_norm = GemmaRMSNorm(hd)
            self.k_norm = GemmaRMSNorm(hd)

    def forward(self, x, position_embeddings, mask):
        input_shape = x.shape[:-1]
        hidden_shape = (*input_shape, -1, self.hd)
        if self.family == "phi3":
            qkv = self.qkv_proj(x)
            qp, kvp = self.heads * self.hd, self.kvh * self.hd
            q = qkv[..., :qp].view(hidden_shape).transpose(1, 2)
            k = qkv[..., qp: qp + kvp].view(hidden_shape).transpose(1, 2)
            v = qkv[..., qp + kvp:].view(hidden_shape).transpose(1, 2)
        elif self.family == "qwen3_moe":
            q = self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)
            k = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
            v = self.v_proj(x).view(hidden_shape).transpose(1, 2)
        else:
            q = self.q_proj(x).view(hidden_shape).transpose(1, 2)
            k = self.k_proj(x).view(hidden_shape).transpose(1, 2)
            v = self.v_proj(x).view(hidden_shape).transpose(1, 2)
            if self.family == "gemma3":
                q = self.q_norm(q)
                k = self.k_norm(k)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        out = eager_attention(self, q, k, v, mask, self.scaling, self.softcap)
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out)


class GatedMLP(nn.Module):
    """LlamaMLP (Qwen's experts and shared expert), Gemma's with gelu tanh, or Phi-3's fused gate_up_proj."""

    def __init__(self, c, ffn):
        super().__init__()
        self.family, d = c["family"], c["d"]
        if self.family == "phi3":
            self.gate_up_proj = Linear(d, 2 * ffn, bias=False)
        else:
            self.gate_proj = Linear(d, ffn, bias=False)
            self.up_proj = Linear(d, ffn, bias=False)
        self.down_proj = Linear(ffn, d, bias=False)

    def act(self, x):
        if self.family in ("gemma2", "gemma3"):
            return F.gelu(x, approximate="tanh")
        return F.silu(x)

    def forward(self, x):
        if self.family == "phi3":
            up_states = self.gate_up_proj(x)
            gate, up_states = up_states.chunk(2, dim=-1)
            return self.down_proj(up_states * self.act(gate))
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class MixtralExpert(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w1 = Linear(c["d"], c["ffn"], bias=False)
        self.w2 = Linear(c["ffn"], c["d"], bias=False)
        self.w3 = Linear(c["d"], c["ffn"], bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):
    """MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock and Qwen3MoeSparseMoeBlock of transformers 4.51."""

    def __init__(self, c, layer):
        super().__init__()
        f = c["family"]
        self.family, self.layer, self.c = f, layer, c
        self.num_experts, self.top_k = c["experts"], c["topk"]
        self.norm_topk_prob = f == "mixtral" or c.get("norm_topk", False)
        self.gate = Linear(c["d"], self.num_experts, bias=False)
        if f == "mixtral":
            self.experts = nn.ModuleList([MixtralExpert(c) for _ in range(self.num_experts)])
        else:
            self.experts = nn.ModuleList([GatedMLP(c, c["moe_ffn"]) for _ in range(self.num_experts)])
        if f == "qwen2_moe":
            self.shared_expert = GatedMLP(c, c["shared_ffn"])
            self.shared_expert_gate = Linear(c["d"], 1, bias=False)

    def forward(self, hidden_states):
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        if self.norm_topk_prob:
            routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        selected_experts = torch.tensor(self.c["routing"][self.layer], dtype=torch.long)  # the test's routing
        final_hidden_states = torch.zeros((batch_size * sequence_length, hidden_dim), dtype=hidden_states.dtype)
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        for expert_idx in range(self.num_experts):
            expert_layer = self.experts[expert_idx]
            idx, top_x = torch.where(expert_mask[expert_idx])
            current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)
            current_hidden_states = expert_layer(current_state) * routing_weights[top_x, idx, None]
            final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))
        if self.family == "qwen2_moe":
            shared_expert_output = self.shared_expert(hidden_states)
            shared_expert_output = torch.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output
            final_hidden_states = final_hidden_states + shared_expert_output
        final_hidden_states = final_hidden_states.reshape(batch_size, sequence_length, hidden_dim)
        return final_hidden_states, router_logits


def is_sliding(c, layer):
    if c["family"] == "gemma2":
        return not bool(layer % 2)
    if c["family"] == "gemma3":
        return bool((layer + 1) % c["sliding_pattern"])
    return False


class DecoderLayer(nn.Module):
    def __init__(self, c, layer):
        super().__init__()
        f, d = c["family"], c["d"]
        self.c, self.family, self.layer = c, f, layer
        self.sliding = is_sliding(c, layer)
        self.self_attn = Attention(c, layer)
        self.input_layernorm = norm(c, d)
        self.post_attention_layernorm = norm(c, d)
        if f in ("mixtral",):
            self.block_sparse_moe = SparseMoeBlock(c, layer)
        elif f in ("qwen2_moe", "qwen3_moe"):
            self.mlp = SparseMoeBlock(c, layer)
        else:
            self.mlp = GatedMLP(c, c["ffn"])
        if f in ("gemma2", "gemma3"):
            self.pre_feedforward_layernorm = norm(c, d)
            self.post_feedforward_layernorm = norm(c, d)
        self.resid_pdrop = c.get("dropout", 0.0) if f == "phi3" else 0.0

    def sliding_mask(self, attention_mask, cache_position):
        """Gemma2DecoderLayer's mask for a sliding layer (eager and sdpa): the window's far past masked too."""
        window = self.c["sliding_window"]
        effective_seq_len = max(cache_position.shape[0], window)
        min_dtype = torch.finfo(attention_mask.dtype).min
        sliding_window_mask = torch.tril(torch.ones_like(attention_mask, dtype=torch.bool), diagonal=-window)
        attention_mask = torch.where(sliding_window_mask, min_dtype, attention_mask)
        offset = cache_position[-1] - effective_seq_len + 1
        offset = torch.clamp(offset, min=0)
        mask_indexes = torch.arange(min(effective_seq_len, attention_mask.shape[-1]))
        mask_indexes += offset
        return attention_mask[:, :, :, mask_indexes]

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None,
                output_attentions=False, use_cache=False, cache_position=None, position_embeddings=None,
                position_embeddings_local=None):
        f = self.family
        if self.sliding and attention_mask is not None:
            attention_mask = self.sliding_mask(attention_mask, cache_position)
        if f == "gemma3" and self.sliding:
            position_embeddings = position_embeddings_local
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, position_embeddings, attention_mask)
        if f in ("gemma2", "gemma3"):
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states = residual + hidden_states
            residual = hidden_states
            hidden_states = self.pre_feedforward_layernorm(hidden_states)
            hidden_states = self.mlp(hidden_states)
            hidden_states = self.post_feedforward_layernorm(hidden_states)
            return residual + hidden_states, None
        hidden_states = residual + dropout(hidden_states, self.resid_pdrop, self.training)
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        router_logits = None
        if f == "mixtral":
            hidden_states, router_logits = self.block_sparse_moe(hidden_states)
        elif f in ("qwen2_moe", "qwen3_moe"):
            hidden_states, router_logits = self.mlp(hidden_states)
        else:
            hidden_states = self.mlp(hidden_states)
        if not self.c.get("aux"):  # output_router_logits off: the layer does not return them
            router_logits = None
        hidden_states = residual + dropout(hidden_states, self.resid_pdrop, self.training)
        return hidden_states, router_logits


def llama_mask(seq, target, dtype, cache_position, batch):
    """LlamaModel._prepare_4d_causal_attention_mask_with_cache_position without an attention mask."""
    causal_mask = torch.full((seq, target), fill_value=torch.finfo(dtype).min, dtype=dtype)
    causal_mask = torch.triu(causal_mask, diagonal=1)
    causal_mask *= torch.arange(target) > cache_position.reshape(-1, 1)
    return causal_mask[None, None, :, :].expand(batch, 1, -1, -1)


def mistral_mask(seq, target, dtype, cache_position, batch, sliding_window):
    """MistralModel's: the diagonal mask or'ed with the positions beyond the sliding window."""
    causal_mask = torch.full((seq, target), fill_value=torch.finfo(dtype).min, dtype=dtype)
    diagonal_attend_mask = torch.arange(target) > cache_position.reshape(-1, 1)
    if sliding_window is not None:
        sliding_attend_mask = torch.arange(target) <= (cache_position.reshape(-1, 1) - sliding_window)
        diagonal_attend_mask.bitwise_or_(sliding_attend_mask)
    causal_mask *= diagonal_attend_mask
    return causal_mask[None, None, :, :].expand(batch, 1, -1, -1)


def load_balancing_loss_func(gate_logits, num_experts, top_k):
    concatenated_gate_logits = torch.cat(list(gate_logits), dim=0)
    routing_weights = F.softmax(concatenated_gate_logits, dim=-1, dtype=torch.float32 if AMP else None)  # CUDA's
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = F.one_hot(selected_experts, num_experts)
    tokens_per_expert = torch.mean(expert_mask.float(), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    overall_loss = torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0))
    return overall_loss * num_experts


class DecoderModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        f, hd = c["family"], head_dim(c)
        self.c, self.family = c, f
        self.embed_tokens = Embedding(c["vocab"], c["d"])
        self.layers = nn.ModuleList([DecoderLayer(c, i) for i in range(c["layers"])])
        self.norm = norm(c, c["d"])
        theta = {"gemma3": 1e6}.get(f, 10000.0)
        self.rotary_emb = LlamaRotaryEmbedding(hd, theta, DEV)
        if f == "gemma3":
            self.rotary_emb_local = LlamaRotaryEmbedding(hd, 10000.0, DEV)
            self.register_buffer("embed_scale", torch.tensor(c["d"] ** 0.5, device=DEV), persistent=False)
        self.gradient_checkpointing = False

    def forward(self, input_ids):
        c, f = self.c, self.family
        inputs_embeds = self.embed_tokens(input_ids)
        if f == "gemma3":  # Gemma3TextScaledWordEmbedding
            inputs_embeds = inputs_embeds * self.embed_scale.to(self.embed_tokens.weight.dtype)
            for hook in self.scaled_hooks:
                hook(inputs_embeds)
        b, t = inputs_embeds.shape[:2]
        cache_position = torch.arange(0, t)
        position_ids = cache_position.unsqueeze(0)
        dtype = inputs_embeds.dtype
        if f in ("gemma2", "gemma3"):
            causal_mask = llama_mask(t, t, dtype, cache_position, b)
        elif f in ("mixtral", "qwen2_moe", "qwen3_moe", "phi3"):
            causal_mask = mistral_mask(t, t + 1, dtype, cache_position, b, c.get("sliding_window"))
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        position_embeddings_local = None
        if f == "gemma3":
            position_embeddings_local = self.rotary_emb_local(hidden_states, position_ids)
        if f == "gemma2":
            normalizer = torch.tensor(c["d"] ** 0.5, dtype=hidden_states.dtype)
            HOST.add(normalizer.storage().data_ptr())  # made without a device: on a GPU, a host scalar
            hidden_states = hidden_states * normalizer
        all_router_logits = ()
        for layer in self.layers:
            args = (hidden_states, causal_mask, position_ids, None, False, False, cache_position,
                    position_embeddings, position_embeddings_local)
            if self.gradient_checkpointing and self.training:
                hidden_states, router_logits = checkpoint(layer.__call__, *args, use_reentrant=True)
            else:
                hidden_states, router_logits = layer(*args)
            if router_logits is not None and c.get("aux"):
                all_router_logits += (router_logits,)
        return self.norm(hidden_states), all_router_logits


class DecoderForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = DecoderModel(c)
        self.model.scaled_hooks = []
        self.lm_head = Linear(c["d"], c["vocab"], bias=False)
        if c["tied"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, labels):
        c = self.c
        hidden_states, router_logits = self.model(input_ids)
        logits = self.lm_head(hidden_states[:, slice(0, None), :])
        if c["family"] == "gemma2" and c.get("final_softcap"):
            logits = logits / c["final_softcap"]
            logits = torch.tanh(logits)
            logits = logits * c["final_softcap"]
        loss = ForCausalLMLoss(logits, labels, c["vocab"])
        if router_logits:
            aux_loss = load_balancing_loss_func(router_logits, c["experts"], c["topk"])
            loss += c["aux"] * aux_loss
        return loss, logits


class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d"]
        self.word_embeddings = Embedding(c["vocab"], d, padding_idx=0)
        self.position_embeddings = Embedding(c["max_pos"], d)
        self.token_type_embeddings = Embedding(c["type_vocab"], d)
        self.LayerNorm = LayerNorm(d, eps=1e-12)
        self.p = c.get("dropout", 0.0)
        self.register_buffer("position_ids", torch.arange(c["max_pos"], device=DEV).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(self.position_ids.size(), dtype=torch.long, device=DEV),
                             persistent=False)

    def forward(self, input_ids):
        b, t = input_ids.shape
        position_ids = self.position_ids[:, 0:t]
        token_type_ids = self.token_type_ids[:, :t].expand(b, t)
        inputs_embeds = self.word_embeddings(input_ids)
        token_type_embeddings = self.token_type_embeddings(token_type_ids)
        embeddings = inputs_embeds + token_type_embeddings
        embeddings += self.position_embeddings(position_ids)
        embeddings = self.LayerNorm(embeddings)
        return dropout(embeddings, self.p, self.training)


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d"]
        self.heads, self.hd = c["heads"], d // c["heads"]
        self.query = Linear(d, d)
        self.key = Linear(d, d)
        self.value = Linear(d, d)
        self.p = c.get("dropout", 0.0)

    def transpose_for_scores(self, x):
        return x.view(x.size()[:-1] + (self.heads, self.hd)).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        mixed_query_layer = self.query(hidden_states)
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        query_layer = self.transpose_for_scores(mixed_query_layer)
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.hd)
        attention_scores = attention_scores + attention_mask
        attention_probs = F.softmax(attention_scores, dim=-1, dtype=torch.float32 if AMP else None)  # CUDA's call
        attention_probs = dropout(attention_probs, self.p, self.training)
        context_layer = torch.matmul(attention_probs, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        return context_layer.view(context_layer.size()[:-2] + (self.heads * self.hd,))


class BertSelfOutput(nn.Module):
    def __init__(self, c, inner):
        super().__init__()
        self.dense = Linear(inner, c["d"])
        self.LayerNorm = LayerNorm(c["d"], eps=1e-12)
        self.p = c.get("dropout", 0.0)

    def forward(self, hidden_states, input_tensor):
        hidden_states = dropout(self.dense(hidden_states), self.p, self.training)
        return self.LayerNorm(hidden_states + input_tensor)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertSelfOutput(c, c["d"])

    def forward(self, hidden_states, attention_mask):
        return self.output(self.self(hidden_states, attention_mask), hidden_states)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = Linear(c["d"], c["ffn"])

    def forward(self, x):
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertSelfOutput(c, c["ffn"])  # BertOutput has BertSelfOutput's shape from ffn

    def forward(self, hidden_states, attention_mask=None, head_mask=None, encoder_hidden_states=None,
                encoder_attention_mask=None, past_key_value=None, output_attentions=False):
        attention_output = self.attention(hidden_states, attention_mask)
        return self.output(self.intermediate(attention_output), attention_output)


class BertModel(nn.Module):
    def __init__(self, c, pooler):
        super().__init__()
        self.c = c
        self.embeddings = BertEmbeddings(c)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList([BertLayer(c) for _ in range(c["layers"])])
        if pooler:
            self.pooler = nn.Module()
            self.pooler.dense = Linear(c["d"], c["d"])
        self.gradient_checkpointing = False

    def forward(self, input_ids, attention_mask):
        embedding_output = self.embeddings(input_ids)
        dtype = self.embeddings.word_embeddings.weight.dtype
        extended = attention_mask[:, None, None, :].to(dtype=dtype)
        extended = (1.0 - extended) * torch.finfo(dtype).min
        hidden_states = embedding_output
        for layer in self.encoder.layer:
            if self.gradient_checkpointing and self.training:
                hidden_states = checkpoint(layer.__call__, hidden_states, extended, None, None, None, None, False,
                                           use_reentrant=True)
            else:
                hidden_states = layer(hidden_states, extended)
        pooled = None
        if hasattr(self, "pooler"):
            pooled = torch.tanh(self.pooler.dense(hidden_states[:, 0]))
        return hidden_states, pooled


class BertForTask(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d = c["d"]
        self.bert = BertModel(c, pooler=c["task"] == "classify")
        if c["task"] == "mlm":
            self.cls = nn.Module()
            self.cls.predictions = nn.Module()
            p = self.cls.predictions
            p.transform = nn.Module()
            p.transform.dense = Linear(d, d)
            p.transform.LayerNorm = LayerNorm(d, eps=1e-12)
            p.decoder = Linear(d, c["vocab"], bias=False)
            p.bias = nn.Parameter(torch.zeros(c["vocab"], device=DEV))
            p.decoder.bias = p.bias
            p.decoder.weight = self.bert.embeddings.word_embeddings.weight
        else:
            self.classifier = Linear(d, c["labels"])

    def head(self):
        return self.classifier

    def forward(self, input_ids, attention_mask, labels):
        c = self.c
        sequence_output, pooled = self.bert(input_ids, attention_mask)
        if c["task"] == "mlm":
            p = self.cls.predictions
            h = F.gelu(p.transform.dense(sequence_output))
            h = p.transform.LayerNorm(h)
            scores = p.decoder(h).view(-1, c["vocab"])
            targets = labels.view(-1)
        else:
            pooled = dropout(pooled, c.get("dropout", 0.0), self.training)
            scores = self.head()(pooled).view(-1, c["labels"])
            targets = labels.view(-1)
        if AMP:  # CUDA autocast's cross_entropy: log_softmax in the logits' dtype, then nll_loss
            return F.nll_loss(F.log_softmax(scores, 1, dtype=scores.dtype), targets)
        return F.cross_entropy(scores, targets)


# The layer-relative module each LoRA target short name adapts, per family.
TARGETS = {
    "mixtral": {"q": ["self_attn.q_proj"], "k": ["self_attn.k_proj"], "v": ["self_attn.v_proj"],
                "o": ["self_attn.o_proj"], "gate": ["block_sparse_moe.experts.*.w1"],
                "up": ["block_sparse_moe.experts.*.w3"], "down": ["block_sparse_moe.experts.*.w2"]},
    "qwen2_moe": {"q": ["self_attn.q_proj"], "k": ["self_attn.k_proj"], "v": ["self_attn.v_proj"],
                  "o": ["self_attn.o_proj"], "gate": ["mlp.experts.*.gate_proj", "mlp.shared_expert.gate_proj"],
                  "up": ["mlp.experts.*.up_proj", "mlp.shared_expert.up_proj"],
                  "down": ["mlp.experts.*.down_proj", "mlp.shared_expert.down_proj"]},
    "qwen3_moe": {"q": ["self_attn.q_proj"], "k": ["self_attn.k_proj"], "v": ["self_attn.v_proj"],
                  "o": ["self_attn.o_proj"], "gate": ["mlp.experts.*.gate_proj"], "up": ["mlp.experts.*.up_proj"],
                  "down": ["mlp.experts.*.down_proj"]},
    "gemma": {"q": ["self_attn.q_proj"], "k": ["self_attn.k_proj"], "v": ["self_attn.v_proj"],
              "o": ["self_attn.o_proj"], "gate": ["mlp.gate_proj"], "up": ["mlp.up_proj"], "down": ["mlp.down_proj"]},
    "phi3": {"qkv": ["self_attn.qkv_proj"], "o": ["self_attn.o_proj"], "gate_up": ["mlp.gate_up_proj"],
             "down": ["mlp.down_proj"]},
    "bert": {"q": ["attention.self.query"], "k": ["attention.self.key"], "v": ["attention.self.value"],
             "o": ["attention.output.dense"], "up": ["intermediate.dense"], "down": ["output.dense"]},
}


def resolve(root, path):
    """The modules at a dotted path, "*" standing for every child."""
    mods = [(None, None, root)]
    for part in path.split("."):
        nxt = []
        for _, _, m in mods:
            names = [n for n, _ in m.named_children()] if part == "*" else [part]
            nxt += [(m, n, getattr(m, n)) for n in names]
        mods = nxt
    return mods


def apply_lora(model, c, device=None):
    """get_peft_model: adapters on the targets (float32), everything else frozen; a classifier is trained as a
    copy (modules_to_save), the original kept frozen beside it."""
    for p in model.parameters():
        p.requires_grad_(False)
    lora = c["lora"]
    family = "gemma" if c["family"] in ("gemma2", "gemma3") else c["family"]
    layers = model.bert.encoder.layer if family == "bert" else model.model.layers
    for layer in layers:
        for t in lora["targets"]:
            for path in TARGETS[family][t]:
                for parent, name, mod in resolve(layer, path):
                    setattr(parent, name, LoraLinear(mod, lora["r"], lora["alpha"], device))
    if family == "bert" and c["task"] == "classify":
        trained = copy.deepcopy(model.classifier)
        for p in trained.parameters():
            p.requires_grad_(True)
        model.classifier_copy = trained
        model.head = lambda: model.classifier_copy


def build(c, device=None):
    global DEV
    DEV = device
    torch.manual_seed(0)
    model = BertForTask(c) if c["family"] == "bert" else DecoderForCausalLM(c)
    if c.get("dtype") == "bf16":
        model = model.to(torch.bfloat16)
    if c.get("lora"):
        apply_lora(model, c, device)
    return model


AMP = False
HOST = set()  # storages that live on the host when the model is on a GPU: not device memory


def saved_bytes(c):
    global AMP
    AMP = c.get("amp") == "bf16"
    HOST.clear()
    model = build(c)
    model.train()
    ckpt = c.get("checkpoint")
    bert = c["family"] == "bert"
    inner = model.bert if bert else model.model
    if ckpt:
        inner.gradient_checkpointing = True
        if c.get("lora"):  # enable_input_require_grads: the input embeddings' module's output
            hook = lambda m, i, o: o.requires_grad_(True)
            if bert:
                model.bert.embeddings.word_embeddings.register_forward_hook(hook)
            elif c["family"] == "gemma3":
                model.model.scaled_hooks.append(lambda o: o.requires_grad_(True))
            else:
                model.model.embed_tokens.register_forward_hook(hook)
    state = {t.storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen, held = {}, {}

    def pack(t):
        st = t.storage()
        wrapped = t.dim() == 0 and t.dtype in (torch.float64, torch.int64)  # a Python number: a host scalar on a GPU
        if st.data_ptr() not in state and st.data_ptr() not in HOST and not wrapped:
            seen[st.data_ptr()] = st.nbytes()
            held.setdefault(st.data_ptr(), []).append(weakref.ref(t))
        return t

    torch.manual_seed(1)
    b, t = c["batch"], c["seq"]
    idx = torch.randint(0, c["vocab"], (b, t))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=AMP):
        if bert:
            lengths = c.get("lengths") or [t] * b
            mask = torch.tensor([[1 if j < n else 0 for j in range(t)] for n in lengths], dtype=torch.long)
            labels = idx if c["task"] == "mlm" else torch.randint(0, c["labels"], (b,))
            loss = model(idx, mask, labels)
        else:
            loss, logits = model(idx, idx)
    mean_only = saved_only_by_mean(loss.grad_fn)
    if mean_only:
        print(f"{c['family']}: left out {sum(seen[p] for p in mean_only)} bytes 1.13's MeanBackward1 saves",
              file=sys.stderr)
    # What a node saved counts while the node lives: the auxiliary loss's top-k saves its indices, and the node
    # goes with the values nobody uses when load_balancing_loss_func returns.
    alive = {p for p, refs in held.items() if any(r() is not None for r in refs)}
    loss.backward()
    return sum(n for p, n in seen.items() if p not in mean_only and p in alive)


def count(c):
    model = build(c, device="meta")
    params = list(model.parameters())  # each parameter once, tied weights included once
    return [sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)]


if __name__ == "__main__":
    mode, cases = sys.argv[1], json.loads(sys.argv[2])
    if mode == "saved":
        check_cpu_autocast()
        print(json.dumps([saved_bytes(c) for c in cases]))
    elif mode == "count":
        print(json.dumps([count(c) for c in cases]))
    else:
        raise SystemExit(f"unknown mode {mode}")
