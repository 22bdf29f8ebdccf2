package train

import (
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/workloads/dist"
)

// Bounds on a Config's numbers: what a model, a device and a run can physically be, so that every size the
// runtime computes fits an int64 with room to spare and a run finishes. A configuration comes from flags or
// from a snapshot someone shared; either way it is checked against these before anything is allocated.
const (
	// MaxGPUMemory is the most device memory a run may simulate: 1 PiB, thousands of times today's largest
	// GPU, and well inside what the allocator model addresses (expandable segments reserve 9/8 of it).
	MaxGPUMemory = 1 << 50
	// MaxParameters is the most parameters a model may have: 2^42, about 4.4 trillion.
	MaxParameters = 1 << 42
	// MaxTensorElements is the most elements one tensor may have: 2^46, 256 TiB as float32.
	MaxTensorElements = 1 << 46
	// MaxSteps bounds the steps and the evaluation interval: iterations are recorded as int32.
	MaxSteps = math.MaxInt32
	// MaxAccum bounds gradient accumulation: micro-batches per optimizer step.
	MaxAccum = 1 << 16
)

// FieldError is a Config field that holds a number it cannot hold. Field is the field's JSON name.
type FieldError struct {
	Field  string
	Value  any
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s %v: %s", e.Field, e.Value, e.Reason) }

// validateNumbers checks every numeric field of c, for the model c names, and the sizes they imply.
func (c *Config) validateNumbers() error {
	type check struct {
		field string
		value int
		min   int
	}
	var checks []check
	switch c.Model {
	case "mlp":
		checks = []check{{"in_features", c.InFeatures, 1}, {"hidden", c.Hidden, 1}, {"layers", c.Layers, 1}, {"classes", c.Classes, 2}}
	case "gpt":
		checks = []check{{"seq", c.Seq, 1}, {"d_model", c.DModel, 1}, {"heads", c.Heads, 1}, {"layers", c.Layers, 1}, {"vocab", c.Vocab, 2}}
	case "llama":
		checks = []check{{"seq", c.Seq, 1}, {"d_model", c.DModel, 1}, {"heads", c.Heads, 1}, {"layers", c.Layers, 1}, {"vocab", c.Vocab, 2},
			{"ffn", c.FFN, 1}, {"kv_heads", c.KVHeads, 0}, {"head_dim", c.HeadDim, 0}, {"lora", c.LoRA, 0}}
	case "bert":
		checks = []check{{"seq", c.Seq, 1}, {"d_model", c.DModel, 1}, {"heads", c.Heads, 1}, {"layers", c.Layers, 1}, {"vocab", c.Vocab, 2},
			{"ffn", c.FFN, 1}, {"lora", c.LoRA, 0}}
	}
	checks = append(checks, check{"batch", c.Batch, 1}, check{"accum", c.Accum, 1}, check{"steps", c.Steps, 0}, check{"eval_every", c.EvalEvery, 0})
	for _, ch := range checks {
		if ch.value < ch.min {
			return &FieldError{ch.field, ch.value, fmt.Sprintf("must be at least %d", ch.min)}
		}
	}
	switch {
	case c.Accum > MaxAccum:
		return &FieldError{"accum", c.Accum, fmt.Sprintf("is more micro-batches per step than any run takes (at most %d)", MaxAccum)}
	case c.Steps > MaxSteps:
		return &FieldError{"steps", c.Steps, fmt.Sprintf("is more than %d", MaxSteps)}
	case c.EvalEvery > MaxSteps:
		return &FieldError{"eval_every", c.EvalEvery, fmt.Sprintf("is more than %d", MaxSteps)}
	case c.Model == "gpt" && c.DModel%c.Heads != 0:
		return &FieldError{"heads", c.Heads, fmt.Sprintf("does not divide d_model %d", c.DModel)}
	case c.Model != "mlp" && (c.Dropout < 0 || c.Dropout >= 1 || c.Dropout != c.Dropout):
		return &FieldError{"dropout", c.Dropout, "is not a probability in [0, 1)"}
	case c.LoRADropout < 0 || c.LoRADropout >= 1 || c.LoRADropout != c.LoRADropout:
		return &FieldError{"lora_dropout", c.LoRADropout, "is not a probability in [0, 1)"}
	case !finite(c.LoRAAlpha) || c.LoRAAlpha < 0:
		return &FieldError{"lora_alpha", c.LoRAAlpha, "must be a finite number >= 0"}
	case !finite(c.NormEps) || c.NormEps < 0 || c.NormEps >= 1:
		return &FieldError{"norm_eps", c.NormEps, "must be a finite number in [0, 1)"}
	case math.IsNaN(c.RopeTheta) || c.RopeTheta < 0 || c.RopeTheta > 1e12:
		return &FieldError{"rope_theta", c.RopeTheta, "must be a number in [0, 1e12]"}
	case !finite(c.LR) || c.LR < 0:
		return &FieldError{"lr", c.LR, "must be a finite number >= 0"}
	case !finite(c.WeightDecay) || c.WeightDecay < 0:
		return &FieldError{"weight_decay", c.WeightDecay, "must be a finite number >= 0"}
	case c.GPUMemory > MaxGPUMemory:
		return &FieldError{"gpu_memory", c.GPUMemory, fmt.Sprintf("is more than the %d bytes (1 PiB) a run may simulate", uint64(MaxGPUMemory))}
	case c.GPUMemory <= c.ContextReserve:
		return &FieldError{"context_reserve", c.ContextReserve, "must be less than the gpu memory, " + units.FormatSizeExact(c.GPUMemory)}
	}
	if err := c.Family.validateNumbers(); err != nil {
		return err
	}
	if err := c.Parallel.Validate(); err != nil {
		var se *dist.SettingError
		if errors.As(err, &se) {
			return &FieldError{"parallel." + se.Field, se.Value, se.Reason}
		}
		return err
	}
	if field, n := c.largestTensor(); n > MaxTensorElements {
		return &FieldError{field, c.value(field), fmt.Sprintf("makes a tensor of more than %d elements (at most 2^46)", uint64(MaxTensorElements))}
	}
	if field, n := c.parameterBound(); n > MaxParameters {
		return &FieldError{field, c.value(field), fmt.Sprintf("gives the model more than %d parameters (at most 2^42, 4.4 trillion)", uint64(MaxParameters))}
	}
	return nil
}

func finite(f float32) bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }

