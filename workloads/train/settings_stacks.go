package train

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// The settings of how the libraries a fine-tune runs on do what they do: QLoRA's storage, peft's
// preparation and adapter dtype, the loss, and how the model is loaded. Each is parsed once, as
// settings.go's are.

// Toggle is a setting that is on or off, or, as its zero value, what the recipe does by default.
type Toggle uint8

// The toggles.
const (
	ToggleDefault Toggle = iota
	ToggleOn
	ToggleOff
)

var toggleNames = []string{"default", "true", "false"}

// ParseToggle reads true or false (and on, off, 1, 0; "" and default are the recipe's default).
func ParseToggle(s string) (Toggle, error) {
	switch strings.ToLower(s) {
	case "", "default":
		return ToggleDefault, nil
	case "true", "on", "1", "yes":
		return ToggleOn, nil
	case "false", "off", "0", "no":
		return ToggleOff, nil
	}
	return 0, fmt.Errorf("%q is not true or false", s)
}

func (t Toggle) String() string                   { return nameOf(toggleNames, int(t), "toggle") }
func (t Toggle) MarshalText() ([]byte, error)     { return []byte(t.String()), nil }
func (t *Toggle) UnmarshalText(text []byte) error { return parseInto(t, ParseToggle, text) }

// On reports whether the toggle is on, def being what the default means.
func (t Toggle) On(def bool) bool {
	if t == ToggleDefault {
		return def
	}
	return t == ToggleOn
}

// QuantStorage is the dtype bitsandbytes packs 4-bit weights in (--qlora-storage, bnb_4bit_quant_storage):
// uint8 (the zero value, bitsandbytes' default), bf16 or f32. The bytes are the same; FSDP needs the
// packed weights in the dtype of the rest to flatten them together.
type QuantStorage uint8

// The storages.
const (
	StorageUint8 QuantStorage = iota
	StorageBF16
	StorageF32
)

var storageNames = []string{"uint8", "bf16", "f32"}

// ParseQuantStorage reads uint8, bf16 or f32.
func ParseQuantStorage(s string) (QuantStorage, error) {
	i, err := parseWord(storageNames, "qlora storage", s)
	return QuantStorage(i), err
}

func (q QuantStorage) String() string                   { return nameOf(storageNames, int(q), "qlora storage") }
func (q QuantStorage) MarshalText() ([]byte, error)     { return []byte(q.String()), nil }
func (q *QuantStorage) UnmarshalText(text []byte) error { return parseInto(q, ParseQuantStorage, text) }

func (q QuantStorage) dtype() tensor.DType {
	return [...]tensor.DType{tensor.U8, tensor.BF16, tensor.F32}[q]
}

// AdapterDType is LoRA's weights' dtype (--lora-dtype): as peft makes them (the zero value: float32 from
// peft 0.12, the base's 16 bits before: versions.AdapterDTypeFloat32), f32, or bf16 (torchtune's).
type AdapterDType uint8

// The adapter dtypes.
const (
	AdapterPEFT AdapterDType = iota
	AdapterF32
	AdapterBF16
)

var adapterNames = []string{"peft", "f32", "bf16"}

// ParseAdapterDType reads peft, f32 or bf16.
func ParseAdapterDType(s string) (AdapterDType, error) {
	i, err := parseWord(adapterNames, "lora dtype", s)
	return AdapterDType(i), err
}

func (a AdapterDType) String() string                   { return nameOf(adapterNames, int(a), "lora dtype") }
func (a AdapterDType) MarshalText() ([]byte, error)     { return []byte(a.String()), nil }
func (a *AdapterDType) UnmarshalText(text []byte) error { return parseInto(a, ParseAdapterDType, text) }

// LossSetting is how the loss is computed (--loss): full (the zero value: lm_head over every position and
// the causal-LM loss of the run's transformers release), chunked:T (torchtune's chunked output and
// CEWithChunkedOutputLoss, T tokens a chunk), linear-ce:N (torchtune's LinearCrossEntropyLoss, the sequence
// in N chunks), fused-linear-ce (Liger's fused linear cross-entropy) or litgpt-chunked:T (LitGPT's loop under
// Fabric: the chunks' logits converted to float32 and held until the next forward).
type LossSetting struct {
	Kind  nn.LossKind
	Chunk int
}

// maxChunk bounds chunked:T: no context is longer.
const maxChunk = 1 << 24

