package train

import (
	"fmt"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// The settings of a Llama workload that users spell as words, parsed once as settings.go's are.

// Weights is the dtype a Llama's parameters are loaded in (--weights; from_pretrained's torch_dtype): f32,
// bf16 or fp16. The zero value is f32.
type Weights uint8

// The weights dtypes.
const (
	WeightsF32 Weights = iota
	WeightsBF16
	WeightsFP16
)

var weightsNames = []string{"f32", "bf16", "fp16"}

// ParseWeights reads a weights dtype: f32, bf16 or fp16 ("" is f32).
func ParseWeights(s string) (Weights, error) {
	i, err := parseWord(weightsNames, "weights", s)
	return Weights(i), err
}

func (w Weights) String() string                   { return nameOf(weightsNames, int(w), "weights") }
func (w Weights) MarshalText() ([]byte, error)     { return []byte(w.String()), nil }
func (w *Weights) UnmarshalText(text []byte) error { return parseInto(w, ParseWeights, text) }

// dtype is the parameters' tensor dtype.
func (w Weights) dtype() tensor.DType {
	switch w {
	case WeightsBF16:
		return tensor.BF16
	case WeightsFP16:
		return tensor.F16
	}
	return tensor.F32
}

// LoRATargets is the set of projections LoRA adapts (--lora-targets): some of q,k,v,o,gate,up,down (and
// Phi-3's qkv and gate_up), bit i standing for nn.LoRAProjections[i]. The empty set means peft's default for
// the model (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: q_proj and v_proj for the Llama family,
// Mixtral and Gemma, query and value for BERT; none for Qwen's mixtures of experts and Phi-3).
type LoRATargets uint16

// The sets the fixes use: peft's default for Llama (q, v) and every projection of a Llama-family layer, as
// QLoRA's recipe adapts them (Config.EveryProjection is the model's own).
var (
	DefaultLoRATargets = LoRATargets(1<<slices.Index(nn.LoRAProjections, "q") | 1<<slices.Index(nn.LoRAProjections, "v"))
	AllLoRATargets     = LoRATargets(1<<len(nn.LlamaProjections) - 1)
)

// ParseLoRATargets reads a comma-separated list of projections ("" is none).
func ParseLoRATargets(s string) (LoRATargets, error) {
	if s == "" {
		return 0, nil
	}
	var ts LoRATargets
	for _, t := range strings.Split(s, ",") {
		t = strings.TrimSpace(t)
		if t == allLinear {
			if ts&LoRAAllLinear != 0 {
				return 0, fmt.Errorf("lora target %q given twice", t)
			}
			ts |= LoRAAllLinear
			continue
		}
		i := slices.Index(nn.LoRAProjections, t)
		if i < 0 {
			return 0, fmt.Errorf("unknown lora target %q (want some of %s, or %s)", t, strings.Join(nn.LoRAProjections, ","), allLinear)
		}
		if ts&(1<<i) != 0 {
			return 0, fmt.Errorf("lora target %q given twice", t)
		}
		ts |= 1 << i
	}
	return ts, nil
}

func (l LoRATargets) String() string                   { return strings.Join(l.list(), ",") }
func (l LoRATargets) MarshalText() ([]byte, error)     { return []byte(l.String()), nil }
func (l *LoRATargets) UnmarshalText(text []byte) error { return parseInto(l, ParseLoRATargets, text) }

// list returns the projections in the set, in nn.LoRAProjections' order, then all-linear.
func (l LoRATargets) list() []string {
	var names []string
	for i, p := range nn.LoRAProjections {
		if l&(1<<i) != 0 {
			names = append(names, p)
		}
	}
	if l&LoRAAllLinear != 0 {
		names = append(names, allLinear)
	}
	return names
}

// LoRAAllLinear is peft's target_modules="all-linear": every linear layer of the model but its output layer
// (lm_head), the model's projections.
const LoRAAllLinear LoRATargets = 1 << 15

const allLinear = "all-linear"
