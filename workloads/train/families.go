package train

import (
	"fmt"
	"strings"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// The families beside Llama's: the decoders HF writes from Llama's modules (model llama, the Architecture
// naming which: Mixtral, Qwen2-MoE, Qwen3-MoE, Gemma 2 and 3, Phi-3) and BERT's encoders (model bert). Their
// shape beyond Llama's comes from a preset or --hf-config, in FamilyShape.

// FamilyShape is what a family beside Llama's adds to the shape (hfconfig.Extra's fields, as the run
// builds them).
type FamilyShape struct {
	// Mixtures of experts: experts, experts per token, each expert's width, Qwen2-MoE's shared expert's,
	// Qwen's norm_topk_prob, and router_aux_loss_coef when the router logits are output (0: they are not).
	Experts         int     `json:"experts,omitempty"`
	ExpertsPerToken int     `json:"experts_per_token,omitempty"`
	ExpertFFN       int     `json:"expert_ffn,omitempty"`
	SharedExpertFFN int     `json:"shared_expert_ffn,omitempty"`
	NormTopK        bool    `json:"norm_topk,omitempty"`
	RouterAuxLoss   float32 `json:"router_aux_loss,omitempty"`
	// Gemma: query_pre_attn_scalar, the soft-caps, the sliding window and pattern, the local rope base and a
	// linear rope scaling; SlidingWindow is also Mixtral's and Phi-3's (the mask's values only).
	QueryScale     float64 `json:"query_scale,omitempty"`
	AttnSoftcap    float32 `json:"attn_softcap,omitempty"`
	FinalSoftcap   float32 `json:"final_softcap,omitempty"`
	SlidingWindow  int     `json:"sliding_window,omitempty"`
	SlidingPattern int     `json:"sliding_pattern,omitempty"`
	LocalRopeTheta float64 `json:"local_rope_theta,omitempty"`
	RopeScaling    float64 `json:"rope_scaling,omitempty"`
	// ResidDropout is Phi-3's resid_pdrop.
	ResidDropout float32 `json:"resid_dropout,omitempty"`
	// BERT: max_position_embeddings (the longest sequence), type_vocab_size, num_labels (classify) and
	// attention_probs_dropout_prob (Config.Dropout is hidden_dropout_prob).
	MaxPositions int     `json:"max_positions,omitempty"`
	TypeVocab    int     `json:"type_vocab,omitempty"`
	Labels       int     `json:"labels,omitempty"`
	AttnDropout  float32 `json:"attn_dropout,omitempty"`
}

// families maps the architectures of the decoders beside Llama's to the family the runtime builds.
var families = map[string]nn.Family{
	hfconfig.Mixtral: nn.FamilyMixtral, hfconfig.Qwen2MoE: nn.FamilyQwen2MoE, hfconfig.Qwen3MoE: nn.FamilyQwen3MoE,
	hfconfig.Gemma2: nn.FamilyGemma2, hfconfig.Gemma3: nn.FamilyGemma3, hfconfig.Phi3: nn.FamilyPhi3,
}

// family returns the decoder family of a llama configuration's architecture, "" for the Llama family itself.
func (c *Config) family() nn.Family {
	if c.Model != "llama" {
		return ""
	}
	return families[c.Architecture]
}

// HF reports whether the model is a Hugging Face transformers model (a llama-lineage decoder or a BERT):
// the one whose weights' dtype, LoRA and QLoRA the run sets.
func (c *Config) HF() bool { return c.Model == "llama" || c.Model == "bert" }

// MoE reports whether the model is a mixture of experts.
func (c *Config) MoE() bool { return c.family().MoE() }

// projections returns the short names of the model's projections LoRA may adapt.
func (c *Config) projections() []string {
	switch {
	case c.Model == "bert":
		return nn.BertProjections
	case c.family() != "":
		return c.family().Projections()
	}
	return nn.LlamaProjections
}

// defaultLoRATargets returns peft's default target modules for the model, or nil where peft has none.
func (c *Config) defaultLoRATargets() []string {
	if f := c.family(); f != "" {
		return f.DefaultLoRATargets()
	}
	return []string{"q", "v"} // llama, mistral, qwen2 and bert: q_proj/query, v_proj/value
}

// EveryProjection returns the set of all the model's projections LoRA may adapt, as the QLoRA recipe adapts
// them: Llama's seven, Phi-3's fused four, BERT's six.
func (c *Config) EveryProjection() LoRATargets {
	var ts LoRATargets
	for _, p := range c.projections() {
		ts |= 1 << indexOf(nn.LoRAProjections, p)
	}
	return ts
}

func indexOf(xs []string, x string) int {
	for i, y := range xs {
		if y == x {
			return i
		}
	}
	return -1
}

// decoderConfig returns the model configuration of a validated configuration of a decoder family.
func (c *Config) decoderConfig() nn.DecoderConfig {
	f := c.Family
	return nn.DecoderConfig{LlamaConfig: c.llamaConfig(), Family: c.family(), Experts: f.Experts,
		ExpertsPerToken: f.ExpertsPerToken, ExpertFFN: f.ExpertFFN, SharedExpertFFN: f.SharedExpertFFN,
		NormTopK: f.NormTopK, RouterAuxLoss: f.RouterAuxLoss, QueryScale: f.QueryScale, AttnSoftcap: f.AttnSoftcap,
		FinalSoftcap: f.FinalSoftcap, SlidingWindow: f.SlidingWindow, SlidingPattern: f.SlidingPattern,
		LocalRopeTheta: f.LocalRopeTheta, RopeScaling: f.RopeScaling, ResidDropout: f.ResidDropout}
}

// bertConfig returns the model configuration of a validated bert configuration.
func (c *Config) bertConfig() nn.BertConfig {
	dtype := c.Weights.dtype()
	if c.QLoRA && c.Weights == WeightsF32 {
		dtype = tensor.BF16
	}
	attention := "naive"
	if c.Attention == knob.AttentionFlash {
		attention = "flash"
	}
	m := nn.BertConfig{Vocab: c.Vocab, DModel: c.DModel, Layers: c.Layers, Heads: c.Heads, FFN: c.FFN,
		MaxPositions: c.Family.MaxPositions, TypeVocab: c.Family.TypeVocab, Task: c.Task.String(), Labels: c.Family.Labels,
		NormEps: c.NormEps, HiddenDropout: c.Dropout, AttnDropout: c.Family.AttnDropout, Attention: attention,
		DType: dtype, QLoRA: c.QLoRA}
	if c.QLoRA {
		m.Quant = c.quant4()
	}
	if c.LoRA > 0 {
		lc := c.loraConfig()
		m.Adapter = &lc
	}
	return m
}

// validateFamily checks a family's shape and how it combines with the rest (validateNumbers has checked
// each number).
func (c *Config) validateFamily() error {
	f := c.Family
	switch fam := c.family(); {
	case c.Model == "llama" && fam == "" && c.Architecture != "" && !isLlamaArchitecture(c.Architecture):
		return fmt.Errorf("architecture %q: oomdbg builds %s", c.Architecture, strings.Join(hfconfig.Architectures, ", "))
	case fam.MoE() && (f.Experts < 1 || f.ExpertsPerToken < 1 || f.ExpertsPerToken > f.Experts || f.ExpertFFN < 1):
		return fmt.Errorf("%s needs experts >= experts per token >= 1 and an expert width (got %d, %d, %d)",
			c.Architecture, f.Experts, f.ExpertsPerToken, f.ExpertFFN)
	case fam == nn.FamilyQwen2MoE && f.SharedExpertFFN < 1:
		return fmt.Errorf("%s needs a shared expert width", c.Architecture)
	case fam.Gemma() && (f.QueryScale <= 0 || f.SlidingWindow < 1 || f.SlidingPattern < 1):
		return fmt.Errorf("%s needs query_pre_attn_scalar, a sliding window and its pattern", c.Architecture)
	case !fam.MoE() && (f.Experts != 0 || f.RouterAuxLoss != 0):
		return fmt.Errorf("experts and the router's auxiliary loss apply to a mixture of experts")
	case !fam.MoE() && !c.Routing.IsZero():
		return fmt.Errorf("routing applies to a mixture of experts")
	case c.Model == "bert" && (f.MaxPositions < 1 || f.TypeVocab < 1):
		return fmt.Errorf("bert needs max positions and a type vocabulary")
	case c.Model == "bert" && c.Seq > f.MaxPositions:
		return &FieldError{"seq", c.Seq, fmt.Sprintf("is longer than the %d position embeddings", f.MaxPositions)}
	case c.Model == "bert" && c.Task == TaskClassify && f.Labels < 1:
		return fmt.Errorf("classification needs labels")
	case c.Model != "bert" && c.Task != TaskMLM:
		return fmt.Errorf("task applies to bert")
	}
	if c.MoE() {
		return c.Routing.check(f.Experts)
	}
	return nil
}

func isLlamaArchitecture(a string) bool {
	return a == hfconfig.Llama || a == hfconfig.Mistral || a == hfconfig.Qwen2
}

// Task is what a BERT model trains for (--task): mlm (BertForMaskedLM, the zero value) or classify
// (BertForSequenceClassification).
type Task uint8

// The tasks.
const (
	TaskMLM Task = iota
	TaskClassify
)

var taskNames = []string{"mlm", "classify"}

// ParseTask reads a task: mlm or classify ("" is mlm).
func ParseTask(s string) (Task, error) {
	if s == "" {
		return TaskMLM, nil
	}
	i, err := parseWord(taskNames, "task", s)
	return Task(i), err
}

func (t Task) String() string                   { return nameOf(taskNames, int(t), "task") }
func (t Task) MarshalText() ([]byte, error)     { return []byte(t.String()), nil }
func (t *Task) UnmarshalText(text []byte) error { return parseInto(t, ParseTask, text) }

// IsZero reports whether t is mlm, so that a configuration's JSON leaves it out.
func (t Task) IsZero() bool { return t == TaskMLM }

// ExpertLoad is the busiest expert a run saw: in a mixture-of-experts layer, the tokens one expert got in a
// forward, of the tokens routed (tokens x experts per token), and the experts sharing them.
type ExpertLoad struct {
	Layer   int
	Tokens  int // the busiest expert's
	Routed  int
	Experts int
}

// Share returns the busiest expert's tokens over an even share (1 is a perfect balance).
func (l ExpertLoad) Share() float64 {
	if l.Routed == 0 {
		return 0
	}
	return float64(l.Tokens) * float64(l.Experts) / float64(l.Routed)
}

// noteRoute keeps the busiest expert of a layer's forward when it beats the run's.
func (r *run) noteRoute(layer int, perExpert []int) {
	var top, routed int
	for _, n := range perExpert {
		top, routed = max(top, n), routed+n
	}
	if top > r.res.ExpertLoad.Tokens {
		r.res.ExpertLoad = ExpertLoad{Layer: layer, Tokens: top, Routed: routed, Experts: len(perExpert)}
	}
}

// fromHFFamily fills the family fields of a configuration made from a config.json.
func fromHFFamily(c *Config, m *hfconfig.Model) {
	e := m.Extra
	c.Family = FamilyShape{Experts: e.Experts, ExpertsPerToken: e.ExpertsPerToken, ExpertFFN: e.ExpertFFN,
		SharedExpertFFN: e.SharedExpertFFN, NormTopK: e.NormTopK, RouterAuxLoss: float32(e.RouterAuxLoss),
		QueryScale: e.QueryScale, AttnSoftcap: float32(e.AttnSoftcap), FinalSoftcap: float32(e.FinalSoftcap),
		SlidingWindow: e.SlidingWindow, SlidingPattern: e.SlidingPattern, LocalRopeTheta: e.LocalRopeTheta,
		RopeScaling: e.RopeScaling, ResidDropout: float32(e.ResidDropout)}
	if c.Family.RopeScaling == 1 {
		c.Family.RopeScaling = 0
	}
}

// fromHFBert returns the configuration of a BERT model read from a config.json, trained as HF Trainer runs
// it by default: float32 weights, sdpa attention, AdamW, batch 8 of the model's context (512 tokens).
func fromHFBert(m *hfconfig.Model) Config {
	c := Config{Model: "bert", Architecture: m.Architecture, Layers: m.Layers, Heads: m.Heads, DModel: m.DModel,
		FFN: m.FFN, Vocab: m.Vocab, Tied: true, NormEps: float32(m.NormEps), Dropout: float32(m.Dropout),
		Seq: m.MaxPositions, Weights: map[string]Weights{"bfloat16": WeightsBF16, "float16": WeightsFP16}[m.DType],
		Family: FamilyShape{MaxPositions: m.MaxPositions, TypeVocab: m.TypeVocab, Labels: m.Labels,
			AttnDropout: float32(m.AttnDropout)}}
	if m.Task == "classify" {
		c.Task = TaskClassify
	}
	return trainerDefaults(c, 8)
}
