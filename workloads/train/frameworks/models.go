package frameworks

import (
	"path"
	"strings"
)

// presetNames are the model names the readers meet (Hugging Face model ids, LitGPT checkpoint
// directories, torchtune's model builders), lowercased, each with the preset of its shape; a name matches
// the first entry it starts with (after a "meta-" prefix is dropped), so that -Instruct, -hf and
// quantized checkpoints of a model find it.
var presetNames = []struct {
	prefix, preset, note string
}{
	{"llama-3.1-8b", "llama-3.1-8b", ""},
	{"llama-3-8b", "llama-3.1-8b", "Llama 3 8B has Llama 3.1 8B's shape (the preset's)"},
	{"llama-3.2-1b", "llama-3.2-1b", ""},
	{"llama-2-70b", "llama-2-70b", ""},
	{"llama-2-7b", "llama-2-7b", ""},
	{"mistral-7b", "mistral-7b", ""},
	{"mixtral-8x7b", "mixtral-8x7b", ""},
	{"qwen2.5-7b", "qwen2.5-7b", ""},
	{"qwen3-30b-a3b", "qwen3-30b-a3b", ""},
	{"tinyllama-1.1b", "tinyllama-1.1b", ""},
	{"smollm2-135m", "smollm2-135m", ""},
	{"gemma-2-9b", "gemma-2-9b", ""},
	{"gemma-3-4b", "gemma-3-4b", ""},
	{"gemma-3-12b", "gemma-3-12b", ""},
	{"phi-3-mini", "phi-3-mini", ""},
	{"phi-4", "phi-4", ""},
	{"bert-base", "bert-base", ""},
	{"bert-large", "bert-large", ""},
}

// torchtuneModels are torchtune's model builders (torchtune.models.<family>.<builder>, the lora_ and
// qlora_ prefixes dropped) and the names presetNames knows them by.
var torchtuneModels = map[string]string{
	"llama3_1_8b": "llama-3.1-8b", "llama3_8b": "llama-3-8b", "llama3_2_1b": "llama-3.2-1b",
	"llama2_7b": "llama-2-7b", "llama2_70b": "llama-2-70b", "mistral_7b": "mistral-7b",
	"qwen2_5_7b_base": "qwen2.5-7b", "qwen2_5_7b_instruct": "qwen2.5-7b", "phi3_mini": "phi-3-mini",
	"phi4_14b": "phi-4", "gemma2_9b": "gemma-2-9b",
}

// presetFor returns the preset of the model a configuration names (a model id, a checkpoint directory or a
// torchtune builder), and a note when the preset is another model of the same shape.
func presetFor(name string) (preset, note string, ok bool) {
	n := strings.ToLower(strings.TrimRight(strings.TrimSpace(name), "/"))
	if tt, found := torchtuneModels[n]; found {
		n = tt
	}
	n = strings.TrimPrefix(path.Base(n), "meta-")
	for _, p := range presetNames {
		if strings.HasPrefix(n, p.prefix) {
			return p.preset, p.note, true
		}
	}
	return "", "", false
}
