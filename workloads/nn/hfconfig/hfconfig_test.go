package hfconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// publishedShapes are the shapes the published config.json files give.
var publishedShapes = map[string]struct {
	d, layers, heads, kvHeads, ffn, vocab, headDim int
	tied, qkvBias                                  bool
}{
	"llama-3.2-1b":   {2048, 16, 32, 8, 8192, 128256, 64, true, false},
	"llama-3.1-8b":   {4096, 32, 32, 8, 14336, 128256, 128, false, false},
	"llama-2-7b":     {4096, 32, 32, 32, 11008, 32000, 128, false, false},
	"llama-2-70b":    {8192, 80, 64, 8, 28672, 32000, 128, false, false},
	"mistral-7b":     {4096, 32, 32, 8, 14336, 32000, 128, false, false},
	"qwen2.5-7b":     {3584, 28, 28, 4, 18944, 152064, 128, false, true},
	"tinyllama-1.1b": {2048, 22, 32, 4, 5632, 32000, 64, false, false},
	"smollm2-135m":   {576, 30, 9, 3, 1536, 49152, 64, true, false},
	"mixtral-8x7b":   {4096, 32, 32, 8, 14336, 32000, 128, false, false},
	"qwen3-30b-a3b":  {2048, 48, 32, 4, 6144, 151936, 128, false, false},
	"gemma-2-9b":     {3584, 42, 16, 8, 14336, 256000, 256, true, false},
	"gemma-3-4b":     {2560, 34, 8, 4, 10240, 262208, 256, true, false},
	"gemma-3-12b":    {3840, 48, 16, 8, 15360, 262208, 256, true, false},
	"phi-3-mini":     {3072, 32, 32, 32, 8192, 32064, 96, false, false},
	"phi-4":          {5120, 40, 40, 10, 17920, 100352, 128, false, false},
	"bert-base":      {768, 12, 12, 12, 3072, 30522, 64, true, false},
	"bert-large":     {1024, 24, 16, 16, 4096, 30522, 64, true, false},
}

// PublishedFigures reads testdata/published.json: the exact parameter counts of the published
// checkpoints (testdata/published.md says where each comes from). They are not derived from this package.
func PublishedFigures(t testing.TB) map[string]int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "published.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]int64
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestPublishedConfigs(t *testing.T) {
	figures := PublishedFigures(t)
	names := PublishedNames()
	if len(names) != len(publishedShapes) || len(names) != len(figures) {
		t.Errorf("%d published configs, %d shapes, %d figures", len(names), len(publishedShapes), len(figures))
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			m, err := Published(name)
			if err != nil {
				t.Fatal(err)
			}
			want, ok := publishedShapes[name]
			if !ok {
				t.Fatalf("no published shape for %s", name)
			}
			got := [...]int{m.DModel, m.Layers, m.Heads, m.KVHeads, m.FFN, m.Vocab, m.HeadDim}
			if got != [...]int{want.d, want.layers, want.heads, want.kvHeads, want.ffn, want.vocab, want.headDim} ||
				m.Tied != want.tied || m.QKVBias != want.qkvBias {
				t.Errorf("shape %+v", m)
			}
			if p := m.Parameters(); p != figures[name] {
				t.Errorf("%d parameters, published %d", p, figures[name])
			}
		})
	}
}

