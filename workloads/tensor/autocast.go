package tensor

import "github.com/oomdbg/oomdbg/snapshot"

// Autocast follows torch.autocast("cuda"). Each op's treatment is its row of AutocastPolicy, the list it is
// registered in by aten/src/ATen/autocast_mode.cpp (TORCH_LIBRARY_IMPL(aten, Autocast, m)); the op reads
// its cast from that row, so the table (and docs/autocast.md, generated from it) is what runs:
//   - lower_precision_fp ops (linear, matmul, scaled_dot_product_attention) cast their floating inputs to the
//     autocast dtype; casts of float32 leaves that require grad are cached (amp_cache) until the outermost
//     autocast region ends, whatever the grad mode (cached_cast), so each weight is cast once per forward,
//     in a no_grad evaluation or a checkpointed forward too;
//   - fp32 ops (layer_norm, nll_loss, mse_loss) cast their floating inputs to float32;
//   - fp32_set_opt_dtype ops (softmax, log_softmax, sum) get dtype=float32 when the caller gave none;
//   - everything else, cross_entropy included (CUDA's lists omit it; the CPU's list it), runs in its inputs'
//     dtypes, float32 winning between two.
// Leaving the outermost region drops the cache; cast weights autograd saved stay alive until backward frees
// them, as in PyTorch.

// CastPolicy is how CUDA autocast treats an op: autocast_mode.h's CastPolicy, by the list of
// autocast_mode.cpp the op is registered in.
type CastPolicy uint8

// The policies the runtime's ops have.
const (
	// NotListed: autocast falls through and the op runs in its inputs' dtypes (type promotion between them).
	NotListed CastPolicy = iota
	// LowerPrecisionFP (AT_FORALL_LOWER_PRECISION_FP): floating inputs are cast to the autocast dtype.
	LowerPrecisionFP
	// FP32 (AT_FORALL_FP32): floating inputs are cast to float32.
	FP32
	// FP32SetOptDType (AT_FORALL_FP32_SET_OPT_DTYPE): an unset dtype argument is set to float32.
	FP32SetOptDType
	// Promote (AT_FORALL_PROMOTE): floating inputs are cast to the widest of their dtypes.
	Promote
)

var policyNames = [...]string{NotListed: "not listed", LowerPrecisionFP: "lower_precision_fp", FP32: "fp32",
	FP32SetOptDType: "fp32_set_opt_dtype", Promote: "promote"}

func (p CastPolicy) String() string { return policyNames[p] }

// DTypeRule says which dtype a tensor has under autocast.
type DTypeRule uint8

// The dtype rules.
const (
	// AsAutocast is the autocast dtype: float16 or bfloat16.
	AsAutocast DTypeRule = iota + 1
	// AsF32 is float32 whatever the inputs.
	AsF32
	// AsInput is the dtype of the op's floating input as it was given.
	AsInput
	// AsPromoted is the wider of the inputs' dtypes: float32 when either is.
	AsPromoted
	// AsI64 is torch.int64 (indices, class targets).
	AsI64
	// AsBool is torch.bool (masks).
	AsBool
)

var ruleNames = [...]string{AsAutocast: "fp16/bf16", AsF32: "fp32", AsInput: "input's", AsPromoted: "promoted",
	AsI64: "int64", AsBool: "bool"}

func (r DTypeRule) String() string { return ruleNames[r] }

// Resolve returns the dtype the rule gives under autocast to ac for inputs of dtypes in (the first is the
// op's floating input).
func (r DTypeRule) Resolve(ac DType, in ...DType) DType {
	switch r {
	case AsAutocast:
		return ac
	case AsF32:
		return F32
	case AsInput:
		return in[0]
	case AsPromoted:
		for _, d := range in {
			if d == F32 {
				return F32
			}
		}
		return in[0]
	case AsI64:
		return I64
	}
	return Bool
}

