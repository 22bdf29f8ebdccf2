package train

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
)

// familyTorchCase is a model of workloads/nn/testdata/families.py's count mode.
type familyTorchCase struct {
	Family    string         `json:"family"`
	D         int            `json:"d"`
	Heads     int            `json:"heads"`
	KVHeads   int            `json:"kv_heads"`
	HeadDim   int            `json:"head_dim,omitempty"`
	Layers    int            `json:"layers"`
	Vocab     int            `json:"vocab"`
	FFN       int            `json:"ffn"`
	Tied      bool           `json:"tied"`
	Experts   int            `json:"experts,omitempty"`
	TopK      int            `json:"topk,omitempty"`
	MoEFFN    int            `json:"moe_ffn,omitempty"`
	SharedFFN int            `json:"shared_ffn,omitempty"`
	Task      string         `json:"task,omitempty"`
	Labels    int            `json:"labels,omitempty"`
	TypeVocab int            `json:"type_vocab,omitempty"`
	MaxPos    int            `json:"max_pos,omitempty"`
	Pattern   int            `json:"sliding_pattern,omitempty"`
	LoRA      map[string]any `json:"lora,omitempty"`
}

func familyTorchCaseOf(c Config) familyTorchCase {
	kv := c.KVHeads
	if kv == 0 {
		kv = c.Heads
	}
	f := c.Family
	tc := familyTorchCase{Family: string(c.family()), D: c.DModel, Heads: c.Heads, KVHeads: kv, HeadDim: c.HeadDim,
		Layers: c.Layers, Vocab: c.Vocab, FFN: c.FFN, Tied: c.Tied, Experts: f.Experts, TopK: f.ExpertsPerToken,
		MoEFFN: f.ExpertFFN, SharedFFN: f.SharedExpertFFN, Pattern: f.SlidingPattern}
	if c.Model == "bert" {
		tc.Family, tc.Task, tc.Labels, tc.TypeVocab, tc.MaxPos = "bert", c.Task.String(), f.Labels, f.TypeVocab, f.MaxPositions
	}
	if c.LoRA > 0 {
		lc := c.loraConfig()
		tc.LoRA = map[string]any{"r": lc.Rank, "alpha": lc.Alpha, "targets": lc.Targets}
	}
	return tc
}

// familyTorchCounts counts the parameters of families.py's HF-style modules on the meta device: [all,
// trainable].
func familyTorchCounts(t *testing.T, cfgs []Config) [][2]int64 {
	t.Helper()
	var cases []familyTorchCase
	for _, c := range cfgs {
		cases = append(cases, familyTorchCaseOf(c))
	}
	arg, _ := json.Marshal(cases)
	var out [][2]int64
	torchtest.RunFile(t, filepath.Join("..", "nn", "testdata", "families.py"), &out, "count", string(arg))
	return out
}

// familyPresets are the presets of the families beside Llama's.
func familyPresets(t *testing.T) ([]string, []Config) {
	var names []string
	var cfgs []Config
	for _, name := range hfconfig.PublishedNames() {
		c, err := PresetConfig(name)
		if err != nil {
			t.Fatal(err)
		}
		if c.Model == "bert" || c.family() != "" {
			names, cfgs = append(names, name), append(cfgs, c)
		}
	}
	return names, cfgs
}

// TestFamilyPresetParameterCounts builds every preset of the families beside Llama's and checks its
// parameter count against the published figure and PyTorch's count of families.py's module built from the
// same config.
func TestFamilyPresetParameterCounts(t *testing.T) {
	figures := publishedFigures(t)
	names, cfgs := familyPresets(t)
	if len(names) != 9 {
		t.Errorf("%d presets of the other families: %v", len(names), names)
	}
	torch := familyTorchCounts(t, cfgs)
	for i, name := range names {
		all, trainable, err := ModelParameters(cfgs[i])
		if err != nil {
			t.Fatal(err)
		}
		if int64(all) != figures[name] || int64(all) != torch[i][0] {
			t.Errorf("%s: %d parameters, published %d, PyTorch %d", name, all, figures[name], torch[i][0])
		}
		if trainable != all {
			t.Errorf("%s: %d trainable of %d in a full fine-tune", name, trainable, all)
		}
	}
}