func TestGPT2Config(t *testing.T) {
	// openai-community/gpt2's config.json (the fields it sets); 124,439,808 parameters with tied embeddings.
	m, err := Parse([]byte(`{"architectures": ["GPT2LMHeadModel"], "activation_function": "gelu_new",
		"attn_pdrop": 0.1, "embd_pdrop": 0.1, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024,
		"n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "vocab_size": 50257}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Family() != "gpt" || !m.Tied || m.FFN != 3072 || m.MaxPositions != 1024 {
		t.Errorf("%+v", m)
	}
	if p := m.Parameters(); p != 124_439_808 {
		t.Errorf("%d parameters, GPT-2 small has 124,439,808", p)
	}
}

// TestDefaults checks that absent fields take the configuration classes' defaults: LlamaConfig() is
// Llama-2-7B's shape, MistralConfig() Mistral-7B's, Qwen2Config() has 32 key-value heads.
func TestDefaults(t *testing.T) {
	for arch, want := range map[string][3]int{Llama: {32000, 11008, 32}, Mistral: {32000, 14336, 8}, Qwen2: {151936, 22016, 32}} {
		m, err := Parse([]byte(`{"architectures": ["` + arch + `"]}`))
		if err != nil {
			t.Fatal(err)
		}
		if got := [3]int{m.Vocab, m.FFN, m.KVHeads}; got != want {
			t.Errorf("%s defaults: vocab, ffn, kv heads %v, want %v", arch, got, want)
		}
	}
}

// TestRejects checks that bad configs get one-line errors that name the field, and unknown architectures
// the list of known ones.
func TestRejects(t *testing.T) {
	for name, tc := range map[string]struct{ json, want string }{
		"unknown architecture": {`{"architectures": ["FalconForCausalLM"]}`, "known: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM"},
		"no architecture":      {`{"hidden_size": 4096}`, "architectures"},
		"model_type only":      {`{"model_type": "t5"}`, `model_type "t5"`},
		"not an object":        {`[1, 2]`, "not a JSON object"},
		"null":                 {`null`, "not a JSON object"},
		"truncated":            {`{"architectures": ["LlamaForCausalLM"], "hidden_size": 40`, "not a JSON object"},
		"trailing data":        {`{"architectures": ["LlamaForCausalLM"]} {}`, "trailing data"},
		"string size":          {`{"architectures": ["LlamaForCausalLM"], "hidden_size": "4096"}`, "hidden_size: want a number"},
		"fractional size":      {`{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2.5}`, "num_hidden_layers: want an integer"},
		"negative heads":       {`{"architectures": ["LlamaForCausalLM"], "num_attention_heads": -4}`, "num_attention_heads"},
		"huge vocab":           {`{"architectures": ["LlamaForCausalLM"], "vocab_size": 1e300}`, "vocab_size"},
		"zero layers":          {`{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 0}`, "num_hidden_layers"},
		"gqa mismatch":         {`{"architectures": ["LlamaForCausalLM"], "num_attention_heads": 32, "num_key_value_heads": 5}`, "not a multiple"},
		"odd head dim":         {`{"architectures": ["LlamaForCausalLM"], "hidden_size": 42, "num_attention_heads": 6}`, "head_dim"},
		"nan eps":              {`{"architectures": ["LlamaForCausalLM"], "rms_norm_eps": "NaN"}`, "rms_norm_eps"},
		"bad dtype":            {`{"architectures": ["LlamaForCausalLM"], "torch_dtype": "int8"}`, "torch_dtype"},
		"other activation":     {`{"architectures": ["LlamaForCausalLM"], "hidden_act": "gelu"}`, "hidden_act"},
		"two architectures":    {`{"architectures": ["LlamaForCausalLM", "GPT2LMHeadModel"]}`, "oomdbg builds one"},
		"gpt2 inner":           {`{"architectures": ["GPT2LMHeadModel"], "n_inner": 1000}`, "n_inner"},
		"bad rope parameters":  {`{"architectures": ["LlamaForCausalLM"], "rope_parameters": {"rope_theta": -1}}`, "rope_parameters.rope_theta"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.json))
			if err == nil {
				t.Fatalf("no error for %s", tc.json)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line containing %q", err, tc.want)
			}
			if name == "unknown architecture" && !errors.Is(err, ErrUnknownArchitecture) {
				t.Errorf("error %v is not ErrUnknownArchitecture", err)
			}
		})
	}
	if _, err := Read(bytes.NewReader(bytes.Repeat([]byte(" "), MaxSize+1))); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("an oversized file: %v", err)
	}
}

// FuzzParse checks that no input panics, and that errors are one line and results consistent.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("models/*.json")
	for _, p := range files {
		data, _ := os.ReadFile(p)
		f.Add(data)
	}
	f.Add([]byte(`{"architectures": ["GPT2LMHeadModel"], "n_embd": 1e9}`))
	f.Add([]byte(`{"architectures": null, "model_type": "qwen2", "num_key_value_heads": 0}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
			return
		}
		if m.Heads%m.KVHeads != 0 || m.Parameters() <= 0 {
			t.Errorf("accepted an inconsistent model %+v", m)
		}
	})
}
