package train

import (
	"fmt"
	"strings"
)

// ModelName says what model the configuration trains, as reports name it: its preset or Hugging Face
// architecture, else its kind, with its adapters and weights dtype ("llama-3.1-8b [QLoRA r=16, bf16
// weights]"), and the settings and library releases that differ from the defaults.
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
	// What differs from the recipe's defaults: QLoRA's storage and preparation, the loss, the releases.
	if c.QLoRA && !c.QLoRADoubleQuant.On(true) {
		parts = append(parts, "no double quantization")
	}
	if c.QLoRA && c.QLoRAStorage != StorageUint8 {
		parts = append(parts, "stored in "+c.QLoRAStorage.String())
	}
	if half := c.Versions.QuantizesHalf(); c.QLoRA && c.QLoRAHalf.On(half) != half { // the release says the rest
		if half {
			parts = append(parts, "quantized in the weights' dtype")
		} else {
			parts = append(parts, "quantized from float16")
		}
	}
	if c.QLoRAHead {
		parts = append(parts, "4-bit lm_head")
	}
	if c.QLoRA && !c.kbitPrep() {
		parts = append(parts, "no kbit preparation")
	}
	if !c.Loss.IsZero() {
		parts = append(parts, c.Loss.String()+" loss")
	}
	if !c.Versions.IsZero() {
		parts = append(parts, strings.ReplaceAll(c.Versions.String(), ",", " "))
	}
	if len(parts) > 0 {
		name += " [" + strings.Join(parts, ", ") + "]"
	}
	return name
}
