package train

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
)

// publishedFigures reads the exact parameter counts of the published checkpoints
// (workloads/nn/hfconfig/testdata/published.json; published.md beside it says where each comes from).
func publishedFigures(t *testing.T) map[string]int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "nn", "hfconfig", "testdata", "published.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]int64
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// torchCase is a model of workloads/nn/testdata/llama.py's count mode.
type torchCase struct {
	D       int            `json:"d"`
	Heads   int            `json:"heads"`
	KVHeads int            `json:"kv_heads"`
	Layers  int            `json:"layers"`
	Vocab   int            `json:"vocab"`
	FFN     int            `json:"ffn"`
	Tied    bool           `json:"tied"`
	QKVBias bool           `json:"qkv_bias"`
	LoRA    map[string]any `json:"lora,omitempty"`
}

func torchCaseOf(c Config) torchCase {
	kv := c.KVHeads
	if kv == 0 {
		kv = c.Heads
	}
	tc := torchCase{D: c.DModel, Heads: c.Heads, KVHeads: kv, Layers: c.Layers, Vocab: c.Vocab, FFN: c.FFN, Tied: c.Tied, QKVBias: c.QKVBias}
	if c.LoRA > 0 {
		lc := c.loraConfig()
		tc.LoRA = map[string]any{"r": lc.Rank, "alpha": lc.Alpha, "targets": lc.Targets}
	}
	return tc
}

// torchCounts counts the parameters of the HF-style PyTorch modules on the meta device: [all, trainable].
func torchCounts(t *testing.T, cfgs []Config) [][2]int64 {
	t.Helper()
	var cases []torchCase
	for _, c := range cfgs {
		cases = append(cases, torchCaseOf(c))
	}
	arg, _ := json.Marshal(cases)
	var out [][2]int64
	torchtest.RunFile(t, filepath.Join("..", "nn", "testdata", "llama.py"), &out, "count", string(arg))
	return out
}

