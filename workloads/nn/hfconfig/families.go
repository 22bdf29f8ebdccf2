package hfconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// The families beside Llama's: what each configuration class adds, with its defaults
// (configuration_mixtral.py, configuration_qwen2_moe.py, configuration_qwen3_moe.py, configuration_gemma2.py,
// configuration_gemma3.py's Gemma3TextConfig, configuration_phi3.py, configuration_bert.py).

// Extra is what a Model of a family beside Llama's carries.
type Extra struct {
	// Mixtures of experts: num_local_experts (num_experts), num_experts_per_tok, moe_intermediate_size
	// (Mixtral's experts are intermediate_size wide), shared_expert_intermediate_size, norm_topk_prob, and
	// router_aux_loss_coef when output_router_logits is set (else 0: no auxiliary loss).
	Experts, ExpertsPerToken, ExpertFFN, SharedExpertFFN int
	NormTopK                                             bool
	RouterAuxLoss                                        float64
	// Gemma: query_pre_attn_scalar, attn_logit_softcapping and final_logit_softcapping (0: none),
	// sliding_window, the period of its sliding layers (every SlidingPattern-th layer is global: 2 for
	// Gemma 2, sliding_window_pattern for Gemma 3), rope_local_base_freq and a linear rope_scaling factor.
	// SlidingWindow is also Mistral's, Mixtral's and Phi-3's window, which changes a mask's values only.
	QueryScale, AttnSoftcap, FinalSoftcap float64
	SlidingWindow, SlidingPattern         int
	LocalRopeTheta, RopeScaling           float64
	// ResidDropout is Phi-3's resid_pdrop.
	ResidDropout float64
	// BERT: type_vocab_size, the task (mlm or classify, from the architecture) and num_labels; Dropout is
	// hidden_dropout_prob, AttnDropout attention_probs_dropout_prob.
	TypeVocab   int
	Task        string
	Labels      int
	AttnDropout float64
	// TextOf names the multimodal architecture whose text model this is (Gemma3ForConditionalGeneration:
	// its vision tower and projector are not built).
	TextOf string
}

// familyDefaults are the configuration classes' defaults of the families beside Llama's.
var familyDefaults = map[string]struct {
	vocab, d, ffn, layers, heads, kvHeads, maxPos int
	eps, theta                                    float64
}{
	Mixtral:  {32000, 4096, 14336, 32, 32, 8, 4096 * 32, 1e-5, 1e6},
	Qwen2MoE: {151936, 2048, 5632, 24, 16, 16, 32768, 1e-6, 10000},
	Qwen3MoE: {151936, 2048, 6144, 24, 32, 4, 32768, 1e-6, 10000},
	Gemma2:   {256000, 2304, 9216, 26, 8, 4, 8192, 1e-6, 10000},
	Gemma3:   {262208, 2304, 9216, 26, 8, 4, 131072, 1e-6, 1e6},
	Phi3:     {32064, 3072, 8192, 32, 32, 0, 4096, 1e-5, 10000},
}

// decoder reads the shape the decoders share, with the architecture's defaults.
func (f *fields) decoder(arch string) *Model {
	def := familyDefaults[arch]
	m := &Model{Architecture: arch}
	m.Vocab = f.integer("vocab_size", def.vocab, maxVocab)
	m.DModel = f.integer("hidden_size", def.d, maxDim)
	m.FFN = f.integer("intermediate_size", def.ffn, maxDim)
	m.Layers = f.integer("num_hidden_layers", def.layers, maxLayers)
	m.Heads = f.integer("num_attention_heads", def.heads, maxHeads)
	m.KVHeads = f.integer("num_key_value_heads", def.kvHeads, maxHeads)
	if m.KVHeads == 0 {
		m.KVHeads = m.Heads
	}
	m.HeadDim = f.integer("head_dim", 0, maxDim)
	if m.HeadDim == 0 && m.Heads > 0 {
		m.HeadDim = m.DModel / m.Heads
	}
	m.MaxPositions = f.integer("max_position_embeddings", def.maxPos, maxSeq)
	m.NormEps = f.number("rms_norm_eps", def.eps, 0, 1)
	m.RopeTheta = f.number("rope_theta", def.theta, 1, 1e12)
	m.Dropout = f.number("attention_dropout", 0, 0, 0.999)
	m.SlidingWindow = f.integer("sliding_window", 0, maxSeq)
	m.DType = f.dtype()
	return m
}