// AutocastRule is one op of the autocast policy: how CUDA autocast treats it, the dtype of its output and
// what autograd saves for its backward, in which dtype.
type AutocastRule struct {
	Op     string // the ATen op autocast dispatches on, e.g. "linear"
	Func   string // the runtime's function, e.g. "Linear"
	Policy CastPolicy
	Output DTypeRule
	Saved  []SavedRule
	Note   string
	Source string // the PyTorch source the row follows
}

// SavedRule is one tensor an op saves for backward: the node, its slot and the tensor's dtype.
type SavedRule struct {
	Node  string // e.g. "AddmmBackward0"
	Slot  string // e.g. "mat1"
	DType DTypeRule
}

// The rows, one per op; the ops read their policy here.
var (
	acLinear = &AutocastRule{Op: "linear", Func: "Linear", Policy: LowerPrecisionFP, Output: AsAutocast,
		Saved:  []SavedRule{{"AddmmBackward0", "mat1", AsAutocast}, {"AddmmBackward0", "mat2", AsAutocast}},
		Note:   "mat1 is the input's cast; mat2 the weight's cast, cached (amp_cache) like the bias's, so a weight is cast once per autocast region",
		Source: "autocast_mode.cpp cached_cast"}
	acMatmul = &AutocastRule{Op: "matmul", Func: "Matmul", Policy: LowerPrecisionFP, Output: AsAutocast,
		Saved:  []SavedRule{{"MmBackward0", "self", AsAutocast}, {"MmBackward0", "mat2", AsAutocast}},
		Note:   "batched operands go through bmm (BmmBackward0), saving the same",
		Source: "autocast_mode.h AT_FORALL_LOWER_PRECISION_FP"}
	acSDPA = &AutocastRule{Op: "scaled_dot_product_attention", Func: "ScaledDotProductAttention", Policy: LowerPrecisionFP,
		Output: AsAutocast,
		Saved: []SavedRule{{"ScaledDotProductEfficientAttentionBackward0", "query", AsAutocast},
			{"ScaledDotProductEfficientAttentionBackward0", "key", AsAutocast},
			{"ScaledDotProductEfficientAttentionBackward0", "value", AsAutocast},
			{"ScaledDotProductEfficientAttentionBackward0", "output", AsAutocast},
			{"ScaledDotProductEfficientAttentionBackward0", "log_sumexp", AsF32}},
		Source: "autocast_mode.h AT_FORALL_LOWER_PRECISION_FP"}
	acSoftmax = &AutocastRule{Op: "softmax", Func: "Softmax", Policy: FP32SetOptDType, Output: AsF32,
		Saved:  []SavedRule{{"SoftmaxBackward0", "result", AsF32}},
		Note:   "fp16 input: _softmax(half_to_float=true), no copy, and backward writes the fp16 gradient; bf16 input: a float32 copy first (not saved), the gradient converted back",
		Source: "SoftMax.cpp softmax"}
	acLogSoftmax = &AutocastRule{Op: "log_softmax", Func: "LogSoftmax", Policy: FP32SetOptDType, Output: AsF32,
		Saved:  []SavedRule{{"LogSoftmaxBackward0", "result", AsF32}},
		Note:   "as softmax",
		Source: "SoftMax.cpp log_softmax"}
	acSum = &AutocastRule{Op: "sum", Func: "Sum", Policy: FP32SetOptDType, Output: AsF32,
		Note:   "reduced in float32 without a copy; backward expands the gradient and the engine converts it to the input's dtype",
		Source: "autocast_mode.h AT_FORALL_FP32_SET_OPT_DTYPE"}
	acLayerNorm = &AutocastRule{Op: "layer_norm", Func: "LayerNorm", Policy: FP32, Output: AsF32,
		Saved: []SavedRule{{"NativeLayerNormBackward0", "input", AsF32}, {"NativeLayerNormBackward0", "weight", AsF32},
			{"NativeLayerNormBackward0", "bias", AsF32}, {"NativeLayerNormBackward0", "result1", AsF32},
			{"NativeLayerNormBackward0", "result2", AsF32}},
		Note:   "a 16-bit input is copied to float32 and the copy saved",
		Source: "autocast_mode.h AT_FORALL_FP32"}
	acNLLLoss = &AutocastRule{Op: "nll_loss", Func: "NLLLoss", Policy: FP32, Output: AsF32,
		Saved: []SavedRule{{"NllLossBackward0", "self", AsF32}, {"NllLossBackward0", "target", AsI64},
			{"NllLossBackward0", "total_weight", AsF32}},
		Note:   "a 16-bit input is copied to float32 and the copy saved",
		Source: "autocast_mode.h AT_FORALL_FP32"}
	acMSELoss = &AutocastRule{Op: "mse_loss", Func: "MSELoss", Policy: FP32, Output: AsF32,
		Saved:  []SavedRule{{"MseLossBackward0", "self", AsF32}, {"MseLossBackward0", "target", AsF32}},
		Source: "autocast_mode.h AT_FORALL_FP32"}
	acCrossEntropy = &AutocastRule{Op: "cross_entropy_loss", Func: "CrossEntropy", Policy: NotListed, Output: AsF32,
		Saved: []SavedRule{{"LogSoftmaxBackward0", "result", AsInput}, {"NllLossBackward0", "self", AsF32},
			{"NllLossBackward0", "target", AsI64}, {"NllLossBackward0", "total_weight", AsF32}},
		Note:   "log_softmax(logits, dim, logits.dtype) keeps the logits' dtype (the dtype is given, so autocast leaves it), then nll_loss saves a float32 copy: 6 bytes per logit saved from 16-bit logits, 4 from float32 ones (one tensor saved twice). CPU autocast lists cross_entropy_loss as fp32 instead",
		Source: "LossNLL.cpp cross_entropy_loss_symint"}
	acEmbedding = &AutocastRule{Op: "embedding", Func: "Embedding", Policy: NotListed, Output: AsInput,
		Saved:  []SavedRule{{"EmbeddingBackward0", "indices", AsI64}},
		Note:   "the output has the weight's dtype",
		Source: "autocast_mode.cpp (no registration)"}
	acGELU = &AutocastRule{Op: "gelu", Func: "GELU", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"GeluBackward0", "self", AsInput}}, Source: "autocast_mode.cpp (no registration)"}
	acReLU = &AutocastRule{Op: "relu", Func: "ReLU", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"ReluBackward0", "result", AsInput}}, Source: "autocast_mode.cpp (no registration)"}
	acDropout = &AutocastRule{Op: "native_dropout", Func: "Dropout", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"NativeDropoutBackward0", "result1", AsBool}}, Note: "the mask takes 1 byte per element",
		Source: "autocast_mode.cpp (no registration)"}
	acAdd = &AutocastRule{Op: "add", Func: "Add", Policy: NotListed, Output: AsPromoted,
		Note:   "the residual stream stays float32: float32 + 16-bit is float32, and the 16-bit input's gradient is converted back",
		Source: "autocast_mode.cpp (no registration)"}
	acMul = &AutocastRule{Op: "mul", Func: "Mul", Policy: NotListed, Output: AsPromoted,
		Saved:  []SavedRule{{"MulBackward0", "self", AsInput}, {"MulBackward0", "other", AsInput}},
		Source: "autocast_mode.cpp (no registration)"}
	acScale = &AutocastRule{Op: "mul (by a Python scalar)", Func: "Scale", Policy: NotListed, Output: AsInput,
		Source: "autocast_mode.cpp (no registration)"}
	acMaskedFill = &AutocastRule{Op: "masked_fill", Func: "MaskedFill", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"MaskedFillBackward0", "mask", AsBool}}, Source: "autocast_mode.cpp (no registration)"}
	acMean = &AutocastRule{Op: "mean", Func: "Mean", Policy: NotListed, Output: AsInput,
		Source: "autocast_mode.cpp (no registration)"}
	acMeanLast = &AutocastRule{Op: "mean (dim, keepdim)", Func: "MeanLast", Policy: NotListed, Output: AsInput,
		Note: "RMSNorm's variance: its input is already float32", Source: "autocast_mode.cpp (no registration)"}
	acPow = &AutocastRule{Op: "pow (a scalar exponent)", Func: "Pow", Policy: FP32, Output: AsF32,
		Saved:  []SavedRule{{"PowBackward0", "self", AsF32}},
		Note:   "a 16-bit input is copied to float32 and the copy saved; RMSNorm calls it on float32",
		Source: "autocast_mode.h AT_FORALL_FP32 (pow.Tensor_Scalar)"}
	acRsqrt = &AutocastRule{Op: "rsqrt", Func: "Rsqrt", Policy: FP32, Output: AsF32,
		Saved: []SavedRule{{"RsqrtBackward0", "result", AsF32}}, Source: "autocast_mode.h AT_FORALL_FP32"}
	acAddScalar = &AutocastRule{Op: "add (a Python scalar)", Func: "AddScalar", Policy: NotListed, Output: AsInput,
		Note: "a wrapped number does not promote", Source: "autocast_mode.cpp (no registration)"}
	acSiLU = &AutocastRule{Op: "silu", Func: "SiLU", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"SiluBackward0", "self", AsInput}}, Source: "autocast_mode.cpp (no registration)"}
	acNeg = &AutocastRule{Op: "neg", Func: "Neg", Policy: NotListed, Output: AsInput,
		Source: "autocast_mode.cpp (no registration)"}
	acCat = &AutocastRule{Op: "cat", Func: "Cat", Policy: Promote, Output: AsPromoted,
		Note:   "rotate_half concatenates two halves of one dtype: nothing to convert",
		Source: "autocast_mode.cpp KERNEL_CUDA(cat, promote)"}
	acCos = &AutocastRule{Op: "cos", Func: "Cos", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"CosBackward0", "self", AsInput}}, Note: "the rotary embedding computes it under no_grad with autocast disabled",
		Source: "autocast_mode.cpp (no registration)"}
	acSin = &AutocastRule{Op: "sin", Func: "Sin", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"SinBackward0", "self", AsInput}}, Note: "as cos", Source: "autocast_mode.cpp (no registration)"}
)