// value returns the number in the field named by its JSON name, for messages.
func (c *Config) value(field string) int {
	return map[string]int{"in_features": c.InFeatures, "hidden": c.Hidden, "layers": c.Layers, "classes": c.Classes,
		"seq": c.Seq, "d_model": c.DModel, "heads": c.Heads, "vocab": c.Vocab, "batch": c.Batch, "ffn": c.FFN,
		"head_dim": c.HeadDim, "lora": c.LoRA, "family.experts": c.Family.Experts, "family.expert_ffn": c.Family.ExpertFFN,
		"family.max_positions": c.Family.MaxPositions}[field]
}

// Bounds on a family's numbers, far above any published model's.
const (
	maxExperts    = 1 << 12
	maxFamilyDim  = 1 << 20 // widths, windows, positions, labels
	maxFamilyReal = 1e12    // scales, soft-caps, rope bases
)

// validateNumbers checks every number of a family's shape.
func (f *FamilyShape) validateNumbers() error {
	for _, ch := range []struct {
		field string
		value int
		limit int
	}{{"experts", f.Experts, maxExperts}, {"experts_per_token", f.ExpertsPerToken, maxExperts},
		{"expert_ffn", f.ExpertFFN, maxFamilyDim}, {"shared_expert_ffn", f.SharedExpertFFN, maxFamilyDim},
		{"sliding_window", f.SlidingWindow, MaxSeqLength}, {"sliding_pattern", f.SlidingPattern, maxFamilyDim},
		{"max_positions", f.MaxPositions, MaxSeqLength}, {"type_vocab", f.TypeVocab, maxFamilyDim}, {"labels", f.Labels, maxFamilyDim}} {
		if ch.value < 0 || ch.value > ch.limit {
			return &FieldError{"family." + ch.field, ch.value, fmt.Sprintf("is not in [0, %d]", ch.limit)}
		}
	}
	for _, ch := range []struct {
		field string
		value float64
		limit float64
	}{{"router_aux_loss", float64(f.RouterAuxLoss), maxFamilyReal}, {"query_scale", f.QueryScale, maxFamilyReal},
		{"attn_softcap", float64(f.AttnSoftcap), maxFamilyReal}, {"final_softcap", float64(f.FinalSoftcap), maxFamilyReal},
		{"local_rope_theta", f.LocalRopeTheta, maxFamilyReal}, {"rope_scaling", f.RopeScaling, maxFamilyReal},
		{"resid_dropout", float64(f.ResidDropout), 0.999}, {"attn_dropout", float64(f.AttnDropout), 0.999}} {
		if math.IsNaN(ch.value) || ch.value < 0 || ch.value > ch.limit {
			return &FieldError{"family." + ch.field, ch.value, fmt.Sprintf("is not a number in [0, %g]", ch.limit)}
		}
	}
	return nil
}

