package nn

import (
	"fmt"
	"math"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// The Llama family as HF transformers writes it: LlamaForCausalLM (models/llama/modeling_llama.py, the eager
// attention path and the sdpa one), and the two architectures that differ from it only where noted:
// MistralForCausalLM (models/mistral: a sliding-window mask, the same tensors) and Qwen2ForCausalLM
// (models/qwen2: biases on q_proj, k_proj and v_proj). Module and parameter names are HF's
// ("model.layers.3.self_attn.q_proj.weight"), so a trace reads like the PyTorch model it mirrors.

// LlamaConfig shapes a Llama-family decoder (the fields of LlamaConfig that decide memory).
type LlamaConfig struct {
	Vocab   int // vocab_size
	DModel  int // hidden_size
	Layers  int // num_hidden_layers
	Heads   int // num_attention_heads
	KVHeads int // num_key_value_heads (grouped-query attention when fewer than Heads)
	HeadDim int // head_dim (hidden_size / num_attention_heads when 0)
	FFN     int // intermediate_size
	Tied    bool
	// QKVBias puts biases on q_proj, k_proj and v_proj (Qwen2); AttentionBias on all four projections
	// (LlamaConfig.attention_bias); MLPBias on the MLP's (mlp_bias).
	QKVBias, AttentionBias, MLPBias bool
	NormEps                         float32 // rms_norm_eps
	RopeTheta                       float64 // rope_theta
	// Attention is "naive" (eager_attention_forward: the scores, additive mask, float32 softmax and
	// probabilities materialised) or "flash" (sdpa on the flash kernel, key-value heads not repeated).
	Attention string
	Dropout   float32      // attention_dropout
	DType     tensor.DType // the parameters' dtype (torch_dtype)
	// Adapter, when set, freezes the base model and adds adapters; QLoRA stores the adapted model's base
	// linear layers in 4 bits.
	Adapter *LoRAConfig
	QLoRA   bool
	// Quant is how QLoRA stores the base's linear weights (BitsAndBytesConfig's double quantization and
	// quant storage); the zero value is read as tensor.DefaultQuant4.
	Quant *tensor.Quant4Options
	// QuantizeHead stores lm_head in 4 bits as well under QLoRA, as Lightning's BitsandbytesPrecision (LitGPT's
	// quantize) replaces every nn.Linear; transformers leaves lm_head in 16 bits.
	QuantizeHead bool
	// Loss is how the loss is computed from the final hidden states (the full loss when zero).
	Loss Loss
	// Prequantized makes the 4-bit weights in their stored form at once (a checkpoint already quantized);
	// otherwise each is made in DType and quantized on the device, as from_pretrained quantizes on load.
	Prequantized bool
	// Built, when set, is called with each decoder layer as soon as its parameters exist (a data-parallel
	// strategy shards it at once, so the whole model is never on the device).
	Built func(l Module)
	// Split, when set, makes the model one rank of a tensor-, sequence-, context- or pipeline-parallel job.
	Split Split
}

// Split is one rank of a model split past data parallelism, as Megatron-LM splits it. The configuration's
// heads, key-value heads, FFN width and vocabulary are already the rank's shares: a tensor-parallel rank of a
// Llama computes what a Llama of 1/TP the heads, FFN and vocabulary (the same hidden size and head_dim)
// computes, its column-parallel projections' outputs and its row-parallel projections' inputs being the
// rank's slices; Split holds what else differs. The zero value is the whole model.
type Split struct {
	// SP, above 1, is sequence parallelism over SP tensor-parallel ranks: the residual stream, the norms and
	// the embeddings' output hold seq/SP tokens; the column-parallel projections gather their input
	// (tensor.GatherLinear, which saves the shard) and the row-parallel ones reduce-scatter their output.
	SP int
	// CP, above 1, is context parallelism over CP ranks: the rank's tokens are its 1/CP of each sequence,
	// and its attention receives the other ranks' keys and values around a ring, into two buffers of the
	// rank's own keys' and values' size (Transformer Engine's p2p_comm_buffers) while it computes.
	CP int
	// FirstLayer is the index of the stage's first layer (it names model.layers.FirstLayer); NoEmbed leaves
	// out the embeddings (a pipeline stage after the first), NoHead the final norm, lm_head and loss (a
	// stage before the last). A stage that has lm_head but not the embeddings holds its own copy of tied
	// embeddings, as Megatron's last stage does.
	FirstLayer      int
	NoEmbed, NoHead bool
}

func (s Split) sp() int { return max(s.SP, 1) }

// LlamaProjections names the linear layers of a decoder layer, in the order peft's target_modules uses.
var LlamaProjections = []string{"q", "k", "v", "o", "gate", "up", "down"}

// Llama is LlamaForCausalLM: model.embed_tokens, model.layers (decoder layers), model.norm, model.rotary_emb
// (the inv_freq buffer) and lm_head, whose weight is the embedding's when tied.
type Llama struct {
	base
	Config LlamaConfig
	Embed  *Embedding
	Layers []*LlamaDecoderLayer
	Norm   *RMSNorm
	LMHead *Linear
	// Input and Head are the modules the forward calls for the embeddings and lm_head: Embed and LMHead, or
	// the LoRA layers around them.
	Input, Head Layer
	InvFreq     *tensor.Tensor // model.rotary_emb.inv_freq (float32, head_dim/2), a non-persistent buffer
	Training    bool

	// Checkpoint, when set, runs a decoder layer through activation checkpointing when it returns true, as
	// gradient_checkpointing_enable() does (reentrant: CheckpointFunction).
	Checkpoint func(i int) bool
	// InputRequiresGrad makes the embeddings' output require grad (enable_input_require_grads): with a
	// frozen embedding and reentrant checkpointing, the adapters inside checkpointed layers get no gradient
	// otherwise, so peft and HF turn it on.
	InputRequiresGrad bool
	// AfterLayer, when set, is called with each decoder layer's output, like a forward hook.
	AfterLayer func(l *LlamaDecoderLayer, out *tensor.Tensor)

	heldLogits []*tensor.Tensor // the float32 logits chunks LitGPT's loop holds (LossChunkedHeld)
}

// LlamaDecoderLayer is one layer: x = x + attn(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x)).
type LlamaDecoderLayer struct {
	base
	InputNorm *RMSNorm
	Attn      *LlamaAttention
	PostNorm  *RMSNorm
	MLP       *LlamaMLP
}

// LlamaAttention is the self-attention: q, k, v and o projections, rotary embeddings, grouped-query
// attention.
type LlamaAttention struct {
	base
	Q, K, V, O Projection
	heads, kvh int
	headDim    int
	flash      bool
	dropout    float32
	training   *bool
	scaling    float32
	sp, cp     int // Split.SP and Split.CP, at least 1
}

// LlamaMLP is SwiGLU: down_proj(silu(gate_proj(x)) * up_proj(x)).
type LlamaMLP struct {
	base
	Gate, Up, Down Projection
	sp             int // Split.SP, at least 1
}

// Projection is a linear layer of a decoder: a Linear, a LoRALinear or a Linear4bit.
type Projection = Layer

// RMSNorm is LlamaRMSNorm: the input in float32, scaled by the reciprocal root mean square, back to the
// input's dtype, times the weight.
type RMSNorm struct {
	base
	Weight *Parameter
	Eps    float32
}

// NewLlama allocates a Llama-family model on rt's device, initialised as LlamaPreTrainedModel._init_weights
// does (normal(0, 0.02) linear and embedding weights, zero biases, unit norms). With an adapter the base is
// frozen and the adapters added as peft's get_peft_model does; with QLoRA each base linear weight is loaded
// in cfg.DType and quantized to 4 bits at once, as from_pretrained does with a BitsAndBytesConfig.
func NewLlama(rt *tensor.Runtime, cfg LlamaConfig) (*Llama, error) {
	if cfg.HeadDim == 0 && cfg.Heads > 0 {
		cfg.HeadDim = cfg.DModel / cfg.Heads
	}
	if cfg.KVHeads == 0 {
		cfg.KVHeads = cfg.Heads
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := cfg.Adapter.onlyOf("llama", append(slices.Clone(LlamaProjections), TargetLMHead, TargetEmbed)); err != nil {
		return nil, err
	}
	if cfg.Split.NoEmbed || cfg.Split.NoHead {
		cfg.Tied = false // the stage with lm_head holds its own copy of the embeddings
	}
	m := &Llama{base: base{rt, ""}, Config: cfg, Training: true}
	d, hd := cfg.DModel, cfg.HeadDim
	sp, cp := cfg.Split.sp(), max(cfg.Split.CP, 1)
	const std = 0.02
	normal := func(name string, shape []int) *Parameter {
		defer rt.Scope(owner(name))()
		t := rt.Randn(cfg.DType, shape, std, name, snapshot.CategoryParameter)
		return &Parameter{Name: name, Tensor: t.SetRequiresGrad(true).SetName(name)}
	}
	quantized := cfg.QLoRA
	quant := cfg.quant()
	linear := func(name, short string, in, out int, bias bool) Projection {
		adapted := cfg.Adapter != nil && cfg.Adapter.targets(short)
		baseName := name
		if adapted {
			baseName = join(name, "base_layer")
		}
		var l Projection
		if quantized {
			l = newLinear4bitLoaded(rt, baseName, in, out, bias, cfg.DType, std, quant, !cfg.Prequantized)
		} else {
			lin := &Linear{base: base{rt, baseName}, Weight: normal(join(baseName, "weight"), []int{out, in})}
			if bias {
				lin.Bias = constParameter(rt, join(baseName, "bias"), cfg.DType, []int{out}, 0)
			}
			l = lin
		}
		if adapted {
			l = newLoRALinear(rt, name, l, in, out, *cfg.Adapter, &m.Training)
		}
		return l
	}
	if !cfg.Split.NoEmbed {
		m.Embed = &Embedding{base: base{rt, "model.embed_tokens"}, Weight: normal("model.embed_tokens.weight", []int{cfg.Vocab, d})}
		m.Input = m.Embed
	}
	for i := range cfg.Layers {
		name := fmt.Sprintf("model.layers.%d", cfg.Split.FirstLayer+i)
		l := &LlamaDecoderLayer{base: base{rt, name}}
		an := join(name, "self_attn")
		a := &LlamaAttention{base: base{rt, an}, heads: cfg.Heads, kvh: cfg.KVHeads, headDim: hd,
			flash: cfg.Attention == "flash", dropout: cfg.Dropout, training: &m.Training,
			scaling: float32(1 / math.Sqrt(float64(hd))), sp: sp, cp: cp}
		qkvBias := cfg.QKVBias || cfg.AttentionBias
		a.Q = linear(join(an, "q_proj"), "q", d, cfg.Heads*hd, qkvBias)
		a.K = linear(join(an, "k_proj"), "k", d, cfg.KVHeads*hd, qkvBias)
		a.V = linear(join(an, "v_proj"), "v", d, cfg.KVHeads*hd, qkvBias)
		a.O = linear(join(an, "o_proj"), "o", cfg.Heads*hd, d, cfg.AttentionBias)
		l.Attn = a
		mn := join(name, "mlp")
		l.MLP = &LlamaMLP{base: base{rt, mn}, sp: sp}
		l.MLP.Gate = linear(join(mn, "gate_proj"), "gate", d, cfg.FFN, cfg.MLPBias)
		l.MLP.Up = linear(join(mn, "up_proj"), "up", d, cfg.FFN, cfg.MLPBias)
		l.MLP.Down = linear(join(mn, "down_proj"), "down", cfg.FFN, d, cfg.MLPBias)
		l.InputNorm = newRMSNorm(rt, join(name, "input_layernorm"), d, cfg.NormEps, cfg.DType)
		l.PostNorm = newRMSNorm(rt, join(name, "post_attention_layernorm"), d, cfg.NormEps, cfg.DType)
		m.Layers = append(m.Layers, l)
		if cfg.Built != nil {
			cfg.Built(l)
		}
	}
	m.InvFreq = ropeInvFreq(rt, hd, cfg.RopeTheta)
	if !cfg.Split.NoHead {
		m.Norm = newRMSNorm(rt, "model.norm", d, cfg.NormEps, cfg.DType)
		switch {
		case cfg.QuantizeHead:
			m.Head = newLinear4bitLoaded(rt, "lm_head", d, cfg.Vocab, false, cfg.DType, std, quant, !cfg.Prequantized)
		case cfg.Tied:
			m.LMHead = &Linear{base: base{rt, "lm_head"}, Weight: m.Embed.Weight}
		default:
			m.LMHead = &Linear{base: base{rt, "lm_head"}, Weight: normal("lm_head.weight", []int{cfg.Vocab, d})}
		}
		if m.LMHead != nil {
			m.Head = m.LMHead
		}
	}
	m.adaptEnds(cfg)
	if cfg.Adapter != nil { // peft: everything but the adapters frozen (embeddings and lm_head included)
		for _, p := range m.Parameters() {
			if !isAdapter(p.Name) {
				p.Tensor.SetRequiresGrad(false)
			}
		}
	}
	return m, nil
}

// adaptEnds adds LoRA to the embeddings and lm_head when the adapter targets them (peft's lora.Embedding and
// lora.Linear; the base layers renamed base_layer).
func (m *Llama) adaptEnds(cfg LlamaConfig) {
	rt, a := m.rt, cfg.Adapter
	if a == nil || m.Embed == nil || m.Head == nil { // a pipeline stage takes no adapters
		return
	}
	if a.targets(TargetLMHead) { // a 4-bit lm_head (no LMHead) is refused by validate
		m.LMHead.name = "lm_head.base_layer"
		m.LMHead.Weight.Name = "lm_head.base_layer.weight"
		m.LMHead.Weight.Tensor.SetName(m.LMHead.Weight.Name)
		m.Head = newLoRALinear(rt, "lm_head", m.LMHead, cfg.DModel, cfg.Vocab, *a, &m.Training)
	}
	if a.targets(TargetEmbed) {
		m.Embed.name = "model.embed_tokens.base_layer"
		m.Embed.Weight.Name = "model.embed_tokens.base_layer.weight"
		m.Embed.Weight.Tensor.SetName(m.Embed.Weight.Name)
		m.Input = newLoRAEmbedding(rt, "model.embed_tokens", m.Embed, cfg.Vocab, cfg.DModel, *a)
	}
}

// quant returns how QLoRA stores the base's weights.
func (c LlamaConfig) quant() tensor.Quant4Options {
	if c.Quant != nil {
		return *c.Quant
	}
	return tensor.DefaultQuant4
}

func (c LlamaConfig) validate() error {
	switch {
	case c.QuantizeHead && (!c.QLoRA || c.Tied || c.Split != Split{}):
		return fmt.Errorf("a 4-bit lm_head needs qlora, an lm_head of its own and the whole model")
	case c.QuantizeHead && c.Adapter.targets(TargetLMHead):
		return fmt.Errorf("lora on a 4-bit lm_head is not modelled")
	case c.Loss.Kind == LossChunkedHeld && c.Split != Split{}:
		return fmt.Errorf("LitGPT's chunked loss of one rank of a split model is not modelled")
	case c.QuantizeHead && c.Loss.Kind == LossFusedLinearCE:
		return fmt.Errorf("a fused linear cross-entropy over a 4-bit lm_head is not modelled")
	case c.Vocab <= 1 || c.DModel <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.KVHeads <= 0 || c.FFN <= 0 || c.HeadDim <= 0:
		return fmt.Errorf("llama needs vocab > 1 and d_model, layers, heads, kv_heads, ffn and head_dim > 0 (got %d, %d, %d, %d, %d, %d, %d)",
			c.Vocab, c.DModel, c.Layers, c.Heads, c.KVHeads, c.FFN, c.HeadDim)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("%d attention heads are not a multiple of %d key-value heads", c.Heads, c.KVHeads)
	case c.HeadDim%2 != 0:
		return fmt.Errorf("head_dim %d is odd: rotary embeddings rotate halves", c.HeadDim)
	case c.Attention != "naive" && c.Attention != "flash":
		return fmt.Errorf("unknown attention %q (want naive or flash)", c.Attention)
	case c.QLoRA && c.Adapter == nil:
		return fmt.Errorf("qlora needs a lora adapter")
	case c.Tied && c.Adapter != nil && (c.Adapter.targets(TargetLMHead) || c.Adapter.targets(TargetEmbed)):
		return fmt.Errorf("lora on lm_head or the embeddings of a model whose lm_head is tied to them is not modelled")
	case c.Loss.Kind != LossFull && c.Adapter != nil && c.Adapter.targets(TargetLMHead):
		return fmt.Errorf("a chunked or fused loss with lora on lm_head is not modelled")
	}
	return c.Loss.validate()
}

// ropeInvFreq allocates the rotary embedding's inv_freq buffer: 1 / theta^(2i/head_dim) for i < head_dim/2,
// in float32 (_compute_default_rope_parameters).
func ropeInvFreq(rt *tensor.Runtime, hd int, theta float64) *tensor.Tensor {
	return ropeInvFreqOf(rt, "model.rotary_emb", hd, theta, 1)
}

// ropeInvFreqOf allocates the inv_freq buffer of the rotary embedding module, divided by a linear rope
// scaling factor (_compute_linear_scaling_rope_parameters; 1 for the default rope).
func ropeInvFreqOf(rt *tensor.Runtime, module string, hd int, theta, factor float64) *tensor.Tensor {
	if theta == 0 {
		theta = 10000
	}
	if factor == 0 {
		factor = 1
	}
	v := make([]float32, hd/2)
	for i := range v {
		v[i] = float32(1 / math.Pow(theta, float64(2*i)/float64(hd)) / factor)
	}
	leave := rt.Scope(module)
	defer leave()
	name := join(module, "inv_freq")
	return rt.FromValues(tensor.F32, []int{hd / 2}, v, name, snapshot.CategoryParameter).SetName(name)
}

func newRMSNorm(rt *tensor.Runtime, name string, d int, eps float32, dtype tensor.DType) *RMSNorm {
	if eps == 0 {
		eps = 1e-6 // LlamaRMSNorm's default
	}
	return &RMSNorm{base: base{rt, name}, Weight: constParameter(rt, join(name, "weight"), dtype, []int{d}, 1), Eps: eps}
}

// Parameters returns the norm's weight.
func (n *RMSNorm) Parameters() []*Parameter { return []*Parameter{n.Weight} }

// Forward is LlamaRMSNorm.forward: to(float32); variance = pow(2).mean(-1, keepdim=True); x *
// rsqrt(variance + eps); weight * x.to(input_dtype). Each op saves what it saves: the float32 input (pow
// and mul), the rsqrt, and the normalised input when the weight is trained.
func (n *RMSNorm) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer n.scope()()
	inDType := x.DType()
	h := tensor.ToDType(x, tensor.F32)
	p := tensor.Pow(h, 2)
	variance := tensor.MeanLast(p)
	p.Release()
	ve := tensor.AddScalar(variance, n.Eps)
	r := tensor.Rsqrt(ve)
	ve.Release()
	hn := tensor.Mul(h, r)
	h.Release()
	r.Release()
	hc := tensor.ToDType(hn, inDType)
	hn.Release()
	out := tensor.Mul(n.Weight.Tensor, hc)
	hc.Release()
	variance.Release() // a local of the forward until it returns
	return out
}

// Parameters returns the model's parameters in HF's order: embeddings, each layer (attention, MLP, norms),
// the final norm, and lm_head's weight unless tied.
func (m *Llama) Parameters() []*Parameter {
	var ps []*Parameter
	if m.Input != nil {
		ps = m.Input.Parameters()
	}
	for _, l := range m.Layers {
		ps = append(ps, l.Parameters()...)
	}
	if m.Norm != nil {
		ps = append(ps, m.Norm.Parameters()...)
	}
	if m.Head != nil && !m.Config.Tied {
		ps = append(ps, m.Head.Parameters()...)
	}
	return ps
}

// Parameters returns the layer's parameters.
func (l *LlamaDecoderLayer) Parameters() []*Parameter {
	var ps []*Parameter
	for _, p := range []Projection{l.Attn.Q, l.Attn.K, l.Attn.V, l.Attn.O, l.MLP.Gate, l.MLP.Up, l.MLP.Down} {
		ps = append(ps, p.Parameters()...)
	}
	ps = append(ps, l.InputNorm.Parameters()...)
	return append(ps, l.PostNorm.Parameters()...)
}

// Release frees the model's parameters and buffers.
func (m *Llama) Release() {
	for _, l := range m.Layers {
		for _, p := range []Projection{l.Attn.Q, l.Attn.K, l.Attn.V, l.Attn.O, l.MLP.Gate, l.MLP.Up, l.MLP.Down} {
			if r, ok := p.(interface{ releaseState() }); ok {
				r.releaseState()
			}
		}
	}
	if h, ok := m.Head.(*Linear4bit); ok {
		h.releaseState()
	}
	ReleaseParameters(m)
	m.InvFreq.Release()
	releaseAll(m.heldLogits)
	m.heldLogits = nil
}

// Loss returns the mean cross-entropy of the model's next-token predictions; the logits are freed as
// soon as it is computed.
func (m *Llama) Loss(idx, labels *tensor.Tensor) *tensor.Tensor {
	logits, loss := m.ForwardLoss(idx, labels)
	logits.Release()
	return loss
}

// ForwardLoss is LlamaForCausalLM.forward(input_ids, labels=labels): it returns the logits (batch, seq,
// vocab; nil when the loss never makes them whole) and the loss (causalLMHead: the full loss of the
// runtime's transformers release, or a chunked or fused one). The caller owns both.
func (m *Llama) ForwardLoss(idx, labels *tensor.Tensor) (logits, loss *tensor.Tensor) {
	return m.head(m.forwardModel(idx), labels)
}

// head is lm_head and the loss on the final hidden states h (it takes h's reference). Under sequence
// parallelism lm_head is Megatron's column-parallel output layer: it gathers the rank's tokens and saves
// them alone; a chunked or fused loss, which cuts the sequence itself, gets the gathered states.
func (m *Llama) head(h, labels *tensor.Tensor) (logits, loss *tensor.Tensor) {
	if m.Config.Loss.Kind == LossChunkedHeld {
		return nil, heldChunkedLoss(m.rt, m.Head, h, labels, m.Config.Loss.Chunk, &m.heldLogits)
	}
	sp := m.Config.Split.sp()
	switch {
	case sp > 1 && m.Config.Loss.Kind == LossFull:
		return causalLMHead(m.rt, gatheredHead{m.LMHead, sp}, m.LMHead.Weight, h, labels, m.Config.Loss)
	case sp > 1:
		full := tensor.GatherSeq(h, sp)
		h.Release()
		h = full
	}
	var weight *Parameter // what a fused loss multiplies by (none for a 4-bit lm_head, which it refuses)
	if m.LMHead != nil {
		weight = m.LMHead.Weight
	}
	return causalLMHead(m.rt, m.Head, weight, h, labels, m.Config.Loss)
}

// gatheredHead is lm_head under sequence parallelism over sp ranks: columnParallel's linear.
type gatheredHead struct {
	*Linear
	sp int
}

func (g gatheredHead) Forward(x *tensor.Tensor) *tensor.Tensor {
	return columnParallel(g.Linear, x, g.sp)
}

// StageForward is one pipeline stage's share of the forward: the embeddings of idx on the first stage, else
// from the hidden states in received from the stage before; the stage's layers; then on the last stage the
// final norm, lm_head and the loss of labels, which it returns (the logits freed), and on any other the
// hidden states it sends on.
func (m *Llama) StageForward(idx, in, labels *tensor.Tensor) *tensor.Tensor {
	h := m.forwardFrom(idx, in)
	if m.Config.Split.NoHead {
		return h
	}
	logits, loss := m.head(h, labels)
	logits.Release()
	return loss
}

// forwardModel is LlamaModel.forward: the embeddings, the positions (cache_position and position_ids), the
// causal mask (eager attention only: sdpa and flash attention need none when nothing is padded), the
// rotary cos and sin shared by every layer, the layers and the final norm. The embeddings, mask, positions
// and cos/sin are locals of the forward, alive until it returns.
func (m *Llama) forwardModel(idx *tensor.Tensor) *tensor.Tensor { return m.forwardFrom(idx, nil) }

// forwardFrom is forwardModel from the token ids idx or, on a pipeline stage after the first, from the
// hidden states in; a stage before the last returns its last layer's output, without the final norm.
// Under sequence parallelism the embeddings are reduce-scattered over the sequence.
func (m *Llama) forwardFrom(idx, in *tensor.Tensor) *tensor.Tensor {
	rt := m.rt
	sp := m.Config.Split.sp()
	var embeds, x *tensor.Tensor
	var b, t int
	if in == nil {
		b, t = idx.Dim(0), idx.Dim(1)
		embeds = m.Input.Forward(idx)
		if m.InputRequiresGrad && !embeds.RequiresGrad() { // make_inputs_require_grad: output.requires_grad_(True)
			embeds.SetRequiresGrad(true)
		}
		x = tensor.ScatterSeq(embeds, sp)
	} else {
		b, t = in.Dim(0), in.Dim(1)*sp
		x = in.Ref()
	}
	cachePos := rt.Arange(t, "cache_position")
	posIDs := cachePos.Unsqueeze(0)
	var mask *tensor.Tensor
	if m.Config.Attention != "flash" {
		mask = causalMask(rt, cachePos, b, t, x.DType())
	}
	cos, sin := m.rotary(x, posIDs)
	for i, l := range m.Layers {
		var y *tensor.Tensor
		if m.Checkpoint != nil && m.Checkpoint(i) && m.Training {
			// _gradient_checkpointing_func(decoder_layer.__call__, hidden_states, causal_mask, position_ids,
			// past_key_values, output_attentions, use_cache, cache_position, position_embeddings): the
			// tensors among them are saved, the cos/sin tuple is kept in ctx.inputs.
			inputs := []*tensor.Tensor{x, mask, posIDs, cachePos}
			if mask == nil {
				inputs = []*tensor.Tensor{x, posIDs, cachePos}
			}
			y = tensor.CheckpointInputs(func(in, kept []*tensor.Tensor) *tensor.Tensor {
				mk := mask
				if mask != nil {
					mk = in[1]
				}
				return l.forward(in[0], mk, kept[0], kept[1])
			}, inputs, cos, sin)
		} else {
			y = l.forward(x, mask, cos, sin)
		}
		x.Release()
		x = y
		if m.AfterLayer != nil {
			m.AfterLayer(l, x)
		}
	}
	for _, r := range []*tensor.Tensor{embeds, cachePos, posIDs, mask, cos, sin} {
		r.Release()
	}
	if m.Config.Split.NoHead {
		return x
	}
	h := m.Norm.Forward(x)
	x.Release()
	return h
}

// rotary is LlamaRotaryEmbedding.forward, under no_grad: inv_freq expanded over the batch of position_ids
// times the positions in float32 with autocast disabled, transposed, concatenated with itself, cos and sin
// scaled by the attention scaling (1.0 for the default rope type) and converted to x's dtype. The results
// are (1, seq, head_dim), shared by every layer.
func (m *Llama) rotary(x, posIDs *tensor.Tensor) (cos, sin *tensor.Tensor) {
	return rotary(m.rt, "model.rotary_emb", m.InvFreq, x, posIDs)
}

// rotary is the forward of the rotary embedding module whose inv_freq buffer is invFreq (Llama.rotary).
func rotary(rt *tensor.Runtime, module string, invFreq, x, posIDs *tensor.Tensor) (cos, sin *tensor.Tensor) {
	defer rt.Scope(module)()
	rt.NoGrad(func() {
		invV := invFreq.View(1, -1, 1)
		inv := invV.Expand(posIDs.Dim(0), -1, 1)
		invV.Release()
		pv := posIDs.Unsqueeze(1)
		pf := tensor.ToDType(pv, tensor.F32)
		pv.Release()
		var c, s, fr, emb *tensor.Tensor
		rt.AutocastDisabled(func() {
			mm := tensor.Matmul(inv, pf)
			fr = mm.Transpose(1, 2)
			mm.Release()
			emb = tensor.Cat([]*tensor.Tensor{fr, fr}, -1)
			c0 := tensor.Cos(emb)
			c = tensor.Scale(c0, 1) // * self.attention_scaling
			c0.Release()
			s0 := tensor.Sin(emb)
			s = tensor.Scale(s0, 1)
			s0.Release()
		})
		inv.Release()
		pf.Release()
		cos, sin = tensor.ToDType(c, x.DType()), tensor.ToDType(s, x.DType())
		for _, r := range []*tensor.Tensor{c, s, fr, emb} {
			r.Release()
		}
	})
	return cos, sin
}

// causalMask is _prepare_4d_causal_attention_mask_with_cache_position without an attention mask:
// torch.full((seq, seq+1), min, dtype), triu(diagonal=1), times arange(seq+1) > cache_position (in place),
// viewed as (1, 1, seq, seq+1) and expanded over the batch. The target length is seq+1 when the caller
// passes no attention mask, as a training loop calling model(input_ids, labels=labels) does.
func causalMask(rt *tensor.Runtime, cachePos *tensor.Tensor, b, t int, dtype tensor.DType) *tensor.Tensor {
	full := rt.FullLike(dtype, []int{t, t + 1}, minFinite(dtype), "causal_mask")
	tri := tensor.Triu(full, 1)
	full.Release()
	ar := rt.Arange(t+1, "causal_mask.arange")
	cp := cachePos.Reshape(-1, 1)
	gt := tensor.Greater(ar, cp)
	tensor.Mul_(tri, gt)
	for _, r := range []*tensor.Tensor{ar, cp, gt} {
		r.Release()
	}
	v := tri.View(1, 1, t, t+1)
	tri.Release()
	mask := v.Expand(b, 1, -1, -1)
	v.Release()
	return mask
}

// minFinite is torch.finfo(dtype).min.
func minFinite(dtype tensor.DType) float32 { return tensor.MinFinite(dtype) }

// forward is LlamaDecoderLayer.forward.
func (l *LlamaDecoderLayer) forward(x, mask, cos, sin *tensor.Tensor) *tensor.Tensor {
	defer l.scope()()
	h := l.InputNorm.Forward(x)
	a := l.Attn.forward(h, mask, cos, sin)
	h.Release()
	x1 := tensor.Add(x, a)
	a.Release()
	h2 := l.PostNorm.Forward(x1)
	f := l.MLP.Forward(h2)
	h2.Release()
	out := tensor.Add(x1, f)
	x1.Release()
	f.Release()
	return out
}

// forward is LlamaAttention.forward: q, k and v projected and viewed as (batch, heads, seq, head_dim), the
// rotary embeddings applied to q and k, attention (eager or sdpa), the heads merged and o_proj.
func (a *LlamaAttention) forward(x, mask, cos, sin *tensor.Tensor) *tensor.Tensor {
	defer a.scope()()
	b, t := x.Dim(0), x.Dim(1)*a.sp
	heads := func(p Projection) *tensor.Tensor { // proj(x).view(b, t, -1, head_dim).transpose(1, 2)
		y := columnParallel(p, x, a.sp)
		v := y.View(b, t, -1, a.headDim)
		y.Release()
		tr := v.Transpose(1, 2)
		v.Release()
		return tr
	}
	q, k, v := heads(a.Q), heads(a.K), heads(a.V)
	qe, ke := applyRotary(q, k, cos, sin)
	q.Release()
	k.Release()
	p := a.dropout
	if !*a.training {
		p = 0
	}
	var out *tensor.Tensor // (b, t, heads, head_dim), contiguous
	ring := a.ringBuffers(ke, v)
	if a.flash {
		// sdpa_attention_forward: attn_output.transpose(1, 2).contiguous(), no copy: the kernel's output is
		// laid out (b, t, heads, head_dim).
		o := tensor.FlashAttention(qe, ke, v, true, p, *a.training)
		ot := o.Transpose(1, 2)
		o.Release()
		out = ot.Contiguous()
		ot.Release()
	} else {
		out = a.eager(qe, ke, v, mask, p)
	}
	releaseAll(ring)
	qe.Release()
	ke.Release()
	v.Release()
	merged := out.Reshape(b, t, -1) // attn_output.reshape(*input_shape, -1).contiguous(): a view
	out.Release()
	o := a.O.Forward(merged)
	merged.Release()
	return rowParallel(o, a.sp)
}

// ringBuffers are context parallelism's receive buffers: two of the rank's keys' and values' size, which the
// ring fills with the next rank's while attention runs on the current one (nil without CP).
func (a *LlamaAttention) ringBuffers(k, v *tensor.Tensor) []*tensor.Tensor {
	if a.cp < 2 {
		return nil
	}
	var bufs []*tensor.Tensor
	for range 2 {
		bufs = append(bufs, a.rt.Empty(k.DType(), k.Shape(), "cp.recv_k"), a.rt.Empty(v.DType(), v.Shape(), "cp.recv_v"))
	}
	return bufs
}

// columnParallel is a column-parallel projection of x: p.Forward(x), or under sequence parallelism over sp
// ranks the input shard gathered as Megatron's linear does (tensor.GatherLinear).
func columnParallel(p Projection, x *tensor.Tensor, sp int) *tensor.Tensor {
	if sp < 2 {
		return p.Forward(x)
	}
	l := p.(*Linear) // Validate refuses adapters, 4-bit weights and biases under sequence parallelism
	defer l.scope()()
	return tensor.GatherLinear(x, l.Weight.Tensor, sp)
}

// rowParallel is what follows a row-parallel projection's output o: the all-reduce, in place (nothing
// allocated), or under sequence parallelism the reduce-scatter to the rank's tokens. It takes o's reference.
func rowParallel(o *tensor.Tensor, sp int) *tensor.Tensor {
	if sp < 2 {
		return o
	}
	s := tensor.ScatterSeq(o, sp)
	o.Release()
	return s
}

// eager is eager_attention_forward (eagerAttention) with the layer's heads, scaling and dropout.
func (a *LlamaAttention) eager(q, k, v, mask *tensor.Tensor, p float32) *tensor.Tensor {
	return eagerAttention(q, k, v, mask, eagerSpec{groups: a.heads / a.kvh, scaling: a.scaling, p: p, training: *a.training})
}

// eagerSpec is what eager_attention_forward is given besides its tensors.
type eagerSpec struct {
	groups   int     // query heads per key-value head (num_key_value_groups)
	scaling  float32 // the scores' scale
	softcap  float32 // Gemma 2's attn_logit_softcapping (0: none)
	p        float32 // dropout probability
	training bool
}

// eagerAttention is eager_attention_forward: repeat_kv, scores scaled, soft-capped when Gemma 2 asks
// (divided by the cap, tanh, which saves its result, times the cap), the mask added, softmax in float32
// converted back to the query's dtype, dropout, the product with the values, transposed and made contiguous.
func eagerAttention(q, k, v, mask *tensor.Tensor, e eagerSpec) *tensor.Tensor {
	ks, vs := repeatKV(k, e.groups), repeatKV(v, e.groups)
	kt := ks.Transpose(2, 3)
	ks.Release()
	mm := tensor.Matmul(q, kt)
	kt.Release()
	w := tensor.Scale(mm, e.scaling)
	mm.Release()
	if e.softcap > 0 {
		w = softcap(w, e.softcap)
	}
	if mask != nil {
		cm := mask.Narrow(3, 0, k.Dim(2)) // attention_mask[:, :, :, :key_states.shape[-2]]
		wm := tensor.Add(w, cm)
		cm.Release()
		w.Release()
		w = wm
	}
	sm := tensor.SoftmaxDType(w, tensor.F32)
	w.Release()
	probs := tensor.ToDType(sm, q.DType())
	sm.Release()
	dropped := tensor.Dropout(probs, e.p, e.training)
	probs.Release()
	o := tensor.Matmul(dropped, vs)
	dropped.Release()
	vs.Release()
	ot := o.Transpose(1, 2)
	o.Release()
	out := ot.Contiguous()
	ot.Release()
	return out
}

// softcap is Gemma 2's soft-capping of scores or logits, x / cap, tanh, times cap; it takes x's reference.
// The tanh saves its result, a tensor of x's size.
func softcap(x *tensor.Tensor, limit float32) *tensor.Tensor {
	d := tensor.Scale(x, 1/limit)
	x.Release()
	t := tensor.Tanh(d)
	d.Release()
	out := tensor.Scale(t, limit)
	t.Release()
	return out
}

// repeatKV is repeat_kv: each key-value head repeated for its group of query heads,
// x[:, :, None].expand(...).reshape(...) (a copy), or x itself when every head has its own.
func repeatKV(x *tensor.Tensor, n int) *tensor.Tensor {
	if n == 1 {
		return x.Ref()
	}
	b, kvh, s, d := x.Dim(0), x.Dim(1), x.Dim(2), x.Dim(3)
	u := x.Unsqueeze(2)
	e := u.Expand(b, kvh, n, s, d)
	u.Release()
	r := e.Reshape(b, kvh*n, s, d)
	e.Release()
	return r
}

// applyRotary is apply_rotary_pos_emb: q * cos + rotate_half(q) * sin, and the same for k, with cos and
// sin unsqueezed over the heads.
func applyRotary(q, k, cos, sin *tensor.Tensor) (qe, ke *tensor.Tensor) {
	c, s := cos.Unsqueeze(1), sin.Unsqueeze(1)
	defer c.Release()
	defer s.Release()
	embed := func(x *tensor.Tensor) *tensor.Tensor {
		a := tensor.Mul(x, c)
		r := rotateHalf(x)
		bm := tensor.Mul(r, s)
		r.Release()
		out := tensor.Add(a, bm)
		a.Release()
		bm.Release()
		return out
	}
	return embed(q), embed(k)
}

// rotateHalf is rotate_half: cat(-x2, x1) of the last dimension's halves.
func rotateHalf(x *tensor.Tensor) *tensor.Tensor {
	half := x.Dim(-1) / 2
	x1, x2 := x.Narrow(-1, 0, half), x.Narrow(-1, half, half)
	n := tensor.Neg(x2)
	x2.Release()
	out := tensor.Cat([]*tensor.Tensor{n, x1}, -1)
	n.Release()
	x1.Release()
	return out
}

// Forward applies the MLP.
func (m *LlamaMLP) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer m.scope()()
	g := columnParallel(m.Gate, x, m.sp)
	act := tensor.SiLU(g)
	g.Release()
	u := columnParallel(m.Up, x, m.sp)
	p := tensor.Mul(act, u)
	act.Release()
	u.Release()
	out := m.Down.Forward(p)
	p.Release()
	return rowParallel(out, m.sp)
}

// Parameters returns the MLP's parameters.
func (m *LlamaMLP) Parameters() []*Parameter {
	return append(append(m.Gate.Parameters(), m.Up.Parameters()...), m.Down.Parameters()...)
}

// Parameters returns the attention's parameters.
func (a *LlamaAttention) Parameters() []*Parameter {
	var ps []*Parameter
	for _, p := range []Projection{a.Q, a.K, a.V, a.O} {
		ps = append(ps, p.Parameters()...)
	}
	return ps
}
