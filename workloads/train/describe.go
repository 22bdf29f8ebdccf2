package train

import (
	"fmt"
	"strings"
)

// ModelName says what model the configuration trains, as reports name it: its preset or Hugging Face
// architecture, else its kind, with its adapters and weights dtype ("llama-3.1-8b [QLoRA r=16, bf16
// weights]").
func (c Config) ModelName() string {
	name := c.Model
	if c.Architecture != "" {
		name += " (" + c.Architecture + ")"
	}
	if c.Preset != "" {
		name = c.Preset
	}
	var parts []string
	if c.LoRA > 0 {
		kind := "LoRA"
		if c.QLoRA {
			kind = "QLoRA"
		}
		parts = append(parts, fmt.Sprintf("%s r=%d", kind, c.LoRA))
	}
	if c.Weights != WeightsF32 {
		parts = append(parts, c.Weights.String()+" weights")
	}
	if len(parts) > 0 {
		name += " [" + strings.Join(parts, ", ") + "]"
	}
	return name
}