// mul multiplies non-negative numbers, saturating at the largest uint64 instead of wrapping.
func mul(xs ...int) uint64 {
	p := uint64(1)
	for _, x := range xs {
		hi, lo := bits.Mul64(p, uint64(x))
		if hi != 0 {
			return math.MaxUint64
		}
		p = lo
	}
	return p
}

// add adds, saturating.
func add(xs ...uint64) uint64 {
	var s uint64
	for _, x := range xs {
		var carry uint64
		if s, carry = bits.Add64(s, x, 0); carry != 0 {
			return math.MaxUint64
		}
	}
	return s
}

// largestTensor returns the elements of the largest tensor the model makes, an upper bound, and the field
// that contributes most to it. The inputs to mul are at least 1 here.
func (c *Config) largestTensor() (field string, elements uint64) {
	type t struct {
		field string
		n     uint64
	}
	var ts []t
	switch c.Model {
	case "mlp":
		ts = []t{
			{widest(c, "batch", "in_features", "hidden", "classes"), mul(c.Batch, max(c.InFeatures, c.Hidden, c.Classes))}, // activations
			{widest(c, "in_features", "hidden"), mul(c.Hidden, max(c.InFeatures, c.Hidden))},                               // weights
			{widest(c, "hidden", "classes"), mul(c.Hidden, c.Classes)},
		}
	case "gpt":
		ts = []t{
			{widest(c, "batch", "seq", "d_model"), mul(c.Batch, c.Seq, 4, c.DModel)},  // the MLP's hidden activations
			{widest(c, "batch", "seq", "vocab"), mul(c.Batch, c.Seq, c.Vocab)},        // logits
			{widest(c, "batch", "heads", "seq"), mul(c.Batch, c.Heads, c.Seq, c.Seq)}, // attention scores
			{widest(c, "vocab", "d_model"), mul(c.Vocab, c.DModel)},                   // the embedding
		}
	}
	if c.Model == "bert" {
		ts = []t{
			{widest(c, "batch", "seq", "ffn"), mul(c.Batch, c.Seq, c.FFN)},            // the intermediate activations
			{widest(c, "batch", "seq", "vocab"), mul(c.Batch, c.Seq, c.Vocab)},        // the MLM head's scores
			{widest(c, "batch", "heads", "seq"), mul(c.Batch, c.Heads, c.Seq, c.Seq)}, // eager attention's scores
			{widest(c, "vocab", "d_model"), mul(c.Vocab, c.DModel)},                   // the embedding
			{widest(c, "ffn", "d_model"), mul(c.FFN, c.DModel)},                       // a weight
			{"family.max_positions", mul(c.Family.MaxPositions, c.DModel)},            // the position embeddings
		}
	}
	if c.Model == "llama" {
		hd := max(c.HeadDim, 1)
		if c.HeadDim == 0 {
			hd = max(c.DModel/c.Heads, 1)
		}
		ts = []t{
			{widest(c, "batch", "seq", "ffn"), mul(c.Batch, c.Seq, c.FFN)},            // the MLP's activations
			{widest(c, "batch", "seq", "vocab"), mul(c.Batch, c.Seq, c.Vocab)},        // logits
			{widest(c, "batch", "heads", "seq"), mul(c.Batch, c.Heads, c.Seq, c.Seq)}, // eager attention's scores
			{widest(c, "vocab", "d_model"), mul(c.Vocab, c.DModel)},                   // the embedding
			{widest(c, "ffn", "d_model"), mul(c.FFN, c.DModel)},                       // an MLP weight
			{widest(c, "heads", "head_dim", "d_model"), mul(c.Heads, hd, c.DModel)},   // q_proj
		}
		if f := c.Family; f.Experts > 0 { // the router's one-hot mask, and the auxiliary loss's of every layer
			ts = append(ts, t{"family.experts", mul(c.Batch, c.Seq, f.ExpertsPerToken, f.Experts)},
				t{"family.expert_ffn", mul(c.Batch, c.Seq, f.ExpertFFN, f.ExpertsPerToken)})
			if f.RouterAuxLoss > 0 {
				ts = append(ts, t{"family.experts", mul(c.Layers, c.Batch, c.Seq, f.ExpertsPerToken, f.Experts)})
			}
		}
	}
	for _, x := range ts {
		if x.n > elements {
			field, elements = x.field, x.n
		}
	}
	return field, elements
}