// The ops the families beside Llama add: Gemma's soft-capping and GeGLU, the mixtures of experts' routing,
// Qwen2-MoE's shared-expert gate, BERT's pooler and mask.
var (
	acTanh = &AutocastRule{Op: "tanh", Func: "Tanh", Policy: NotListed, Output: AsInput,
		Saved:  []SavedRule{{"TanhBackward0", "result", AsInput}},
		Note:   "Gemma 2's soft-capping of the scores and the logits keeps a tensor of their size; BERT's pooler",
		Source: "autocast_mode.cpp (no registration)"}
	acGELUTanh = &AutocastRule{Op: "gelu (approximate='tanh')", Func: "GELUTanh", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"GeluBackward0", "self", AsInput}}, Note: "Gemma's gelu_pytorch_tanh",
		Source: "autocast_mode.cpp (no registration)"}
	acSigmoid = &AutocastRule{Op: "sigmoid", Func: "Sigmoid", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"SigmoidBackward0", "result", AsInput}}, Note: "Qwen2-MoE's shared-expert gate",
		Source: "autocast_mode.cpp (no registration)"}
	acTopK = &AutocastRule{Op: "topk", Func: "TopK", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"TopkBackward0", "indices", AsI64}}, Note: "the router's float32 probabilities",
		Source: "autocast_mode.cpp (no registration)"}
	acSumLast = &AutocastRule{Op: "sum (dim, keepdim)", Func: "SumLast", Policy: FP32SetOptDType, Output: AsF32,
		Source: "autocast_mode.h AT_FORALL_FP32_SET_OPT_DTYPE"}
	acDiv = &AutocastRule{Op: "div_ (by a tensor)", Func: "Div_", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"DivBackward0", "self", AsInput}, {"DivBackward0", "other", AsInput}},
		Note:  "in place: self is a copy taken before the division", Source: "autocast_mode.cpp (no registration)"}
	acIndexRows = &AutocastRule{Op: "index (one tensor of indices)", Func: "IndexRows", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"IndexBackward0", "indices", AsI64}}, Note: "an expert's tokens gathered",
		Source: "autocast_mode.cpp (no registration)"}
	acIndexPairs = &AutocastRule{Op: "index (two tensors of indices)", Func: "IndexPairs", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"IndexBackward0", "indices", AsI64}, {"IndexBackward0", "indices", AsI64}},
		Note:  "each token's routing weight", Source: "autocast_mode.cpp (no registration)"}
	acIndexAdd = &AutocastRule{Op: "index_add_", Func: "IndexAdd_", Policy: NotListed, Output: AsInput,
		Saved: []SavedRule{{"IndexAddBackward0", "index", AsI64}, {"IndexAddBackward0", "source", AsInput}},
		Note:  "the source's gradient formula reads the source, so it is kept", Source: "autocast_mode.cpp (no registration)"}
	acMeanRows = &AutocastRule{Op: "mean (dim 0)", Func: "MeanRows", Policy: NotListed, Output: AsInput,
		Note: "the router probability per expert", Source: "autocast_mode.cpp (no registration)"}
	acRsub = &AutocastRule{Op: "rsub (a Python scalar)", Func: "Rsub", Policy: NotListed, Output: AsInput,
		Note: "BERT's 1.0 - attention_mask", Source: "autocast_mode.cpp (no registration)"}
)