// moe reads MixtralConfig, Qwen2MoeConfig and Qwen3MoeConfig.
func (f *fields) moe(arch string) *Model {
	m := f.decoder(arch)
	m.Tied = f.boolean("tie_word_embeddings", false)
	if arch == Mixtral {
		m.Experts = f.integer("num_local_experts", 8, maxHeads)
		m.ExpertsPerToken = f.integer("num_experts_per_tok", 2, maxHeads)
		m.ExpertFFN, m.NormTopK = m.FFN, true
		if f.number("router_jitter_noise", 0, 0, 1) > 0 {
			f.fail("router_jitter_noise", errors.New("the router's jitter is not modelled: give 0"))
		}
	} else {
		def := map[string][3]int{Qwen2MoE: {60, 4, 1408}, Qwen3MoE: {128, 8, 768}}[arch]
		m.Experts = f.integer("num_experts", def[0], maxHeads)
		m.ExpertsPerToken = f.integer("num_experts_per_tok", def[1], maxHeads)
		m.ExpertFFN = f.integer("moe_intermediate_size", def[2], maxDim)
		m.NormTopK = f.boolean("norm_topk_prob", false)
		if step := f.integer("decoder_sparse_step", 1, maxLayers); step != 1 {
			f.fail("decoder_sparse_step", fmt.Errorf("%d: dense layers between the sparse ones are not modelled (give 1)", step))
		}
		if v, ok := f.raw["mlp_only_layers"]; ok && string(v) != "null" && string(v) != "[]" {
			f.fail("mlp_only_layers", errors.New("dense layers among the sparse ones are not modelled (give [])"))
		}
		if !f.boolean("use_sliding_window", false) {
			m.SlidingWindow = 0 // Qwen's configs set sliding_window only with use_sliding_window
		}
	}
	if arch == Qwen2MoE {
		m.SharedExpertFFN = f.integer("shared_expert_intermediate_size", 5632, maxDim)
		m.QKVBias = true
	}
	if m.ExpertsPerToken > m.Experts {
		f.fail("num_experts_per_tok", fmt.Errorf("%d experts per token of %d experts", m.ExpertsPerToken, m.Experts))
	}
	aux := f.number("router_aux_loss_coef", 0.001, 0, 1e6)
	if f.boolean("output_router_logits", false) {
		m.RouterAuxLoss = aux
	}
	f.activation("hidden_act", "silu")
	return m
}

// gemma reads Gemma2Config and Gemma3TextConfig, a Gemma3ForConditionalGeneration's from its text_config.
func (f *fields) gemma(arch string) *Model {
	if arch == Gemma3MM {
		return f.gemma3Text()
	}
	m := f.decoder(arch)
	m.Tied = f.boolean("tie_word_embeddings", true)
	if m.HeadDim == m.DModel/max(m.Heads, 1) && f.raw["head_dim"] == nil {
		m.HeadDim = 256 // Gemma2Config's and Gemma3TextConfig's head_dim
	}
	m.QueryScale = f.number("query_pre_attn_scalar", 256, 1e-6, 1e9)
	if m.SlidingWindow == 0 {
		m.SlidingWindow = 4096
	}
	if arch == Gemma2 {
		m.AttnSoftcap = f.number("attn_logit_softcapping", 50, 0, 1e9)
		m.FinalSoftcap = f.number("final_logit_softcapping", 30, 0, 1e9)
		m.SlidingPattern = 2
	} else {
		m.AttnSoftcap = f.number("attn_logit_softcapping", 0, 0, 1e9)
		m.FinalSoftcap = f.number("final_logit_softcapping", 0, 0, 1e9)
		if m.AttnSoftcap != 0 || m.FinalSoftcap != 0 {
			f.fail("attn_logit_softcapping", errors.New("soft-capping is not modelled for Gemma 3 (give null)"))
		}
		m.SlidingPattern = f.integer("sliding_window_pattern", 6, maxLayers)
		m.LocalRopeTheta = f.number("rope_local_base_freq", 10000, 1, 1e12)
		m.RopeScaling = f.linearRopeScaling()
	}
	f.layerTypes(m)
	act := "hidden_activation"
	if _, ok := f.raw[act]; !ok {
		act = "hidden_act"
	}
	f.activation(act, "gelu_pytorch_tanh")
	return m
}