// TestFamilyLoRATrainableCounts checks LoRA's trainable and total counts against PyTorch's count of
// requires_grad parameters of families.py's modules with peft's adapters applied: peft's default targets
// (q and v for Mixtral, Gemma and BERT), every expert's projections, Phi-3's fused projections as wholes,
// QLoRA's (peft counts a 4-bit weight's values), and BERT's classifier, whose copy peft trains.
func TestFamilyLoRATrainableCounts(t *testing.T) {
	type lora struct {
		preset, targets string
		rank            int
		qlora           bool
		task            Task
	}
	cases := []lora{
		{"mixtral-8x7b", "", 8, false, TaskMLM},
		{"mixtral-8x7b", "q,k,v,o,gate,up,down", 16, true, TaskMLM},
		{"qwen3-30b-a3b", "q,k,v,o,gate,up,down", 16, false, TaskMLM},
		{"gemma-2-9b", "", 16, true, TaskMLM},
		{"gemma-3-12b", "q,k,v,o,gate,up,down", 16, false, TaskMLM},
		{"phi-3-mini", "qkv", 8, false, TaskMLM},
		{"phi-4", "qkv,o,gate_up,down", 16, true, TaskMLM},
		{"bert-base", "", 8, false, TaskClassify},
		{"bert-large", "q,k,v,o,up,down", 16, false, TaskMLM},
	}
	var cfgs []Config
	for _, c := range cases {
		cfg, _ := PresetConfig(c.preset)
		targets, err := ParseLoRATargets(c.targets)
		if err != nil {
			t.Fatal(err)
		}
		cfg.LoRA, cfg.LoRATargets, cfg.QLoRA, cfg.Task = c.rank, targets, c.qlora, c.task
		if c.task == TaskClassify {
			cfg.Family.Labels = 2
		}
		cfgs = append(cfgs, cfg)
	}
	torch := familyTorchCounts(t, cfgs)
	for i, c := range cases {
		all, trainable, err := ModelParameters(cfgs[i])
		if err != nil {
			t.Fatal(err)
		}
		if int64(all) != torch[i][0] || int64(trainable) != torch[i][1] {
			t.Errorf("%+v: %d of %d trainable, PyTorch with peft's adapters %d of %d", c, trainable, all, torch[i][1], torch[i][0])
		}
	}
}

// TestFamilyConfigsRun checks that a small config.json of each family steps on the meta and cpu devices
// with its model's parameters the config's, and that what the families do not have is refused.
func TestFamilyConfigsRun(t *testing.T) {
	for _, js := range []string{
		`{"architectures": ["MixtralForCausalLM"], "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 60, "max_position_embeddings": 16, "num_local_experts": 4, "output_router_logits": true}`,
		`{"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 60, "max_position_embeddings": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24}`,
		`{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 60, "max_position_embeddings": 16, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "norm_topk_prob": true}`,
		`{"architectures": ["Gemma2ForCausalLM"], "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 60, "max_position_embeddings": 16, "query_pre_attn_scalar": 8, "sliding_window": 4}`,
		`{"architectures": ["Gemma3ForCausalLM"], "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 60, "max_position_embeddings": 16, "query_pre_attn_scalar": 8, "sliding_window": 4, "sliding_window_pattern": 3}`,
		`{"architectures": ["Phi3ForCausalLM"], "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 60, "max_position_embeddings": 16, "sliding_window": 5}`,
		`{"architectures": ["BertForSequenceClassification"], "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 60, "max_position_embeddings": 16, "num_labels": 3}`,
		`{"architectures": ["BertForMaskedLM"], "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 60, "max_position_embeddings": 16}`,
	} {
		m, err := hfconfig.Parse([]byte(js))
		if err != nil {
			t.Fatal(err)
		}
		for _, dev := range []string{"meta", "cpu"} {
			cfg := FromHF(m)
			cfg.Steps, cfg.Batch = 2, 2
			if err := cfg.Device.UnmarshalText([]byte(dev)); err != nil {
				t.Fatal(err)
			}
			res, _, err := Run(context.Background(), cfg, nil)
			if err != nil || res.OOM != nil || res.Steps != 2 {
				t.Fatalf("%s on %s: %v, %+v", m.Architecture, dev, err, res)
			}
			if int64(res.Parameters) != m.Parameters() {
				t.Errorf("%s: the model has %d parameters, its config %d", m.Architecture, res.Parameters, m.Parameters())
			}
			if cfg.MoE() && (res.ExpertLoad.Routed != cfg.Batch*cfg.Seq*cfg.Family.ExpertsPerToken || res.ExpertLoad.Tokens == 0) {
				t.Errorf("%s on %s: expert load %+v", m.Architecture, dev, res.ExpertLoad)
			}
		}
		for _, s := range []dist.Strategy{dist.ZeRO3, dist.FSDPFull} { // gathering each module's parameters as it runs
			cfg := FromHF(m)
			cfg.Steps, cfg.Batch, cfg.AMP, cfg.Checkpoint = 2, 2, knob.AMPBF16, knob.CheckpointAll
			cfg.Parallel = dist.Settings{GPUs: 2, Strategy: s}
			res, _, err := Run(context.Background(), cfg, nil)
			if err != nil || res.OOM != nil || res.Steps != 2 {
				t.Errorf("%s, %s: %v, %+v", m.Architecture, s, err, res)
			}
		}
	}
	base, _ := PresetConfig("qwen3-30b-a3b")
	for want, mod := range map[string]func(*Config){
		"peft has no default target modules": func(c *Config) { c.LoRA = 8 },
		"projections are":                    func(c *Config) { c.LoRA, c.LoRATargets = 8, 1<<7 }, // qkv on a Qwen
		"routing applies to a mixture":       func(c *Config) { *c, _ = PresetConfig("gemma-2-9b"); c.Routing, _ = ParseRouting("skewed:1") },
		"task applies to bert":               func(c *Config) { c.Task = TaskClassify },
		"longer than the 512 position":       func(c *Config) { *c, _ = PresetConfig("bert-base"); c.Seq = 1024 },
		"checkpoint attn applies to the gpt": func(c *Config) { c.Checkpoint = knob.CheckpointAttention },
	} {
		c := base
		mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
}