// AutocastPolicy is every op of the runtime with its CUDA autocast treatment, in the order of a GPT's forward,
// then of the ops a Llama adds (RMSNorm, rotary embeddings, SwiGLU) and the ops of the other families.
var AutocastPolicy = []*AutocastRule{acEmbedding, acAdd, acDropout, acLayerNorm, acLinear, acMatmul, acScale,
	acMaskedFill, acSoftmax, acSDPA, acGELU, acCrossEntropy, acLogSoftmax, acNLLLoss, acReLU, acMul, acMSELoss, acSum,
	acMean, acPow, acMeanLast, acAddScalar, acRsqrt, acNeg, acCat, acSiLU, acCos, acSin,
	acTanh, acGELUTanh, acSigmoid, acTopK, acSumLast, acDiv, acIndexRows, acIndexPairs, acIndexAdd, acMeanRows, acRsub}

// Autocast runs f with autocast to dtype (F16 or BF16) on, and drops the weight-cast cache when the
// outermost region ends.
func (rt *Runtime) Autocast(dtype DType, f func()) {
	prev := rt.autocast
	rt.autocast = dtype
	defer func() {
		rt.autocast = prev
		if prev == F32 {
			rt.clearAMPCache()
		}
	}()
	f()
}

// AutocastDType returns the autocast dtype, or F32 when autocast is off.
func (rt *Runtime) AutocastDType() DType { return rt.autocast }