// gemma3Text reads a Gemma3ForConditionalGeneration config's text_config as a Gemma3ForCausalLM, with the
// top level's torch_dtype when the text config has none.
func (f *fields) gemma3Text() *Model {
	v, ok := f.raw["text_config"]
	var raw map[string]json.RawMessage
	if !ok || json.Unmarshal(v, &raw) != nil || raw == nil {
		f.fail("text_config", errors.New("want the text model's config object"))
		return &Model{Architecture: Gemma3}
	}
	sub := &fields{raw: raw}
	m := sub.gemma(Gemma3)
	if m.DType == "" {
		m.DType = f.dtype()
	}
	if _, ok := raw["tie_word_embeddings"]; !ok {
		m.Tied = f.boolean("tie_word_embeddings", true)
	}
	if pe := (*ParseError)(nil); errors.As(sub.err, &pe) {
		f.fail("text_config."+pe.Field, pe.Err)
	}
	m.TextOf = Gemma3MM
	return m
}

// layerTypes checks layer_types (transformers 4.53 and later) against the sliding pattern: each layer
// "sliding_attention" but every SlidingPattern-th, "full_attention".
func (f *fields) layerTypes(m *Model) {
	v, ok := f.raw["layer_types"]
	if !ok || string(v) == "null" {
		return
	}
	var types []string
	if err := json.Unmarshal(v, &types); err != nil {
		f.fail("layer_types", errors.New("want a list of attention types"))
		return
	}
	period := slices.Index(types, "full_attention") + 1
	for i, t := range types {
		global := period > 0 && (i+1)%period == 0
		if (t == "full_attention") != global || t != "full_attention" && t != "sliding_attention" {
			f.fail("layer_types", errors.New("only a full-attention layer every N layers is modelled"))
			return
		}
	}
	if period > 0 {
		m.SlidingPattern = period
	}
}

// linearRopeScaling returns rope_scaling's factor when its type is linear (1 when there is none).
func (f *fields) linearRopeScaling() float64 {
	v, ok := f.raw["rope_scaling"]
	if !ok || string(v) == "null" {
		return 1
	}
	var rp map[string]json.RawMessage
	if err := json.Unmarshal(v, &rp); err != nil {
		f.fail("rope_scaling", errors.New("want an object"))
		return 1
	}
	sub := &fields{raw: rp}
	factor := sub.number("factor", 1, 1e-6, 1e6)
	if pe := (*ParseError)(nil); errors.As(sub.err, &pe) {
		f.fail("rope_scaling."+pe.Field, pe.Err)
	}
	return factor
}

// phi3 reads Phi3Config.
func (f *fields) phi3() *Model {
	m := f.decoder(Phi3)
	m.Tied = f.boolean("tie_word_embeddings", false)
	m.ResidDropout = f.number("resid_pdrop", 0, 0, 0.999)
	if r := f.number("partial_rotary_factor", 1, 0, 1); r != 1 {
		f.fail("partial_rotary_factor", fmt.Errorf("%g: a partial rotary embedding is not modelled (give 1)", r))
	}
	if f.number("embd_pdrop", 0, 0, 0.999) != 0 {
		f.fail("embd_pdrop", errors.New("Phi3Model applies no embedding dropout in transformers 4.51: give 0"))
	}
	f.activation("hidden_act", "silu")
	return m
}