// ParseLoss reads full, chunked:T, linear-ce:N, fused-linear-ce or litgpt-chunked:T.
func ParseLoss(s string) (LossSetting, error) {
	switch {
	case strings.HasPrefix(s, "litgpt-chunked:"):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "litgpt-chunked:"))
		if err != nil || n <= 0 || n > maxChunk {
			return LossSetting{}, fmt.Errorf("loss %q: litgpt-chunked:T takes T, the tokens a chunk, from 1 to %d", s, maxChunk)
		}
		return LossSetting{Kind: nn.LossChunkedHeld, Chunk: n}, nil
	case s == "" || s == "full":
		return LossSetting{}, nil
	case s == "fused-linear-ce":
		return LossSetting{Kind: nn.LossFusedLinearCE}, nil
	case strings.HasPrefix(s, "chunked:"):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "chunked:"))
		if err != nil || n <= 0 || n > maxChunk {
			return LossSetting{}, fmt.Errorf("loss %q: chunked:T takes T, the tokens a chunk, from 1 to %d", s, maxChunk)
		}
		return LossSetting{Kind: nn.LossChunked, Chunk: n}, nil
	case strings.HasPrefix(s, "linear-ce:"):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "linear-ce:"))
		if err != nil || n <= 0 || n > maxChunk {
			return LossSetting{}, fmt.Errorf("loss %q: linear-ce:N takes N, the chunks of the sequence, from 1 to %d", s, maxChunk)
		}
		return LossSetting{Kind: nn.LossLinearCE, Chunk: n}, nil
	}
	return LossSetting{}, fmt.Errorf("unknown loss %q (want full, chunked:T, linear-ce:N, fused-linear-ce or litgpt-chunked:T)", s)
}

func (l LossSetting) String() string {
	switch l.Kind {
	case nn.LossChunked:
		return "chunked:" + strconv.Itoa(l.Chunk)
	case nn.LossLinearCE:
		return "linear-ce:" + strconv.Itoa(l.Chunk)
	case nn.LossFusedLinearCE:
		return "fused-linear-ce"
	case nn.LossChunkedHeld:
		return "litgpt-chunked:" + strconv.Itoa(l.Chunk)
	}
	return "full"
}
func (l LossSetting) MarshalText() ([]byte, error)     { return []byte(l.String()), nil }
func (l *LossSetting) UnmarshalText(text []byte) error { return parseInto(l, ParseLoss, text) }

// IsZero reports whether the loss is the full one (for omitzero).
func (l LossSetting) IsZero() bool { return l == LossSetting{} }

// Load is how the run's model reaches the device (--load): none (the zero value: the weights are made on
// the device in their final form, as a checkpoint already quantized loads) or hf (from_pretrained as
// transformers loads a checkpoint, as a phase of its own before setup: each weight put on the device in the
// checkpoint's dtype, and a 4-bit one quantized there and its 16-bit copy freed).
type Load uint8

// The ways of loading.
const (
	LoadNone Load = iota
	LoadHF
)

var loadNames = []string{"none", "hf"}

// ParseLoad reads none or hf.
func ParseLoad(s string) (Load, error) {
	i, err := parseWord(loadNames, "load", s)
	return Load(i), err
}

func (l Load) String() string                   { return nameOf(loadNames, int(l), "load") }
func (l Load) MarshalText() ([]byte, error)     { return []byte(l.String()), nil }
func (l *Load) UnmarshalText(text []byte) error { return parseInto(l, ParseLoad, text) }

// AdaptsLMHead reports whether LoRA adapts lm_head, which no chunked or fused loss runs with.
func (c *Config) AdaptsLMHead() bool { return c.LoRA > 0 && c.LoRATargets&target(nn.TargetLMHead) != 0 }

