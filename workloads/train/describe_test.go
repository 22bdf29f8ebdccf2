package train

import "testing"

func TestModelName(t *testing.T) {
	qlora, err := PresetConfig("llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	qlora.LoRA, qlora.QLoRA, qlora.Weights = 16, true, WeightsBF16
	hf := DefaultMLP()
	hf.Model, hf.Architecture = "llama", "MistralForCausalLM"
	for want, cfg := range map[string]Config{
		"mlp":                        DefaultMLP(),
		"llama (MistralForCausalLM)": hf,
		"llama-3.1-8b [QLoRA r=16, bf16 weights]": qlora,
	} {
		if got := cfg.ModelName(); got != want {
			t.Errorf("ModelName() = %q, want %q", got, want)
		}
	}
}