// parameterBound returns an upper bound of the model's parameters, and the field that contributes most.
func (c *Config) parameterBound() (field string, params uint64) {
	switch c.Model {
	case "mlp":
		params = add(mul(c.InFeatures, c.Hidden), mul(c.Layers, c.Hidden, c.Hidden), mul(c.Hidden, c.Classes), mul(c.Layers+2, c.Hidden), mul(1, c.Classes))
		return widest(c, "hidden", "in_features", "classes", "layers"), params
	case "gpt":
		// Embeddings, then per block 12 d^2 for attention and MLP weights and 13 d for biases and norms.
		params = add(mul(c.Vocab, c.DModel), mul(c.Seq, c.DModel), mul(c.Layers, 12, c.DModel, c.DModel), mul(c.Layers, 13, c.DModel), mul(2, c.DModel))
		return widest(c, "d_model", "vocab", "layers", "seq"), params
	case "llama":
		// Two embeddings (untied), per layer the projections (each of q, o at most heads x head_dim x d_model,
		// k, v no more), the MLP's three and their adapters, and the norms.
		hd := c.HeadDim
		if hd == 0 {
			hd = c.DModel / c.Heads
		}
		attn := mul(4, c.Heads, hd, c.DModel)
		mlp := mul(3, c.FFN, c.DModel)
		adapters := mul(7, c.LoRA, 2, c.Heads*hd+c.FFN+c.DModel)
		if f := c.Family; f.Experts > 0 { // every expert, the router and a shared expert
			mlp = add(mul(3, f.ExpertFFN, c.DModel, f.Experts), mul(f.Experts, c.DModel), mul(3, f.SharedExpertFFN, c.DModel))
			adapters = mul(4+3*(f.Experts+1), c.LoRA, 2, c.Heads*hd+max(c.FFN, f.ExpertFFN)+c.DModel)
		}
		params = add(mul(2, c.Vocab, c.DModel), mul(c.Layers, 1), add(mul(uint64ToInt(attn), c.Layers), mul(uint64ToInt(mlp), c.Layers),
			mul(uint64ToInt(adapters), c.Layers)), mul(c.Layers+1, 4, c.DModel))
		return widest(c, "d_model", "vocab", "layers", "ffn", "lora"), params
	case "bert":
		// Word, position and type embeddings; per layer four d^2 projections, the FFN's two and their
		// adapters, biases and norms; the heads.
		emb := mul(c.Vocab+c.Family.MaxPositions+c.Family.TypeVocab, c.DModel)
		layer := add(mul(4, c.DModel, c.DModel), mul(2, c.FFN, c.DModel), mul(6, c.LoRA, 2, c.DModel+c.FFN), mul(10, c.DModel), mul(1, c.FFN))
		params = add(emb, mul(uint64ToInt(layer), c.Layers), mul(2, c.DModel, c.DModel), mul(c.DModel, c.Family.Labels+4), mul(1, c.Vocab))
		return widest(c, "d_model", "vocab", "layers", "ffn", "lora"), params
	}
	return "", 0
}

// uint64ToInt converts a saturated product back for mul, keeping saturation.
func uint64ToInt(n uint64) int {
	if n > math.MaxInt {
		return math.MaxInt
	}
	return int(n)
}

// widest returns the field among fields with the largest value: the one to name when their product is too
// large.
func widest(c *Config, fields ...string) string {
	best := fields[0]
	for _, f := range fields[1:] {
		if c.value(f) > c.value(best) {
			best = f
		}
	}
	return best
}
