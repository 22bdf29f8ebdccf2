package train

import (
	"testing"

	"github.com/oomdbg/oomdbg/versions"
	"github.com/oomdbg/oomdbg/workloads/nn"
)

func TestModelName(t *testing.T) {
	qlora, err := PresetConfig("llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	qlora.LoRA, qlora.QLoRA, qlora.Weights = 16, true, WeightsBF16
	stacks := qlora
	stacks.QLoRADoubleQuant, stacks.QLoRAStorage, stacks.KbitPrep = ToggleOff, StorageBF16, ToggleOff
	stacks.Loss = LossSetting{Kind: nn.LossChunked, Chunk: 128}
	stacks.Versions, _ = versions.Parse("torch=2.3.1,bitsandbytes=0.42.0")
	lightning := qlora
	lightning.QLoRAHalf, lightning.QLoRAHead = ToggleOn, true
	hf := DefaultMLP()
	hf.Model, hf.Architecture = "llama", "MistralForCausalLM"
	for want, cfg := range map[string]Config{
		"mlp":                        DefaultMLP(),
		"llama (MistralForCausalLM)": hf,
		"llama-3.1-8b [QLoRA r=16, bf16 weights]":                                        qlora,
		"llama-3.1-8b [QLoRA r=16, bf16 weights, quantized from float16, 4-bit lm_head]": lightning,
		"llama-3.1-8b [QLoRA r=16, bf16 weights, no double quantization, stored in bf16, no kbit preparation, chunked:128 loss, torch=2.3.1 bitsandbytes=0.42.0]": stacks,
	} {
		if got := cfg.ModelName(); got != want {
			t.Errorf("ModelName() = %q, want %q", got, want)
		}
	}
}