// withoutAutocast turns autocast off until the returned function is called: an op that has cast its inputs
// runs with autocast excluded (the ExcludeDispatchKeyGuard of autocast's wrappers).
func (rt *Runtime) withoutAutocast() (restore func()) {
	prev := rt.autocast
	rt.autocast = F32
	return func() { rt.autocast = prev }
}

func (rt *Runtime) clearAMPCache() {
	for _, o := range rt.ampOrder { // in the order the casts were made: a run replays the same frees
		rt.ampCache[o].Release()
	}
	rt.ampCache, rt.ampOrder = nil, nil
}

// cast applies the rule's policy to an op's inputs when autocast is on: it returns the inputs to run the op
// on (new references, nil for nil) and true, or false when the op runs on its inputs as they are. The caller
// runs the op on the casts with autocast off and releases them.
func (r *AutocastRule) cast(rt *Runtime, inputs ...*Tensor) ([]*Tensor, bool) {
	if rt.autocast == F32 || (r.Policy != LowerPrecisionFP && r.Policy != FP32) {
		return nil, false
	}
	to := rt.autocast
	if r.Policy == FP32 {
		to = F32
	}
	// Right to left: the wrapper casts its arguments in a pack expansion, which GCC (PyTorch's Linux builds)
	// evaluates last argument first; python3-torch casts a linear's bias, then its weight, then its input.
	out := make([]*Tensor, len(inputs))
	for i := len(inputs) - 1; i >= 0; i-- {
		out[i] = rt.cachedCast(inputs[i], to)
	}
	return out, true
}

