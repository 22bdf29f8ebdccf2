package nn

import (
	"fmt"
	"math"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// The decoders HF transformers writes from Llama's modules with differences of their own, as transformers
// 4.51 writes them: the mixtures of experts (models/mixtral, qwen2_moe, qwen3_moe; moe.go), Gemma 2 and 3
// (models/gemma2, gemma3; gemma.go) and Phi-3 (models/phi3; phi.go). They share Llama's skeleton (llama.go):
// the embeddings, the positions, a causal mask for eager attention, the rotary cos and sin built once and
// shared by every layer, the layers under reentrant checkpointing, the final norm, lm_head and
// ForCausalLMLoss. Module and parameter names are HF's.

// Family is a decoder family beside Llama's.
type Family string

// The families a Decoder builds.
const (
	FamilyMixtral  Family = "mixtral"   // MixtralForCausalLM
	FamilyQwen2MoE Family = "qwen2_moe" // Qwen2MoeForCausalLM
	FamilyQwen3MoE Family = "qwen3_moe" // Qwen3MoeForCausalLM
	FamilyGemma2   Family = "gemma2"    // Gemma2ForCausalLM
	FamilyGemma3   Family = "gemma3"    // Gemma3ForCausalLM, the text model of Gemma 3
	FamilyPhi3     Family = "phi3"      // Phi3ForCausalLM (Phi-3, Phi-3.5, Phi-4)
)

// Families lists the families a Decoder builds.
var Families = []Family{FamilyMixtral, FamilyQwen2MoE, FamilyQwen3MoE, FamilyGemma2, FamilyGemma3, FamilyPhi3}

// MoE reports whether the family's MLPs are mixtures of experts.
func (f Family) MoE() bool { return f == FamilyMixtral || f == FamilyQwen2MoE || f == FamilyQwen3MoE }

// Gemma reports whether the family is Gemma 2 or 3.
func (f Family) Gemma() bool { return f == FamilyGemma2 || f == FamilyGemma3 }

// Projections lists the short names of the linear layers of a decoder layer of the family that LoRA may
// adapt, in peft's order: Llama's, or Phi-3's fused qkv and gate_up. A mixture of experts' gate, up and down
// are every expert's (Mixtral's w1, w3 and w2; Qwen2-MoE's shared expert's too).
func (f Family) Projections() []string {
	if f == FamilyPhi3 {
		return []string{"qkv", "o", "gate_up", "down"}
	}
	return LlamaProjections
}

// DefaultLoRATargets returns peft's default target modules for the family
// (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: q_proj and v_proj for mixtral, gemma2 and
// gemma3_text), or nil where peft has none and asks for target_modules (Qwen's mixtures of experts, phi3).
func (f Family) DefaultLoRATargets() []string {
	switch f {
	case FamilyMixtral, FamilyGemma2, FamilyGemma3:
		return []string{"q", "v"}
	}
	return nil
}

// DecoderConfig shapes a decoder of a family: Llama's shape (Vocab, DModel, Layers, Heads, KVHeads, HeadDim,
// FFN, Tied, QKVBias for Qwen2-MoE, NormEps, RopeTheta, Attention, Dropout, DType, Adapter, QLoRA, Built)
// and what the family adds.
type DecoderConfig struct {
	LlamaConfig
	Family Family
	// Experts is num_local_experts (num_experts), ExpertsPerToken num_experts_per_tok, ExpertFFN each
	// expert's intermediate size (moe_intermediate_size; Mixtral's experts are FFN wide), SharedExpertFFN
	// Qwen2-MoE's shared_expert_intermediate_size. NormTopK renormalises the top-k weights (Qwen's
	// norm_topk_prob; Mixtral always does). RouterAuxLoss is router_aux_loss_coef when the router logits are
	// output (output_router_logits), 0 when they are not.
	Experts, ExpertsPerToken, ExpertFFN, SharedExpertFFN int
	NormTopK                                             bool
	RouterAuxLoss                                        float32
	// QueryScale is Gemma's query_pre_attn_scalar (the scores scale by its inverse square root);
	// AttnSoftcap and FinalSoftcap Gemma 2's attn_logit_softcapping and final_logit_softcapping (0: none).
	QueryScale                float64
	AttnSoftcap, FinalSoftcap float32
	// SlidingWindow is the window of Gemma's sliding layers, and Mistral's and Phi-3's window (which changes
	// the mask's values, not its size); SlidingPattern makes every SlidingPattern-th layer of Gemma 3 global
	// (sliding_window_pattern). LocalRopeTheta is Gemma 3's rope_local_base_freq, RopeScaling a linear
	// rope_scaling factor of its global layers.
	SlidingWindow, SlidingPattern int
	LocalRopeTheta, RopeScaling   float64
	// ResidDropout is Phi-3's resid_pdrop, on the attention's and the MLP's outputs.
	ResidDropout float32
}

// Decoder is a causal language model of a Family: model.embed_tokens, model.layers, model.norm,
// model.rotary_emb (and Gemma 3's model.rotary_emb_local) and lm_head.
type Decoder struct {
	base
	Config  DecoderConfig
	Embed   *Embedding
	Layers  []*DecoderLayer
	Norm    Layer // RMSNorm, or GemmaRMSNorm
	LMHead  *Linear
	InvFreq *tensor.Tensor
	// LocalInvFreq is Gemma 3's local rotary embedding's buffer, EmbedScale its embeddings' scale.
	LocalInvFreq, EmbedScale *tensor.Tensor
	Training                 bool

	// Checkpoint, InputRequiresGrad and AfterLayer are Llama's.
	Checkpoint        func(i int) bool
	InputRequiresGrad bool
	AfterLayer        func(l *DecoderLayer, out *tensor.Tensor)
	// Routing chooses the experts of each token where the device computes no router scores (nil: uniform);
	// on the cpu device the router's top-k does. OnRoute, when set, is told each mixture-of-experts layer's
	// tokens per expert at every forward.
	Routing Routing
	OnRoute func(layer int, tokensPerExpert []int)
}

// DecoderLayer is one layer: attention and an MLP (dense, or a mixture of experts), with two norms (pre-norm
// residuals, Llama's) or four (Gemma's, a norm after each block as well).
type DecoderLayer struct {
	base
	Index               int
	InputNorm, PostNorm Layer // input_layernorm, post_attention_layernorm
	// PreFFNorm and PostFFNorm are Gemma's pre_feedforward_layernorm and post_feedforward_layernorm.
	PreFFNorm, PostFFNorm Layer
	Attn                  *DecoderAttention
	MLP                   *GatedMLP  // a dense MLP, or nil
	MoE                   *SparseMoE // a mixture of experts, or nil
	sliding               bool       // a sliding-window layer (Gemma)
	model                 *Decoder
}

// DecoderAttention is the self-attention: q, k, v and o projections (Phi-3: one fused qkv_proj), Qwen3's and
// Gemma 3's q_norm and k_norm, rotary embeddings, grouped-query attention with the family's scaling,
// soft-capping and window.
type DecoderAttention struct {
	base
	Q, K, V, O   Projection
	QKV          Projection // Phi-3's qkv_proj (Q, K and V nil)
	QNorm, KNorm Layer
	heads, kvh   int
	headDim      int
	flash        bool
	dropout      float32
	training     *bool
	scaling      float32
	softcap      float32
	window       int // the layer's sliding window (flash attention's window_size), 0 for full attention
	family       Family
}

// GatedMLP is a gated MLP, down(act(gate(x)) * up(x)): LlamaMLP (Qwen's experts, Gemma's with gelu tanh),
// Mixtral's expert (w1, w3, w2) and Phi-3's with a fused gate_up_proj (up * act(gate)).
type GatedMLP struct {
	base
	Gate, Up, Down Projection
	GateUp         Projection // Phi-3's gate_up_proj (Gate and Up nil)
	act            func(*tensor.Tensor) *tensor.Tensor
	order          []Projection // the projections in registration order
}

// NewDecoder allocates a decoder of cfg.Family on rt's device, frozen and adapted when cfg.Adapter says, with
// 4-bit base linears under QLoRA, as NewLlama does.
func NewDecoder(rt *tensor.Runtime, cfg DecoderConfig) (*Decoder, error) {
	if cfg.HeadDim == 0 && cfg.Heads > 0 {
		cfg.HeadDim = cfg.DModel / cfg.Heads
	}
	if cfg.KVHeads == 0 {
		cfg.KVHeads = cfg.Heads
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Decoder{base: base{rt, ""}, Config: cfg, Training: true}
	b := &decoderBuilder{rt: rt, cfg: &m.Config, training: &m.Training}
	m.Embed = &Embedding{base: base{rt, "model.embed_tokens"}, Weight: b.normal("model.embed_tokens.weight", []int{cfg.Vocab, cfg.DModel})}
	for i := range cfg.Layers {
		l := b.layer(i)
		l.model = m
		if l.MoE != nil {
			l.MoE.model = m
		}
		m.Layers = append(m.Layers, l)
		if cfg.Built != nil {
			cfg.Built(l)
		}
	}
	m.Norm = b.norm("model.norm", cfg.DModel)
	m.InvFreq = ropeInvFreqOf(rt, "model.rotary_emb", cfg.HeadDim, cfg.RopeTheta, cfg.RopeScaling)
	if cfg.Family == FamilyGemma3 {
		m.LocalInvFreq = ropeInvFreqOf(rt, "model.rotary_emb_local", cfg.HeadDim, cfg.LocalRopeTheta, 1)
		m.EmbedScale = gemmaEmbedScale(rt, cfg.DModel)
	}
	if cfg.Tied {
		m.LMHead = &Linear{base: base{rt, "lm_head"}, Weight: m.Embed.Weight}
	} else {
		m.LMHead = &Linear{base: base{rt, "lm_head"}, Weight: b.normal("lm_head.weight", []int{cfg.Vocab, cfg.DModel})}
	}
	if cfg.Adapter != nil {
		for _, p := range m.Parameters() {
			if !isAdapter(p.Name) {
				p.Tensor.SetRequiresGrad(false)
			}
		}
	}
	return m, nil
}

func (c DecoderConfig) validate() error {
	if err := c.LlamaConfig.validate(); err != nil {
		return err
	}
	f := c.Family
	switch {
	case f.MoE() && (c.Experts < 1 || c.ExpertsPerToken < 1 || c.ExpertsPerToken > c.Experts || c.ExpertFFN < 1):
		return fmt.Errorf("%s needs experts >= experts per token >= 1 and an expert width (got %d, %d, %d)",
			f, c.Experts, c.ExpertsPerToken, c.ExpertFFN)
	case f == FamilyQwen2MoE && c.SharedExpertFFN < 1:
		return fmt.Errorf("qwen2_moe needs a shared expert width")
	case f.Gemma() && (c.QueryScale <= 0 || c.SlidingWindow < 1):
		return fmt.Errorf("%s needs query_pre_attn_scalar and sliding_window > 0", f)
	case f == FamilyGemma3 && c.SlidingPattern < 1:
		return fmt.Errorf("gemma3 needs sliding_window_pattern >= 1")
	case !f.MoE() && !f.Gemma() && f != FamilyPhi3:
		return fmt.Errorf("unknown family %q", f)
	}
	return c.Adapter.onlyOf(string(f), f.Projections())
}

// decoderBuilder makes a decoder's modules: linear layers (adapted and 4-bit as the config says), norms and
// parameters initialised as the families' _init_weights do (normal(0, 0.02) weights).
type decoderBuilder struct {
	rt       *tensor.Runtime
	cfg      *DecoderConfig
	training *bool
}

const initStd = 0.02

func (b *decoderBuilder) normal(name string, shape []int) *Parameter {
	defer b.rt.Scope(owner(name))()
	t := b.rt.Randn(b.cfg.DType, shape, initStd, name, snapshot.CategoryParameter)
	return &Parameter{Name: name, Tensor: t.SetRequiresGrad(true).SetName(name)}
}

// linear makes the linear layer name, short its LoRA target name ("" for one LoRA never adapts: the router).
func (b *decoderBuilder) linear(name, short string, in, out int, bias bool) Projection {
	cfg := b.cfg
	adapted := cfg.Adapter != nil && short != "" && cfg.Adapter.targets(short)
	baseName := name
	if adapted {
		baseName = join(name, "base_layer")
	}
	var l Projection
	if cfg.QLoRA {
		l = newLinear4bit(b.rt, baseName, in, out, bias, cfg.DType, initStd, cfg.quant())
	} else {
		lin := &Linear{base: base{b.rt, baseName}, Weight: b.normal(join(baseName, "weight"), []int{out, in})}
		if bias {
			lin.Bias = constParameter(b.rt, join(baseName, "bias"), cfg.DType, []int{out}, 0)
		}
		l = lin
	}
	if adapted {
		l = newLoRALinear(b.rt, name, l, in, out, *cfg.Adapter, b.training)
	}
	return l
}

// norm makes the family's RMSNorm.
func (b *decoderBuilder) norm(name string, d int) Layer {
	if b.cfg.Family.Gemma() {
		return newGemmaRMSNorm(b.rt, name, d, b.cfg.NormEps, b.cfg.DType)
	}
	return newRMSNorm(b.rt, name, d, b.cfg.NormEps, b.cfg.DType)
}

// layer makes decoder layer i, its modules registered in HF's order: self_attn, the MLP (mlp or
// block_sparse_moe), then the norms.
func (b *decoderBuilder) layer(i int) *DecoderLayer {
	cfg, rt := b.cfg, b.rt
	name := fmt.Sprintf("model.layers.%d", i)
	l := &DecoderLayer{base: base{rt, name}, Index: i, sliding: cfg.sliding(i)}
	l.Attn = b.attention(join(name, "self_attn"), l.sliding)
	switch cfg.Family {
	case FamilyMixtral:
		l.MoE = b.sparseMoE(join(name, "block_sparse_moe"), i)
	case FamilyQwen2MoE, FamilyQwen3MoE:
		l.MoE = b.sparseMoE(join(name, "mlp"), i)
	default:
		l.MLP = b.gatedMLP(join(name, "mlp"), cfg.FFN, false)
	}
	l.InputNorm = b.norm(join(name, "input_layernorm"), cfg.DModel)
	l.PostNorm = b.norm(join(name, "post_attention_layernorm"), cfg.DModel)
	if cfg.Family.Gemma() {
		l.PreFFNorm = b.norm(join(name, "pre_feedforward_layernorm"), cfg.DModel)
		l.PostFFNorm = b.norm(join(name, "post_feedforward_layernorm"), cfg.DModel)
	}
	return l
}

// sliding reports whether layer i attends through a sliding window (Gemma 2: the even layers; Gemma 3: all
// but every SlidingPattern-th).
func (c *DecoderConfig) sliding(i int) bool {
	switch c.Family {
	case FamilyGemma2:
		return i%2 == 0
	case FamilyGemma3:
		return (i+1)%c.SlidingPattern != 0
	}
	return false
}

func (b *decoderBuilder) attention(name string, sliding bool) *DecoderAttention {
	cfg, rt := b.cfg, b.rt
	d, hd := cfg.DModel, cfg.HeadDim
	a := &DecoderAttention{base: base{rt, name}, heads: cfg.Heads, kvh: cfg.KVHeads, headDim: hd,
		flash: cfg.Attention == "flash", dropout: cfg.Dropout, training: b.training, family: cfg.Family,
		scaling: float32(1 / math.Sqrt(float64(hd)))}
	if cfg.Family.Gemma() {
		a.scaling = float32(1 / math.Sqrt(cfg.QueryScale))
		if sliding {
			a.window = cfg.SlidingWindow
		}
	}
	if cfg.Family == FamilyGemma2 {
		a.softcap = cfg.AttnSoftcap
	}
	if cfg.Family == FamilyPhi3 {
		a.window = cfg.SlidingWindow // flash attention's window; eager attention reads it from the mask
		// Phi3Attention registers o_proj before qkv_proj.
		a.O = b.linear(join(name, "o_proj"), "o", cfg.Heads*hd, d, false)
		a.QKV = b.linear(join(name, "qkv_proj"), "qkv", d, (cfg.Heads+2*cfg.KVHeads)*hd, false)
		return a
	}
	bias := cfg.QKVBias || cfg.AttentionBias
	a.Q = b.linear(join(name, "q_proj"), "q", d, cfg.Heads*hd, bias)
	a.K = b.linear(join(name, "k_proj"), "k", d, cfg.KVHeads*hd, bias)
	a.V = b.linear(join(name, "v_proj"), "v", d, cfg.KVHeads*hd, bias)
	a.O = b.linear(join(name, "o_proj"), "o", cfg.Heads*hd, d, cfg.AttentionBias)
	if cfg.Family == FamilyQwen3MoE || cfg.Family == FamilyGemma3 {
		a.QNorm = b.norm(join(name, "q_norm"), hd)
		a.KNorm = b.norm(join(name, "k_norm"), hd)
	}
	return a
}

// gatedMLP makes a gated MLP of width ffn; mixtral names its projections w1, w3 and w2.
func (b *decoderBuilder) gatedMLP(name string, ffn int, mixtral bool) *GatedMLP {
	cfg := b.cfg
	d := cfg.DModel
	m := &GatedMLP{base: base{b.rt, name}, act: tensor.SiLU}
	switch {
	case cfg.Family.Gemma():
		m.act = tensor.GELUTanh
	case cfg.Family == FamilyPhi3:
		m.GateUp = b.linear(join(name, "gate_up_proj"), "gate_up", d, 2*ffn, cfg.MLPBias)
		m.Down = b.linear(join(name, "down_proj"), "down", ffn, d, cfg.MLPBias)
		m.order = []Projection{m.GateUp, m.Down}
		return m
	}
	gate, up, down := "gate_proj", "up_proj", "down_proj"
	if mixtral { // MixtralBlockSparseTop2MLP registers w1, w2, w3
		m.Gate = b.linear(join(name, "w1"), "gate", d, ffn, false)
		m.Down = b.linear(join(name, "w2"), "down", ffn, d, false)
		m.Up = b.linear(join(name, "w3"), "up", d, ffn, false)
		m.order = []Projection{m.Gate, m.Down, m.Up}
		return m
	}
	m.Gate = b.linear(join(name, gate), "gate", d, ffn, cfg.MLPBias)
	m.Up = b.linear(join(name, up), "up", d, ffn, cfg.MLPBias)
	m.Down = b.linear(join(name, down), "down", ffn, d, cfg.MLPBias)
	m.order = []Projection{m.Gate, m.Up, m.Down}
	return m
}

// Parameters returns the model's parameters in HF's order.
func (m *Decoder) Parameters() []*Parameter {
	ps := m.Embed.Parameters()
	for _, l := range m.Layers {
		ps = append(ps, l.Parameters()...)
	}
	ps = append(ps, m.Norm.Parameters()...)
	if !m.Config.Tied {
		ps = append(ps, m.LMHead.Parameters()...)
	}
	return ps
}

// Parameters returns the layer's parameters: attention, MLP, norms.
func (l *DecoderLayer) Parameters() []*Parameter {
	ps := l.Attn.Parameters()
	if l.MoE != nil {
		ps = append(ps, l.MoE.Parameters()...)
	} else {
		ps = append(ps, l.MLP.Parameters()...)
	}
	for _, n := range []Layer{l.InputNorm, l.PostNorm, l.PreFFNorm, l.PostFFNorm} {
		if n != nil {
			ps = append(ps, n.Parameters()...)
		}
	}
	return ps
}

// Parameters returns the attention's parameters.
func (a *DecoderAttention) Parameters() []*Parameter {
	var ps []*Parameter
	for _, p := range a.projections() {
		ps = append(ps, p.Parameters()...)
	}
	if a.QNorm != nil {
		ps = append(append(ps, a.QNorm.Parameters()...), a.KNorm.Parameters()...)
	}
	return ps
}

// projections returns the attention's linear layers in registration order.
func (a *DecoderAttention) projections() []Projection {
	if a.QKV != nil {
		return []Projection{a.O, a.QKV}
	}
	return []Projection{a.Q, a.K, a.V, a.O}
}

// Parameters returns the MLP's parameters in registration order.
func (m *GatedMLP) Parameters() []*Parameter {
	var ps []*Parameter
	for _, p := range m.projections() {
		ps = append(ps, p.Parameters()...)
	}
	return ps
}

func (m *GatedMLP) projections() []Projection { return m.order }

// Release frees the model's parameters, buffers and quantization state.
func (m *Decoder) Release() {
	for _, p := range m.projections() {
		if r, ok := p.(interface{ releaseState() }); ok {
			r.releaseState()
		}
	}
	ReleaseParameters(m)
	for _, t := range []*tensor.Tensor{m.InvFreq, m.LocalInvFreq, m.EmbedScale} {
		t.Release()
	}
}

// projections returns every linear layer of the model's layers.
func (m *Decoder) projections() []Projection {
	var ps []Projection
	for _, l := range m.Layers {
		ps = append(ps, l.Attn.projections()...)
		if l.MLP != nil {
			ps = append(ps, l.MLP.projections()...)
		}
		if l.MoE != nil {
			ps = append(ps, l.MoE.projections()...)
		}
	}
	return ps
}