// TestPresetParameterCounts builds every published preset's model and checks its parameter count against
// the published figure and against PyTorch's count of the HF-style module built from the same config.
func TestPresetParameterCounts(t *testing.T) {
	figures := publishedFigures(t)
	var names []string
	var cfgs []Config
	for _, name := range hfconfig.PublishedNames() {
		c, err := PresetConfig(name)
		if err != nil {
			t.Fatal(err)
		}
		if c.Model != "llama" || c.family() != "" {
			continue // the other families: TestFamilyPresetParameterCounts
		}
		names, cfgs = append(names, name), append(cfgs, c)
	}
	torch := torchCounts(t, cfgs)
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

// TestLoRATrainableCounts checks LoRA's trainable and total counts against PyTorch's count of
// requires_grad parameters of the HF-style module with peft's adapters applied (what peft's
// print_trainable_parameters sums), on several models, ranks and target sets, QLoRA included (peft counts a
// 4-bit weight's values, which equal the unquantized module's).
func TestLoRATrainableCounts(t *testing.T) {
	type lora struct {
		preset, targets string
		rank            int
		qlora           bool
	}
	cases := []lora{
		{"llama-3.1-8b", "q,k,v,o,gate,up,down", 16, false},
		{"llama-3.1-8b", "", 8, false}, // peft's default targets for Llama: q_proj, v_proj
		{"llama-3.2-1b", "q,v", 8, true},
		{"qwen2.5-7b", "q,k,v,o", 32, false},
		{"mistral-7b", "gate,up,down", 4, true},
		{"llama-2-70b", "q,k,v,o,gate,up,down", 64, true},
	}
	var cfgs []Config
	for _, c := range cases {
		cfg, _ := PresetConfig(c.preset)
		targets, err := ParseLoRATargets(c.targets)
		if err != nil {
			t.Fatal(err)
		}
		cfg.LoRA, cfg.LoRATargets, cfg.QLoRA = c.rank, targets, c.qlora
		cfgs = append(cfgs, cfg)
	}
	torch := torchCounts(t, cfgs)
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

// TestQLoRAStorageOfLlama2_70B checks the device memory of Llama-2-70B's base under QLoRA against
// bitsandbytes' formula: 4 bits per linear weight, plus its uint8 absmax per 64 and the float32 absmax per
// 256 x 64 of double quantization (4.127 bits a parameter), and 16 bits for the embeddings, lm_head and
// norms, which bitsandbytes leaves alone. The runtime's figure is what the caching allocator holds
// (512-byte rounding and per-weight constants included): within 1%.
func TestQLoRAStorageOfLlama2_70B(t *testing.T) {
	cfg, _ := PresetConfig("llama-2-70b")
	cfg.LoRA, cfg.LoRATargets, cfg.QLoRA = 64, AllLoRATargets, true
	cfg.GPUMemory = 1 << 50
	r, err := newRun(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.rt.Catch(r.build); err != nil {
		t.Fatal(err)
	}
	var adapters int64
	for _, p := range nn.Trainable(r.model) {
		adapters += int64(p.Tensor.Bytes())
	}
	base := r.dev.Allocator().Stats().AllocatedBytes.All().Current - adapters

	d, f, l, v := 8192.0, 28672.0, 80.0, 32000.0
	kv := 8.0 * 128
	linear := l * (d*d + 2*d*kv + d*d + 3*d*f)
	sixteen := 2*v*d + (2*l+1)*d
	formula := linear*(4+8.0/64+32.0/(64*256))/8 + 2*sixteen
	if rel := math.Abs(float64(base)-formula) / formula; rel > 0.01 {
		t.Errorf("QLoRA base of Llama-2-70B takes %.3f GiB, the bitsandbytes formula %.3f GiB (%.2f%% apart)",
			float64(base)/(1<<30), formula/(1<<30), 100*rel)
	}
	t.Logf("QLoRA base of Llama-2-70B: %.3f GiB held, formula %.3f GiB; %.4f bits per linear parameter",
		float64(base)/(1<<30), formula/(1<<30), (float64(base)-2*sixteen)*8/linear)
}

// TestHFConfigRuns checks that a config.json of each known architecture builds a run that steps, and that
// an unknown architecture is refused with the list of known ones.
func TestHFConfigRuns(t *testing.T) {
	for _, js := range []string{
		`{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 32}`,
		`{"architectures": ["MistralForCausalLM"], "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 32}`,
		`{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 100, "max_position_embeddings": 32, "tie_word_embeddings": true}`,
		`{"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 32}`,
	} {
		m, err := hfconfig.Parse([]byte(js))
		if err != nil {
			t.Fatal(err)
		}
		cfg := FromHF(m)
		cfg.Steps = 2
		res, _, err := Run(context.Background(), cfg, nil)
		if err != nil || res.OOM != nil || res.Steps != 2 {
			t.Errorf("%s: %v, %+v", m.Architecture, err, res)
		}
		if int64(res.Parameters) != m.Parameters() {
			t.Errorf("%s: the model has %d parameters, its config %d", m.Architecture, res.Parameters, m.Parameters())
		}
	}
	_, err := hfconfig.Parse([]byte(`{"architectures": ["FalconForCausalLM"]}`))
	if err == nil || !strings.Contains(err.Error(), "LlamaForCausalLM") {
		t.Errorf("unknown architecture: %v", err)
	}
}

// smallLlama is a Llama of the tiny text's vocabulary that trains on the cpu device in seconds.
func smallLlama(t *testing.T) Config {
	t.Helper()
	m, err := hfconfig.Parse([]byte(`{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
		"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": ` + itoa(len(tinyVocab)) + `,
		"max_position_embeddings": 32, "rms_norm_eps": 1e-5}`))
	if err != nil {
		t.Fatal(err)
	}
	c := FromHF(m)
	c.Batch, c.LR = 8, 3e-3
	return c
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestLlamaLearnsOnCPU trains a small Llama on the built-in text on the cpu device, fully and with LoRA,
// QLoRA and 8-bit AdamW, and checks the loss falls: the math of every piece runs, not only its memory.
func TestLlamaLearnsOnCPU(t *testing.T) {
	all := AllLoRATargets
	for name, tc := range map[string]struct {
		mod  func(*Config)
		fall float32 // the share the loss must fall by
	}{
		"full, bf16 autocast, paged adamw": {func(c *Config) { c.AMP, c.Optimizer = knob.AMPBF16, knob.PagedAdamW }, 0.15},
		// Adapters on a frozen random base reach a floor within a few steps: from the first step's loss they
		// must still fall by more than batch-to-batch noise (about 1%).
		"lora, checkpoint, eager": {func(c *Config) {
			c.LoRA, c.LoRATargets, c.Checkpoint, c.Attention, c.LR = 8, all, knob.CheckpointAll, knob.AttentionNaive, 0.1
		}, 0.03},
		"qlora, 8-bit adamw": {func(c *Config) {
			c.LoRA, c.LoRATargets, c.QLoRA, c.Optimizer, c.LR = 8, all, true, knob.AdamW8bit, 0.1
		}, 0.03},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := smallLlama(t)
			tc.mod(&cfg)
			cfg.Device, cfg.Steps, cfg.Batch = "cpu", 30, 4
			res, _, err := Run(context.Background(), cfg, nil)
			if err != nil || res.OOM != nil {
				t.Fatalf("%v %+v", err, res)
			}
			first, last := res.Losses[0], mean(res.Losses[len(res.Losses)-5:])
			if last > (1-tc.fall)*first || math.IsNaN(float64(last)) {
				t.Errorf("loss %.3f -> %.3f over %d steps; want it to fall by %.0f%%", first, last, res.Steps, 100*tc.fall)
			}
		})
	}
}

// TestLlamaMetaAndCPURecordTheSameAllocations checks that the cpu device, which computes, allocates exactly
// what the meta device does for a Llama with every new piece on: QLoRA, LoRA dropout, checkpointing, bf16
// autocast, a paged 8-bit optimizer.
func TestLlamaMetaAndCPURecordTheSameAllocations(t *testing.T) {
	cfg := smallLlama(t)
	cfg.LoRA, cfg.LoRADropout, cfg.QLoRA, cfg.Checkpoint, cfg.AMP, cfg.Optimizer = 4, 0.1, true, knob.CheckpointEvery(2), knob.AMPBF16, knob.PagedAdamW8bit
	cfg.Steps, cfg.Batch = 2, 2
	cfg.Device = "meta"
	_, meta := record(t, cfg)
	cfg.Device = "cpu"
	_, cpu := record(t, cfg)
	if meta.Events.Len() != cpu.Events.Len() {
		t.Fatalf("meta recorded %d events, cpu %d", meta.Events.Len(), cpu.Events.Len())
	}
	for i := range meta.Events.Len() {
		m, c := meta.Events.At(i), cpu.Events.At(i)
		if m.Action != c.Action || m.Addr != c.Addr || m.Size != c.Size || m.Phase != c.Phase ||
			meta.String(m.Label) != cpu.String(c.Label) {
			t.Fatalf("event %d differs:\nmeta %+v\n cpu %+v", i, m, c)
		}
	}
}

// TestLlamaFixesLowerThePeak runs a Llama-3.2-1B-shaped model (fewer layers) once per fix on a device too
// big to run out and checks each fix lowers the peak as it does for PyTorch users.
func TestLlamaFixesLowerThePeak(t *testing.T) {
	base, _ := PresetConfig("llama-3.2-1b")
	base.Layers, base.Seq, base.Batch, base.Steps, base.GPUMemory, base.Weights = 4, 512, 4, 2, 1<<40, WeightsF32
	peak := peakWith(t, base)
	none := peak(func(*Config) {})
	for name, mod := range map[string]func(c *Config){
		"checkpoint every layer": func(c *Config) { c.Checkpoint = knob.CheckpointAll },
		"bf16 weights":           func(c *Config) { c.Weights = WeightsBF16 },
		"lora":                   func(c *Config) { c.LoRA = 16 },
		"qlora":                  func(c *Config) { c.LoRA, c.QLoRA = 16, true },
		"8-bit adamw":            func(c *Config) { c.Optimizer = knob.AdamW8bit },
		"paged 8-bit adamw":      func(c *Config) { c.Optimizer = knob.PagedAdamW8bit },
	} {
		t.Run(name, func(t *testing.T) {
			if p := peak(mod); p >= none {
				t.Errorf("peak %d with the fix, %d without", p, none)
			}
		})
	}
	// The implementations of AdamW change only the optimizer step's peak: foreach holds every square root
	// at once, for-loop one parameter's (two tensors of it), fused none.
	optPeak := func(impl knob.OptimizerImpl) int64 {
		c := base
		c.OptimizerImpl = impl
		res, _, err := Run(context.Background(), c, nil)
		if err != nil {
			t.Fatal(err)
		}
		var p int64
		for _, ph := range res.Phases {
			if ph.Phase == snapshot.PhaseOptimizer {
				p = max(p, ph.Peak)
			}
		}
		return p
	}
	base.Layers = 16 // the full model: the embedding is not most of the parameters
	foreach, forLoop, fused := optPeak(knob.Foreach), optPeak(knob.ForLoop), optPeak(knob.Fused)
	if !(fused < forLoop && forLoop < foreach) {
		t.Errorf("optimizer step peaks: foreach %d, for-loop %d, fused %d; want fused < for-loop < foreach", foreach, forLoop, fused)
	}
}