// optDType applies the fp32_set_opt_dtype policy: the dtype an op with an optional dtype argument runs
// with. A nil dtype is unset; autocast sets it to float32 for a floating input.
func (r *AutocastRule) optDType(x *Tensor, dtype *DType) *DType {
	if dtype == nil && r.Policy == FP32SetOptDType && x.rt.autocast != F32 && eligible(x) {
		f := F32
		return &f
	}
	return dtype
}

// eligible is autocast's is_eligible: a floating tensor other than float64.
func eligible(t *Tensor) bool { return t.dtype.IsFloat() && t.dtype != F64 }

func releaseAll(ts []*Tensor) {
	for _, t := range ts {
		t.Release() // Release of nil is a no-op
	}
}

func ref(t *Tensor) *Tensor {
	if t == nil {
		return nil
	}
	return t.Ref()
}

// cachedCast is autocast's cached_cast: a floating t is converted to dtype. A float32 leaf that requires
// grad cast to the autocast dtype is cast once per autocast region and the cast kept in the cache, whatever
// the grad mode: under no_grad (an evaluation, a checkpointed forward) the cache fills as it does with grad
// on. Anything else is cast afresh; a tensor already of dtype, or not floating, is returned as is.
func (rt *Runtime) cachedCast(t *Tensor, dtype DType) *Tensor {
	if t == nil || !eligible(t) || t.dtype == dtype {
		return ref(t)
	}
	if !(dtype == rt.autocast && t.dtype == F32 && t.requiresGrad && t.gradFn == nil) {
		return ToDType(t, dtype)
	}
	if c, ok := rt.ampCache[t.object]; ok {
		return c.Ref()
	}
	prev := rt.SetCategory(snapshot.CategoryAMPCache)
	c := ToDType(t, dtype)
	rt.SetCategory(prev)
	c.owner = owner{name: "autocast cache[" + t.describe() + "]"}
	if rt.ampCache == nil {
		rt.ampCache = map[*object]*Tensor{}
	}
	rt.ampCache[t.object] = c
	rt.ampOrder = append(rt.ampOrder, t.object)
	return c.Ref()
}

// ToDType returns t converted to dtype (tensor.to(dtype)): another reference when it already has that
// dtype, else a new tensor whose backward converts the gradient back.
func ToDType(t *Tensor, dtype DType) *Tensor {
	t.check()
	if t.dtype == dtype {
		return t.Ref()
	}
	rt := t.rt
	out := rt.Empty(dtype, t.shape, "to."+dtype.String())
	if rt.dev.Computes() {
		copy(out.data(), t.host())
		out.round()
	}
	if rt.needsGrad(t) {
		from := t.dtype
		rt.node("ToCopyBackward0", []*Tensor{t}, []*Tensor{out}, func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			return []*Tensor{ToDType(g[0], from)}
		})
	}
	return out
}

// castGrad converts a gradient to the dtype of the input it is for, as the engine's validate_outputs does
// (a half input of a float32 op receives a half gradient). It releases g when it converts.
func castGrad(g *Tensor, dtype DType) *Tensor {
	if g == nil || g.dtype == dtype || !dtype.IsFloat() {
		return g
	}
	c := ToDType(g, dtype)
	g.Release()
	return c
}

// HasNonFinite reports whether t holds an Inf or NaN (always false on a device that computes nothing).
func HasNonFinite(t *Tensor) bool {
	if !t.rt.dev.Computes() {
		return false
	}
	for _, v := range t.host() {
		if v != v || v > maxF32 || v < -maxF32 {
			return true
		}
	}
	return false
}

const maxF32 = 3.4028234663852886e38