// bert reads BertConfig; the architecture says the task.
func (f *fields) bert(arch string) *Model {
	m := &Model{Architecture: BertMaskedLM}
	m.Task = "mlm"
	if arch == BertClassify {
		m.Architecture, m.Task = BertClassify, "classify"
	}
	m.Vocab = f.integer("vocab_size", 30522, maxVocab)
	m.DModel = f.integer("hidden_size", 768, maxDim)
	m.Layers = f.integer("num_hidden_layers", 12, maxLayers)
	m.Heads = f.integer("num_attention_heads", 12, maxHeads)
	m.KVHeads = m.Heads
	m.FFN = f.integer("intermediate_size", 3072, maxDim)
	m.MaxPositions = f.integer("max_position_embeddings", 512, maxSeq)
	m.TypeVocab = f.integer("type_vocab_size", 2, maxVocab)
	m.NormEps = f.number("layer_norm_eps", 1e-12, 0, 1)
	m.Dropout = f.number("hidden_dropout_prob", 0.1, 0, 0.999)
	m.AttnDropout = f.number("attention_probs_dropout_prob", 0.1, 0, 0.999)
	m.Tied = true
	m.Labels = f.integer("num_labels", 0, maxVocab)
	if m.Labels == 0 {
		m.Labels = 2 // PretrainedConfig's default: two labels
		if v, ok := f.raw["id2label"]; ok {
			var labels map[string]json.RawMessage
			if json.Unmarshal(v, &labels) == nil && len(labels) > 0 {
				m.Labels = len(labels)
			}
		}
	}
	if m.Heads > 0 {
		m.HeadDim = m.DModel / m.Heads
		if m.DModel%m.Heads != 0 {
			f.fail("num_attention_heads", fmt.Errorf("hidden_size %d is not divisible by %d heads", m.DModel, m.Heads))
		}
	}
	if pt := f.str("position_embedding_type", "absolute"); pt != "absolute" {
		f.fail("position_embedding_type", fmt.Errorf("%q: only absolute positions are modelled", pt))
	}
	f.activation("hidden_act", "gelu")
	m.DType = f.dtype()
	return m
}

// activation checks that the field names the activation the family's modules compute.
func (f *fields) activation(name, want string) {
	if act := f.str(name, want); act != want {
		f.fail(name, fmt.Errorf("%q: the model here computes %s", act, want))
	}
}

// familyParameters counts the parameters of a model of a family beside Llama's (false for the others):
// embeddings, each layer's projections, biases, experts and norms, the final norm and an untied head; for
// BERT, the embeddings and their LayerNorm, each layer's four projections and two LayerNorms, and the task's
// head (MLM: transform, its LayerNorm and the decoder's bias; classify: pooler and classifier).
func (m *Model) familyParameters() (int64, bool) {
	d, v, l := int64(m.DModel), int64(m.Vocab), int64(m.Layers)
	if m.Family() == "bert" {
		f := int64(m.FFN)
		layer := 4*(d*d+d) + d*f + f + f*d + d + 2*2*d
		n := (v+int64(m.MaxPositions)+int64(m.TypeVocab))*d + 2*d + l*layer
		if m.Task == "classify" {
			return n + d*d + d + d*int64(m.Labels) + int64(m.Labels), true
		}
		return n + d*d + d + 2*d + v, true
	}
	hd := int64(m.HeadDim)
	q, kv, f := int64(m.Heads)*hd, int64(m.KVHeads)*hd, int64(m.FFN)
	attention := d*q + 2*d*kv + q*d
	var layer int64
	switch m.Architecture {
	case Mixtral, Qwen2MoE, Qwen3MoE:
		e := int64(m.Experts)
		layer = attention + d*e + e*3*d*int64(m.ExpertFFN) + 2*d
		if m.QKVBias {
			layer += q + 2*kv
		}
		if m.Architecture == Qwen3MoE {
			layer += 2 * hd // q_norm, k_norm
		}
		if m.SharedExpertFFN > 0 {
			layer += 3*d*int64(m.SharedExpertFFN) + d
		}
	case Gemma2, Gemma3:
		layer = attention + 3*d*f + 4*d
		if m.Architecture == Gemma3 {
			layer += 2 * hd
		}
	case Phi3:
		layer = attention + 3*d*f + 2*d
	default:
		return 0, false
	}
	n := v*d + l*layer + d
	if !m.Tied {
		n += v * d
	}
	return n, true
}
