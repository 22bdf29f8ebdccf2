package train

import (
	"fmt"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
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
		Optimizer: knob.AdamW, LR: 6e-4, ZeroGrad: knob.ZeroGradNone, Seed: 1,
		AMP: knob.AMPOff, Checkpoint: knob.CheckpointOff, Attention: knob.AttentionNaive, Accum: 1, Logits: LogitsKeep,
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
	published("llama-3.2-1b", "Llama 3.2 1B: 16 layers, d_model 2048, 32 heads / 8 key-value, tied (1.24B parameters)"),
	published("llama-3.1-8b", "Llama 3.1 8B: 32 layers, d_model 4096, 32 heads / 8 key-value (8.03B parameters)"),
	published("llama-2-7b", "Llama 2 7B: 32 layers, d_model 4096, 32 heads (6.74B parameters)"),
	published("llama-2-70b", "Llama 2 70B: 80 layers, d_model 8192, 64 heads / 8 key-value (69.0B parameters)"),
	published("mistral-7b", "Mistral 7B v0.1: 32 layers, d_model 4096, 32 heads / 8 key-value (7.24B parameters)"),
	published("qwen2.5-7b", "Qwen2.5 7B: 28 layers, d_model 3584, 28 heads / 4 key-value, q/k/v biases (7.62B parameters)"),
	published("tinyllama-1.1b", "TinyLlama 1.1B: 22 layers, d_model 2048, 32 heads / 4 key-value (1.10B parameters)"),
	published("smollm2-135m", "SmolLM2 135M: 30 layers, d_model 576, 9 heads / 3 key-value, tied (135M parameters)"),
	published("mixtral-8x7b", "Mixtral 8x7B: 32 layers of 8 experts, 2 a token, d_model 4096, 32 heads / 8 key-value (46.7B parameters, 12.9B active)"),
	published("qwen3-30b-a3b", "Qwen3 30B-A3B: 48 layers of 128 experts, 8 a token, d_model 2048, 32 heads / 4 key-value (30.5B parameters, 3.3B active)"),
	published("gemma-2-9b", "Gemma 2 9B: 42 layers, sliding and global in turn, soft-capped, d_model 3584, 256k vocabulary tied (9.24B parameters)"),
	published("gemma-3-4b", "Gemma 3 4B, the text model: 34 layers, 5 sliding to 1 global, d_model 2560, 262k vocabulary tied (3.88B parameters)"),
	published("gemma-3-12b", "Gemma 3 12B, the text model: 48 layers, 5 sliding to 1 global, d_model 3840, 262k vocabulary tied (11.8B parameters)"),
	published("phi-3-mini", "Phi-3 mini 4k: 32 layers, d_model 3072, fused qkv_proj and gate_up_proj (3.82B parameters)"),
	published("phi-4", "Phi-4: 40 layers, d_model 5120, 40 heads / 10 key-value, fused projections (14.7B parameters)"),
	published("bert-base", "BERT base uncased, masked LM: 12 layers, d_model 768, 512 positions (110M parameters)"),
	published("bert-large", "BERT large uncased, masked LM: 24 layers, d_model 1024, 512 positions (335M parameters)"),
}

// published is a preset made from a published config.json (workloads/nn/hfconfig/models), trained as HF
// Trainer runs a fine-tune by default: the weights in the config's torch_dtype, sdpa attention (flash; for
// Gemma and Phi-3 flash_attention_2, which takes their window and soft-cap), AdamW (foreach), the logits
// dropped before backward, batch 4 of 2048 tokens (or the model's context; BERT: batch 8 of 512).
func published(name, description string) Preset {
	m, err := hfconfig.Published(name)
	if err != nil {
		panic(err) // the configs are embedded and tested
	}
	return Preset{Name: name, Description: description, Config: FromHF(m)}
}

// FromHF returns the training configuration of a model read from a config.json: a llama (Llama, Mistral,
// Qwen2 and the decoders written from them: Mixtral, Qwen-MoE, Gemma, Phi-3), a bert, or a gpt (GPT-2, built
// as nanoGPT's GPT, which has GPT-2's parameters), with HF Trainer's defaults for the rest.
func FromHF(m *hfconfig.Model) Config {
	seq := min(2048, m.MaxPositions)
	switch m.Family() {
	case "gpt":
		c := gpt(m.Layers, m.Heads, m.DModel, min(1024, m.MaxPositions), m.Vocab, 4)
		c.Dropout, c.Logits, c.Architecture = float32(m.Dropout), LogitsDrop, m.Architecture
		return c
	case "bert":
		return fromHFBert(m)
	}
	weights := map[string]Weights{"bfloat16": WeightsBF16, "float16": WeightsFP16}[m.DType]
	headDim := m.HeadDim
	if headDim == m.DModel/m.Heads {
		headDim = 0 // implied: a --d-model or --heads flag given later keeps it so
	}
	c := Config{
		Model: "llama", Architecture: m.Architecture, Layers: m.Layers, Heads: m.Heads, KVHeads: m.KVHeads,
		HeadDim: headDim, DModel: m.DModel, FFN: m.FFN, Vocab: m.Vocab, Tied: m.Tied, QKVBias: m.QKVBias,
		NormEps: float32(m.NormEps), RopeTheta: m.RopeTheta, Dropout: float32(m.Dropout), Seq: seq, Weights: weights,
	}
	fromHFFamily(&c, m)
	return trainerDefaults(c, 4)
}

// trainerDefaults sets what HF Trainer runs a fine-tune with, the batch aside: AdamW (foreach) at 2e-5, no
// fixes, sdpa (flash) attention, the logits dropped before backward, on the meta device and a 24 GiB card.
func trainerDefaults(c Config, batch int) Config {
	c.Batch, c.Steps = batch, 3
	c.Device, c.GPUMemory, c.ContextReserve = device.Meta, device.DefaultCapacity, device.DefaultContextReserve
	c.Optimizer, c.LR, c.ZeroGrad, c.Seed = knob.AdamW, 2e-5, knob.ZeroGradNone, 1
	c.AMP, c.Checkpoint, c.Attention, c.Accum, c.Logits = knob.AMPOff, knob.CheckpointOff, knob.AttentionFlash, 1, LogitsDrop
	return c
}

// HFKey names the config.json field of architecture that FromHF takes a configuration field from ("vocab" ->
// "vocab_size", "d_model" -> GPT-2's "n_embd"), so that a message about a number a config.json gave names
// the field the user wrote. "" for a field FromHF does not take from config.json.
func HFKey(architecture, field string) string {
	if architecture == hfconfig.GPT2 {
		return map[string]string{"vocab": "vocab_size", "seq": "n_positions", "d_model": "n_embd", "layers": "n_layer",
			"heads": "n_head", "dropout": "resid_pdrop"}[field]
	}
	if !slices.Contains(hfconfig.Architectures, architecture) {
		return ""
	}
	return map[string]string{"vocab": "vocab_size", "d_model": "hidden_size", "ffn": "intermediate_size", "layers": "num_hidden_layers",
		"heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "seq": "max_position_embeddings",
		"dropout": "attention_dropout", "norm_eps": "rms_norm_eps", "rope_theta": "rope_theta"}[field]
}

// DefaultPreset is what oomdbg runs when asked for nothing in particular.
const DefaultPreset = "gpt2-medium"

// DefaultLlamaPreset is what --model llama starts from.
const DefaultLlamaPreset = "llama-3.2-1b"

// DefaultBertPreset is what --model bert starts from.
const DefaultBertPreset = "bert-base"

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
