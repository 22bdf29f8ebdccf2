# What the libraries a fine-tune runs on keep for backward, as their sources write it, on the Llama of
# llama.py: transformers' three generations of the causal-LM loss (the in-model loss before 4.46, ForCausalLMLoss
# as first written in 4.46, the label shift of 4.49), torchtune's chunked output and CEWithChunkedOutputLoss and
# its LinearCrossEntropyLoss (modules/loss/cross_entropy_loss.py),
# Liger's fused linear cross-entropy, bitsandbytes' Linear4bit and MatMul4Bit (autograd/_functions.py, before
# and after 0.43.2's #1270: ctx.tensors = (A, B) or (None, B); nn/modules.py Linear4bit.forward), with the
# QuantState sizes of functional.py quantize_4bit (double quantization, quant_storage), peft's bnb LoRA
# Linear4bit, LoRA on lm_head and peft's lora.Embedding, and prepare_model_for_kbit_training's cast. Neither
# bitsandbytes nor peft nor transformers is imported: the 4-bit weights' values do not matter to what is kept,
# so dequantization makes a zero weight of the right dtype and shape.
#
# Modes, each reading a JSON list of cases from the second argument and printing a JSON list:
#   saved    [bytes saved for backward (saved_tensors_hooks, once per storage, parameters and buffers left out,
#            MeanBackward1's own storages left out unless the case says torch113), bytes held in ctx attributes
#            and nowhere else (MatMul4Bit's ctx.tensors), bytes of those still held after backward while the
#            graph is alive] for each case
#   quant    [bytes of the 4-bit weights' storage and quant state, bytes of the other parameters] for each case
#   mean     whether this PyTorch's MeanBackward1 saves its input (_saved_self), printed once
#
# A case is llama.py's (batch, seq, d, heads, kv_heads, layers, vocab, ffn, tied, amp, dtype, checkpoint, lora
# with targets that may include lm_head and embed), plus: loss ("in-model", "shift-logits", "shift-labels",
# "chunked:T", "linear-ce:N", "fused"), num_items (bool: reduction="sum" divided by the labels counted), qlora (null or
# {bnb: "0.43.1" or "0.43.2", double_quant, storage: "uint8", "bf16" or "f32", kbit_prep}), lora_dtype ("f32",
# "bf16"), torch113 (count MeanBackward1's storages).
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import llama

# The 0-dim integer tensors the losses compute on the device (torchtune's mask.sum()), which saved-tensor
# packing must not take for Python numbers; kept alive, so that no other tensor reuses their storage.
DEVICE_SCALARS = []

STORAGE = {"uint8": torch.uint8, "bf16": torch.bfloat16, "f32": torch.float32}


