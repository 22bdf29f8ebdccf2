package train

import (
	"fmt"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/optim"
)

// A Preset is a named starting configuration.
type Preset struct {
	Name        string
	Description string
	Config      Config
}

// gpt returns a GPT configuration of the given shape with nanoGPT's training defaults: AdamW, no dropout,
// biases, nanoGPT's attention without flash, the logits kept through backward, no fixes.
func gpt(layers, heads, d, seq, vocab, batch int) Config {
	return Config{
		Model: "gpt", Layers: layers, Heads: heads, DModel: d, Seq: seq, Vocab: vocab, Bias: true,
		Batch: batch, Steps: 3,
		Device: device.Meta, GPUMemory: device.DefaultCapacity, ContextReserve: device.DefaultContextReserve,
		Optimizer: optim.AdamW, LR: 6e-4, ZeroGrad: ZeroGradNone, Seed: 1,
		AMP: AMPOff, Checkpoint: CheckpointOff, Attention: AttentionNaive, Accum: 1, Logits: LogitsKeep,
	}
}

// Presets are the built-in workloads. Vocabulary sizes are GPT-2's (50257); tiny's is its built-in text's.
var Presets = []Preset{
	{"mlp", "a small classifier that learns Gaussian blobs in seconds on the cpu device", DefaultMLP()},
	{"tiny", "a tiny GPT that learns a built-in text on the cpu device", func() Config {
		c := gpt(2, 4, 64, 64, len(tinyVocab), 16)
		c.Steps, c.LR = 150, 3e-3
		return c
	}()},
	{"gpt2-small", "GPT-2 small scale: 12 layers, d_model 768, seq 1024 (124M parameters)", gpt(12, 12, 768, 1024, 50257, 16)},
	{"gpt2-medium", "GPT-2 medium scale: 24 layers, d_model 1024, seq 1024 (355M parameters), batch 16: OOMs on 24 GiB as configured", gpt(24, 16, 1024, 1024, 50257, 16)},
	{"gpt2-large", "GPT-2 large scale: 36 layers, d_model 1280, seq 1024 (774M parameters)", gpt(36, 20, 1280, 1024, 50257, 8)},
	{"buildalong", "the OOM build-along model: d_model 2048, 24 layers, 32 heads, seq 1024, batch 16 (1.3B parameters with tied embeddings)", gpt(24, 32, 2048, 1024, 50257, 16)},
}

// DefaultPreset is what oomdbg runs when asked for nothing in particular.
const DefaultPreset = "gpt2-medium"

// PresetConfig returns the configuration of the named preset.
func PresetConfig(name string) (Config, error) {
	for _, p := range Presets {
		if p.Name == name {
			c := p.Config
			c.Preset = name
			return c, nil
		}
	}
	names := make([]string, len(Presets))
	for i, p := range Presets {
		names[i] = p.Name
	}
	return Config{}, fmt.Errorf("unknown preset %q (want one of %s)", name, strings.Join(names, ", "))
}

// PresetNames lists the presets' names.
func PresetNames() []string {
	var names []string
	for _, p := range Presets {
		names = append(names, p.Name)
	}
	return slices.Clip(names)
}
