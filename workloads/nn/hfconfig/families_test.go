package hfconfig

import (
	"errors"
	"strings"
	"testing"
)

// TestPublishedFamilies checks what the published configs of the families beside Llama's give beyond the
// shape: experts, soft-capping, windows, the text model of a multimodal Gemma 3, BERT's task.
func TestPublishedFamilies(t *testing.T) {
	for name, want := range map[string]Extra{
		"mixtral-8x7b":  {Experts: 8, ExpertsPerToken: 2, ExpertFFN: 14336, NormTopK: true},
		"qwen3-30b-a3b": {Experts: 128, ExpertsPerToken: 8, ExpertFFN: 768, NormTopK: true},
		"gemma-2-9b":    {QueryScale: 256, AttnSoftcap: 50, FinalSoftcap: 30, SlidingWindow: 4096, SlidingPattern: 2},
		"gemma-3-4b": {QueryScale: 256, SlidingWindow: 1024, SlidingPattern: 6, LocalRopeTheta: 10000, RopeScaling: 8,
			TextOf: Gemma3MM},
		"gemma-3-12b": {QueryScale: 256, SlidingWindow: 1024, SlidingPattern: 6, LocalRopeTheta: 10000, RopeScaling: 8,
			TextOf: Gemma3MM},
		"phi-3-mini": {SlidingWindow: 2047},
		"phi-4":      {},
		"bert-base":  {TypeVocab: 2, Task: "mlm", Labels: 2, AttnDropout: 0.1},
		"bert-large": {TypeVocab: 2, Task: "mlm", Labels: 2, AttnDropout: 0.1},
	} {
		m, err := Published(name)
		if err != nil {
			t.Fatal(err)
		}
		if m.Extra != want {
			t.Errorf("%s: %+v, want %+v", name, m.Extra, want)
		}
	}
}

// TestGemma3TextParts holds the text models' counts against published figures of the whole models: the
// checkpoints' totals (Hugging Face's safetensors metadata of google/gemma-3-4b-it and gemma-3-12b-it) less
// the text model leave the same vision tower for both (one SigLIP encoder) plus the projector's 1152 x
// hidden_size weights and its 1152-wide norm; and keras-hub's text-only presets, whose vocabulary drops the
// 64 image-token rows of HF's 262,208, are the text model less 64 x hidden_size (testdata/published.md).
func TestGemma3TextParts(t *testing.T) {
	const vision = 1152 // the SigLIP tower's width, the projector's input
	var towers []int64
	for _, c := range []struct {
		name        string
		whole, text int64
	}{{"gemma-3-4b", 4_300_079_472, 3_880_099_328}, {"gemma-3-12b", 12_187_325_040, 11_765_788_416}} {
		m, err := Published(c.name)
		if err != nil {
			t.Fatal(err)
		}
		p, d := m.Parameters(), int64(m.DModel)
		if p-64*d != c.text {
			t.Errorf("%s: %d parameters less 64 image-token rows is %d, keras-hub's text model %d", c.name, p, p-64*d, c.text)
		}
		towers = append(towers, c.whole-p-vision*d-vision)
	}
	if towers[0] != towers[1] {
		t.Errorf("the checkpoints less their text models leave vision towers of %d and %d parameters", towers[0], towers[1])
	}
}

// TestFamilyRejects checks the one-line errors for what the families' modules do not model.
func TestFamilyRejects(t *testing.T) {
	for name, tc := range map[string]struct{ json, want string }{
		"dense layers between sparse":  {`{"architectures": ["Qwen2MoeForCausalLM"], "decoder_sparse_step": 2}`, "decoder_sparse_step"},
		"dense layers listed":          {`{"architectures": ["Qwen3MoeForCausalLM"], "mlp_only_layers": [0]}`, "mlp_only_layers"},
		"more experts than there are":  {`{"architectures": ["MixtralForCausalLM"], "num_local_experts": 2, "num_experts_per_tok": 3}`, "num_experts_per_tok"},
		"router jitter":                {`{"architectures": ["MixtralForCausalLM"], "router_jitter_noise": 0.1}`, "router_jitter_noise"},
		"partial rotary":               {`{"architectures": ["Phi3ForCausalLM"], "partial_rotary_factor": 0.5}`, "partial_rotary_factor"},
		"relative positions":           {`{"architectures": ["BertForMaskedLM"], "position_embedding_type": "relative_key"}`, "position_embedding_type"},
		"bert heads":                   {`{"architectures": ["BertForMaskedLM"], "hidden_size": 100, "num_attention_heads": 12}`, "num_attention_heads"},
		"gemma activation":             {`{"architectures": ["Gemma2ForCausalLM"], "hidden_activation": "gelu"}`, "hidden_activation"},
		"irregular layer types":        {`{"architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 3, "layer_types": ["full_attention", "sliding_attention", "full_attention"]}`, "layer_types"},
		"no text config":               {`{"architectures": ["Gemma3ForConditionalGeneration"]}`, "text_config"},
		"bad text config field":        {`{"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {"hidden_size": -1}}`, "text_config.hidden_size"},
		"gemma 3 soft-capping":         {`{"architectures": ["Gemma3ForCausalLM"], "final_logit_softcapping": 30}`, "soft-capping"},
		"unknown names the fields too": {`{"architectures": ["DeepseekV3ForCausalLM"]}`, "hidden_size, intermediate_size"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.json))
			if err == nil {
				t.Fatalf("no error for %s", tc.json)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line containing %q", err, tc.want)
			}
		})
	}
	_, err := Parse([]byte(`{"architectures": ["DeepseekV3ForCausalLM"]}`))
	if !errors.Is(err, ErrUnknownArchitecture) {
		t.Errorf("%v is not ErrUnknownArchitecture", err)
	}
}

// TestFamilyDefaults checks that absent fields take the configuration classes' defaults.
func TestFamilyDefaults(t *testing.T) {
	for arch, want := range map[string][4]int{ // vocab, experts, experts per token, expert width
		Mixtral: {32000, 8, 2, 14336}, Qwen2MoE: {151936, 60, 4, 1408}, Qwen3MoE: {151936, 128, 8, 768},
		Gemma2: {256000, 0, 0, 0}, Gemma3: {262208, 0, 0, 0}, Phi3: {32064, 0, 0, 0}, BertMaskedLM: {30522, 0, 0, 0},
	} {
		m, err := Parse([]byte(`{"architectures": ["` + arch + `"]}`))
		if err != nil {
			t.Fatal(err)
		}
		if got := [4]int{m.Vocab, m.Experts, m.ExpertsPerToken, m.ExpertFFN}; got != want {
			t.Errorf("%s defaults %v, want %v", arch, got, want)
		}
	}
}