class QuantState:
    """QuantState as quantize_4bit(A, blocksize=64, compress_statistics, quant_type="nf4") fills it."""

    def __init__(self, module, shape, dtype, double_quant):
        n = shape[0] * shape[1]
        blocks = -(n // -64)
        self.shape, self.dtype, self.nested = shape, dtype, double_quant
        module.register_buffer("code", torch.zeros(16, dtype=torch.float32))
        if double_quant:
            module.register_buffer("absmax", torch.zeros(blocks, dtype=torch.uint8))
            module.register_buffer("absmax2", torch.zeros(-(blocks // -256), dtype=torch.float32))
            module.register_buffer("code2", torch.zeros(256, dtype=torch.float32))
            module.register_buffer("offset", torch.zeros((), dtype=torch.float32))
        else:
            module.register_buffer("absmax", torch.zeros(blocks, dtype=torch.float32))
        self.module = module

    def dequantize(self):
        """dequantize_4bit: the nested absmax dequantized (and the offset added) into float32 temporaries,
        then the weight in the state's dtype."""
        if self.nested:
            absmax = torch.zeros(self.module.absmax.shape, dtype=torch.float32)
            absmax = absmax + self.module.offset
            del absmax
        return torch.zeros(self.shape, dtype=self.dtype)


class MatMul4Bit(torch.autograd.Function):
    keep_input = True  # bitsandbytes before 0.43.2

    @staticmethod
    def forward(ctx, A, B, quant_state):
        output = F.linear(A, quant_state.dequantize().to(A.dtype))
        ctx.state = quant_state
        if any(ctx.needs_input_grad[:2]):
            ctx.tensors = (A, B) if MatMul4Bit.keep_input else (None, B)
        else:
            ctx.tensors = (None, None)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        _, B = ctx.tensors
        grad_A = torch.matmul(grad_output, ctx.state.dequantize().to(grad_output.dtype))
        return grad_A, None, None


class Linear4bit(nn.Module):
    """bnb.nn.Linear4bit: the packed weight (quant_storage) and its state, computing in bfloat16."""

    def __init__(self, base, q):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        n = base.weight.numel()
        item = torch.tensor([], dtype=STORAGE[q["storage"]]).element_size()
        self.register_buffer("weight", torch.zeros(((n + 1) // (2 * item), 1), dtype=STORAGE[q["storage"]]))
        self.quant_state = QuantState(self, tuple(base.weight.shape), base.weight.dtype, q["double_quant"])

    def forward(self, x):
        inp_dtype = x.dtype
        x = x.to(torch.bfloat16)
        return MatMul4Bit.apply(x, self.weight, self.quant_state).to(inp_dtype)


class LoraLinear4bit(llama.LoraLinear):
    """peft's lora/bnb.py Linear4bit.forward: the base result cloned; casts only without (CUDA, here CPU)
    autocast."""

    def forward(self, x):
        result = self.base_layer(x).clone()
        lora_A, lora_B = self.lora_A["default"], self.lora_B["default"]
        requires_conversion = not torch.is_autocast_cpu_enabled()
        if requires_conversion:
            expected_dtype = result.dtype
            x = x.to(lora_A.weight.dtype)
        output = lora_B(lora_A(self.lora_dropout["default"](x))) * self.scaling["default"]
        if requires_conversion:
            output = output.to(expected_dtype)
        return result + output


class LoraEmbedding(nn.Module):
    """peft's lora.Embedding: lora_embedding_A (r, num) zeros, lora_embedding_B (dim, r)."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base_layer = base
        self.lora_embedding_A = nn.ParameterDict({"default": nn.Parameter(torch.zeros(r, base.num_embeddings))})
        self.lora_embedding_B = nn.ParameterDict({"default": nn.Parameter(torch.randn(base.embedding_dim, r))})
        self.scaling = alpha / r

    def forward(self, x):
        result = self.base_layer(x)
        torch_result_dtype = result.dtype
        after_A = F.embedding(x, self.lora_embedding_A["default"].T)
        result = result + (after_A @ self.lora_embedding_B["default"].T) * self.scaling
        return result.to(torch_result_dtype)


def build(c):
    torch.manual_seed(0)
    model = llama.LlamaForCausalLM(c)
    if c.get("dtype") == "bf16":
        model = model.to(torch.bfloat16)
    q = c.get("qlora")
    if q:
        for layer in model.model.layers:
            for t in llama.TARGETS.values():
                parent_name, child = t.split(".")
                parent = getattr(layer, parent_name)
                setattr(parent, child, Linear4bit(getattr(parent, child), q))
        if q.get("kbit_prep"):  # prepare_model_for_kbit_training: 16-bit parameters that are not 4-bit to fp32
            for p in model.parameters():
                if p.dtype in (torch.float16, torch.bfloat16):
                    p.data = p.data.to(torch.float32)
    lora = c.get("lora")
    if lora:
        for p in model.parameters():
            p.requires_grad_(False)
        dtype = torch.bfloat16 if c.get("lora_dtype") == "bf16" else torch.float32
        for layer in model.model.layers:
            for t in lora["targets"]:
                if t in ("lm_head", "embed"):
                    continue
                parent_name, child = llama.TARGETS[t].split(".")
                parent = getattr(layer, parent_name)
                cls = LoraLinear4bit if q else llama.LoraLinear
                m = cls(getattr(parent, child), lora["r"], lora["alpha"])
                m.lora_A.to(dtype), m.lora_B.to(dtype)
                setattr(parent, child, m)
        if "lm_head" in lora["targets"]:
            model.lm_head = llama.LoraLinear(model.lm_head, lora["r"], lora["alpha"])
            model.lm_head.lora_A.to(dtype), model.lm_head.lora_B.to(dtype)
        if "embed" in lora["targets"]:
            model.model.embed_tokens = LoraEmbedding(model.model.embed_tokens, lora["r"], lora["alpha"])
            model.model.embed_tokens.lora_embedding_A.to(dtype), model.model.embed_tokens.lora_embedding_B.to(dtype)
    return model


def shift_labels(labels):
    return F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()


def cross_entropy(logits, labels, num_items):
    if num_items:  # fixed_cross_entropy: reduction="sum", divided by num_items_in_batch
        return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / int((labels != -100).sum())
    return F.cross_entropy(logits, labels, ignore_index=-100)


def loss_of(model, c, hidden, labels):
    """The loss of the case from the final hidden states; returns (loss, what the output keeps)."""
    kind, v, n = c.get("loss", "shift-labels"), c["vocab"], c.get("num_items", False)
    head = model.lm_head
    if kind == "in-model":  # LlamaForCausalLM.forward before transformers 4.46
        logits = head(hidden).float()
        shift_logits = logits[..., :-1, :].contiguous()
        shift = labels[..., 1:].contiguous()
        return F.cross_entropy(shift_logits.view(-1, v), shift.view(-1)), logits
    if kind == "shift-logits":  # ForCausalLMLoss of 4.46-4.48
        logits = head(hidden)
        lf = logits.float()
        shift_logits = lf[..., :-1, :].contiguous()
        shift = labels[..., 1:].contiguous()
        return cross_entropy(shift_logits.view(-1, v), shift.view(-1), n), logits
    if kind == "shift-labels":  # ForCausalLMLoss from 4.49
        logits = head(hidden)
        return cross_entropy(logits.float().view(-1, v), shift_labels(labels).view(-1), n), logits
    if kind.startswith("chunked:"):  # torchtune: chunked output, CEWithChunkedOutputLoss
        t = int(kind.split(":")[1])
        chunks = [head(h) for h in hidden.split(t, dim=1)]
        shifted = shift_labels(labels)
        total = 0
        for lc, tc in zip(chunks, shifted.split(t, dim=1)):
            total = total + F.cross_entropy(lc.reshape(-1, v).float(), tc.reshape(-1), ignore_index=-100,
                                            reduction="sum")
        return total / int((shifted != -100).sum()), None
    if kind.startswith("linear-ce:"):  # torchtune: LinearCrossEntropyLoss, the output layer skipped
        chunks = int(kind.split(":")[1])
        targets = shift_labels(labels)
        mask = targets != -100
        total_elements = mask.sum()
        DEVICE_SCALARS.append(total_elements)
        total_loss = 0.0
        for hc, tc in zip(hidden.tensor_split(chunks, dim=1), targets.tensor_split(chunks, dim=1)):
            mask_chunk = tc != -100
            if mask_chunk.sum() == 0:
                mask_chunk[0] = True
            tc = tc[mask_chunk]
            logits = head(hc[mask_chunk])
            total_loss += F.cross_entropy(logits.float(), tc, reduction="sum", ignore_index=-100)
        return total_loss / total_elements, None
    if kind == "fused":
        return fused_linear_ce(hidden.reshape(-1, hidden.shape[-1]), head.weight, shift_labels(labels).view(-1)), None
    raise SystemExit(f"unknown loss {kind}")


class FusedLinearCE(torch.autograd.Function):
    """Liger's fused_linear_cross_entropy_forward, mean reduction: grad_input (and grad_weight when the weight
    trains) computed in the forward chunk by chunk and saved."""

    @staticmethod
    def forward(ctx, x, weight, target):
        bt, h = x.shape
        v = weight.shape[0]
        inc_factor = -(v // -h)
        rows = -(bt // -inc_factor)
        chunk_size = 1 if rows <= 1 else 1 << (rows - 1).bit_length()
        grad_input = torch.zeros_like(x)
        grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
        loss_1d = torch.zeros(bt, dtype=torch.float32)
        target_mask = target != -100
        n_non_ignore = int(target_mask.sum())
        del target_mask
        for start in range(0, bt, chunk_size):
            end = min(start + chunk_size, bt)
            logits_chunk = (x[start:end] @ weight.t()).contiguous()
            lf = logits_chunk.float()
            lse = torch.logsumexp(lf, -1)
            t = target[start:end]
            ok = t != -100
            picked = lf.gather(1, t.clamp(min=0)[:, None])[:, 0]
            loss_1d[start:end] = torch.where(ok, (lse - picked) / n_non_ignore, torch.zeros_like(lse))
            g = torch.softmax(lf, -1)
            g[torch.arange(end - start), t.clamp(min=0)] -= 1
            g = torch.where(ok[:, None], g / n_non_ignore, torch.zeros_like(g))
            logits_chunk.copy_(g)  # the kernel writes the gradient over the logits
            del lf, g
            grad_input[start:end] = logits_chunk @ weight
            if grad_weight is not None:
                torch.addmm(grad_weight, logits_chunk.t(), x[start:end].detach(), out=grad_weight)
        ctx.save_for_backward(grad_input.detach(), grad_weight.detach() if grad_weight is not None else None)
        return torch.sum(loss_1d)

    @staticmethod
    def backward(ctx, grad_output):
        grad_input, grad_weight = ctx.saved_tensors
        if not torch.equal(grad_output, torch.tensor(1.0, device=grad_output.device)):
            grad_input.mul_(grad_output)
            if grad_weight is not None:
                grad_weight.mul_(grad_output)
        return grad_input, grad_weight, None


def fused_linear_ce(x, weight, target):
    if weight.dtype != x.dtype:  # autocast's cast of a float32 lm_head
        weight = weight.to(x.dtype)
    return FusedLinearCE.apply(x, weight, target)


def saved(c):
    MatMul4Bit.keep_input = (c.get("qlora") or {}).get("bnb", "0.43.2") == "0.43.1"
    model = build(c)
    model.train()
    if c.get("checkpoint"):
        model.model.gradient_checkpointing = True
        if c.get("lora"):
            model.model.embed_tokens.register_forward_hook(lambda m, i, o: o.requires_grad_(True))
    state = {t.storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen = {}

    def pack(t):
        st = t.storage()
        # a Python number wrapped as a 0-dim float64 or int64 tensor (loss / num_items_in_batch) lives on the
        # host, not the device; a 0-dim tensor a loss computed (DEVICE_SCALARS) lives on the device
        wrapped = t.dim() == 0 and t.dtype in (torch.float64, torch.int64) and \
            all(st.data_ptr() != d.data_ptr() for d in DEVICE_SCALARS)
        if st.data_ptr() not in state and not wrapped:
            seen[st.data_ptr()] = st.nbytes()
        return t

    idx = torch.randint(0, c["vocab"], (c["batch"], c["seq"]))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=c.get("amp") == "bf16"):
        hidden = model.model(idx)
        loss, kept = loss_of(model, c, hidden, idx)
        del hidden, kept
    mean_only = set() if c.get("torch113") else llama.saved_only_by_mean(loss.grad_fn)
    held = ctx_held(loss.grad_fn, state | set(seen))
    saved_bytes = sum(n for p, n in seen.items() if p not in mean_only)
    loss.backward()
    after = ctx_held(loss.grad_fn, state)  # the graph lives while loss does: its ctx attributes with it
    return [saved_bytes, sum(held.values()), sum(after.values())]


def ctx_held(root, exclude):
    """Storages held in MatMul4Bit's ctx.tensors and not in exclude."""
    held, stack, visited = {}, [root], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in visited:
            continue
        visited.add(fn)
        for t in getattr(fn, "tensors", ()) or ():
            if isinstance(t, torch.Tensor) and t.storage().data_ptr() not in exclude:
                held[t.storage().data_ptr()] = t.storage().nbytes()
        stack.extend(n for n, _ in fn.next_functions)
    return held


def quant(c):
    model = build(c)
    q4 = [m for m in model.modules() if isinstance(m, Linear4bit)]
    quant_bytes = sum(b.numel() * b.element_size() for m in q4 for b in m.buffers(recurse=False))
    other = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" not in n)
    return [quant_bytes, other]


def mean_saves_input():
    x = torch.randn(3, 4, requires_grad=True)
    fn = (x * 2).mean(-1, keepdim=True).grad_fn
    return type(fn).__name__ == "MeanBackward1" and isinstance(getattr(fn, "_saved_self", None), torch.Tensor)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "mean":
        print(json.dumps(mean_saves_input()))
        sys.exit(0)
    cases = json.loads(sys.argv[2])
    if mode == "saved":
        llama.check_cpu_autocast()
        print(json.dumps([saved(c) for c in cases]))
    elif mode == "quant":
        print(json.dumps([quant(c) for c in cases]))
    else:
        raise SystemExit(f"unknown mode {mode}")