// validateStacks checks how the settings of this file combine with the model and the rest.
func (c *Config) validateStacks() error {
	llama := c.Model == "llama" && c.family() == ""
	switch {
	case !c.QLoRA && (c.QLoRADoubleQuant != ToggleDefault || c.QLoRAStorage != StorageUint8 || c.QLoRAHalf != ToggleDefault || c.QLoRAHead):
		return fmt.Errorf("qlora double quantization, storage, half and head need --qlora")
	case c.QLoRAHead && !llama:
		return fmt.Errorf("a 4-bit lm_head is modelled for the Llama family, not %s", c.describeModel())
	case c.QLoRAHead && c.Tied:
		return fmt.Errorf("a 4-bit lm_head needs one of its own: this model ties it to the embeddings")
	case c.QLoRAHead && c.AdaptsLMHead():
		return fmt.Errorf("lora on a 4-bit lm_head is not modelled")
	case c.QLoRAHead && c.Loss.Kind == nn.LossFusedLinearCE:
		return fmt.Errorf("loss %s over a 4-bit lm_head is not modelled", c.Loss)
	case c.LoRA == 0 && c.LoRADType != AdapterPEFT:
		return fmt.Errorf("lora dtype needs --lora R")
	case c.KbitPrep == ToggleOn && !c.QLoRA:
		return fmt.Errorf("kbit-prep prepares a quantized model: it needs --qlora")
	case !llama && (c.Loss != LossSetting{}):
		return fmt.Errorf("loss %s is modelled for the Llama family (llama, mistral, qwen2), not %s", c.Loss, c.describeModel())
	case !llama && c.QLoRA && (c.QLoRADoubleQuant != ToggleDefault || c.QLoRAStorage != StorageUint8):
		return fmt.Errorf("qlora double quantization and storage are modelled for the Llama family, not %s", c.describeModel())
	case c.Loss.Kind == nn.LossChunkedHeld && c.Seq < 2:
		return fmt.Errorf("loss %s predicts each next token: it needs sequences of 2 tokens or more", c.Loss)
	case c.Loss.Kind == nn.LossLinearCE && c.Loss.Chunk > c.Seq:
		return fmt.Errorf("loss %s splits the %d-token sequence into empty chunks: want at most %d chunks", c.Loss, c.Seq, c.Seq)
	case c.Loss.Kind != 0 && c.Logits == LogitsKeep:
		return fmt.Errorf("loss %s never makes the whole logits: the loop cannot keep them (--logits drop)", c.Loss)
	case c.Load == LoadHF && !c.HF():
		return fmt.Errorf("load hf loads a Hugging Face model (llama, bert)")
	case c.Tied && c.LoRA > 0 && c.LoRATargets&(target(nn.TargetLMHead)|target(nn.TargetEmbed)) != 0:
		return fmt.Errorf("lora on lm_head or the embeddings of a model whose lm_head is tied to them is not modelled")
	case c.Loss.Kind != 0 && c.AdaptsLMHead():
		return fmt.Errorf("loss %s with lora on lm_head is not modelled", c.Loss)
	}
	return nil
}

// describeModel names the model for an error: its architecture, else its kind.
func (c *Config) describeModel() string {
	if c.Architecture != "" {
		return c.Architecture
	}
	return c.Model
}

// loraTargetable lists what LoRA may adapt in the model: its projections, and a Llama's lm_head and
// embeddings.
func (c *Config) loraTargetable() []string {
	ps := c.projections()
	if c.Model == "llama" && c.family() == "" {
		ps = append(slices.Clone(ps), nn.TargetLMHead, nn.TargetEmbed)
	}
	return ps
}

// kbitPrep reports whether the run's parameters are as prepare_model_for_kbit_training leaves them. By
// default it is called as TRL's SFTTrainer calls it, but for a sharded QLoRA: under FSDP TRL skips it (the
// 4-bit weights are loaded on the CPU or the meta device, and FSDP1 flattens a unit's parameters into one
// dtype), and under ZeRO DeepSpeed's bf16 mode casts the whole module back to bf16, undoing its float32
// upcast.
func (c *Config) kbitPrep() bool {
	sharded := c.Parallel.Strategy.FSDP() || c.Parallel.Strategy.ZeRO()
	return c.QLoRA && c.KbitPrep.On(!sharded)
}

// adapterDType is the adapters' dtype: as asked, else peft's: float32 from 0.12 (autocast_adapter_dtype);
// before, the base layer's dtype when it is a float: the weights' (a 4-bit base stored in uint8 is not, so its
// adapters stay float32; stored in bf16 or f32 it is).
func (c *Config) adapterDType() tensor.DType {
	switch c.LoRADType {
	case AdapterF32:
		return tensor.F32
	case AdapterBF16:
		return tensor.BF16
	}
	if c.Versions.AdaptersFloat32() {
		return tensor.F32
	}
	if c.QLoRA && c.QLoRAStorage == StorageBF16 {
		return tensor.BF16
	}
	if c.QLoRA {
		return tensor.F32
	}
	return c.Weights.dtype()
}

// target is the set of the one projection named p.
func target(p string) LoRATargets { return 1 << indexOf(nn.LoRAProjections, p) }
