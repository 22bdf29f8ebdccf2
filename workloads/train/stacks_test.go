package train

import (
	"context"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/versions"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// tinyLlama is a Llama-shaped configuration small enough to build in milliseconds.
func tinyLlama(t *testing.T) Config {
	t.Helper()
	c, err := PresetConfig("smollm2-135m")
	if err != nil {
		t.Fatal(err)
	}
	c.Layers, c.Seq, c.Batch, c.Steps, c.GPUMemory = 2, 64, 2, 1, MaxGPUMemory
	return c
}

// built builds cfg's model as a run's setup does and returns it with the run.
func built(t *testing.T, cfg Config) *run {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := newRun(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.rt.Catch(r.setup); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestLoRADTypeFollowsPEFT holds the adapters' dtype to peft's sources: peft 0.11.1's
// _move_adapter_to_device_of_base_layer gives them the base weight's dtype when it is a float (bf16 on a bf16
// base; a 4-bit base in uint8 is not, in bf16 storage it is), peft 0.12.0's autocast_adapter_dtype makes
// them float32; --lora-dtype overrides both.
func TestLoRADTypeFollowsPEFT(t *testing.T) {
	for _, c := range []struct {
		name    string
		set     func(*Config)
		peft    string
		want    tensor.DType
		wantErr bool
	}{
		{"bf16 base, peft 0.11.1", func(c *Config) {}, "0.11.1", tensor.BF16, false},
		{"bf16 base, peft 0.12.0", func(c *Config) {}, "0.12.0", tensor.F32, false},
		{"qlora uint8, peft 0.11.1", func(c *Config) { c.QLoRA = true }, "0.11.1", tensor.F32, false},
		{"qlora bf16 storage, peft 0.11.1", func(c *Config) { c.QLoRA, c.QLoRAStorage = true, StorageBF16 }, "0.11.1", tensor.BF16, false},
		{"--lora-dtype bf16, peft default", func(c *Config) { c.LoRADType = AdapterBF16 }, "", tensor.BF16, false},
		{"--lora-dtype f32, peft 0.11.1", func(c *Config) { c.LoRADType = AdapterF32 }, "0.11.1", tensor.F32, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := tinyLlama(t)
			cfg.LoRA, cfg.Weights, cfg.AMP = 8, WeightsBF16, knob.AMPBF16
			c.set(&cfg)
			if c.peft != "" {
				cfg.Versions, _ = versions.Parse("peft=" + c.peft)
			}
			r := built(t, cfg)
			n := 0
			for _, p := range nn.Trainable(r.model) {
				if got := p.Tensor.DType(); got != c.want {
					t.Errorf("%s is %v, want %v", p.Name, got, c.want)
				}
				n++
			}
			if n == 0 {
				t.Error("no adapters")
			}
		})
	}
}

// TestKbitPrepUpcastsWhatPEFTUpcasts checks prepare_model_for_kbit_training's cast on a QLoRA model: every
// 16-bit parameter that is not 4-bit (embeddings, norms, lm_head) becomes float32, the 4-bit weights stay
// packed, and turning it off leaves them in 16 bits.
func TestKbitPrepUpcastsWhatPEFTUpcasts(t *testing.T) {
	for _, on := range []bool{true, false} {
		cfg := tinyLlama(t)
		cfg.LoRA, cfg.QLoRA, cfg.Weights, cfg.AMP = 8, true, WeightsBF16, knob.AMPBF16
		if !on {
			cfg.KbitPrep = ToggleOff
		}
		r := built(t, cfg)
		for _, p := range r.model.Parameters() {
			d := p.Tensor.DType()
			switch {
			case p.Packed4Bit:
				if d != tensor.U8 {
					t.Errorf("%s: %v", p.Name, d)
				}
			case strings.Contains(p.Name, "lora_"):
			case on && d != tensor.F32, !on && d != tensor.BF16:
				t.Errorf("kbit prep %v: %s is %v", on, p.Name, d)
			}
		}
	}
}

// TestLoadPhaseHoldsTheQuantizedWeights checks --load hf: a phase of its own before setup in which each
// 4-bit weight is on the device in 16 bits while it is quantized (the phase's peak passes what it ends with
// by one weight at least), and --load none, where the weights are made packed and no load phase is.
func TestLoadPhaseHoldsTheQuantizedWeights(t *testing.T) {
	base := tinyLlama(t)
	base.LoRA, base.QLoRA, base.Weights, base.AMP = 8, true, WeightsBF16, knob.AMPBF16
	for _, load := range []Load{LoadNone, LoadHF} {
		cfg := base
		cfg.Load = load
		res, _, err := Run(context.Background(), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		first := res.Phases[0]
		switch {
		case load == LoadNone && first.Phase != snapshot.PhaseSetup:
			t.Errorf("load none: first phase %v", first.Phase)
		case load == LoadHF && first.Phase != snapshot.PhaseLoad:
			t.Errorf("load hf: first phase %v", first.Phase)
		case load == LoadHF:
			largest := int64(base.FFN * base.DModel * 2) // the 16-bit gate_proj weight
			if first.Peak-first.End < largest {
				t.Errorf("load phase peak %d, end %d: no 16-bit weight was on the device while quantized", first.Peak, first.End)
			}
		}
	}
	mlp := DefaultMLP()
	mlp.Load = LoadHF
	if err := mlp.Validate(); err == nil {
		t.Error("load hf of the mlp accepted")
	}
}

// TestQLoRAQuantizesAsItsStackDoes checks the settings of how the base is quantized: a float16 quant state
// before bitsandbytes 0.43.0 (Params4bit.cuda's .half()) and with --qlora-half, the weight's own dtype from
// 0.43.0 and with --qlora-half=false; and --qlora-head, which stores lm_head in 4 bits as Lightning's
// BitsandbytesPrecision does, refused where lm_head is tied to the embeddings.
func TestQLoRAQuantizesAsItsStackDoes(t *testing.T) {
	for _, c := range []struct {
		bnb   string
		half  Toggle
		head  bool
		state tensor.DType
	}{
		{"0.41.1", ToggleDefault, false, tensor.F16},
		{"0.42.0", ToggleDefault, true, tensor.F16},
		{"0.43.0", ToggleDefault, false, tensor.BF16},
		{"0.41.1", ToggleOff, false, tensor.BF16},
		{"", ToggleOn, true, tensor.F16},
		{"", ToggleDefault, false, tensor.BF16},
	} {
		cfg := tinyLlama(t)
		cfg.LoRA, cfg.QLoRA, cfg.Weights, cfg.AMP = 8, true, WeightsBF16, knob.AMPBF16
		cfg.QLoRAHalf, cfg.QLoRAHead, cfg.Tied = c.half, c.head, false
		if c.bnb != "" {
			cfg.Versions, _ = versions.Parse("bitsandbytes=" + c.bnb)
		}
		m := built(t, cfg).model.(*nn.Llama)
		projections := 0
		for _, l := range m.Layers {
			for _, p := range []nn.Projection{l.Attn.Q, l.Attn.K, l.Attn.V, l.Attn.O, l.MLP.Gate, l.MLP.Up, l.MLP.Down} {
				if q, ok := base4bit(p); ok {
					projections++
					if q.DType != c.state {
						t.Errorf("bitsandbytes %q, half %v: a quant state is %v, want %v", c.bnb, c.half, q.DType, c.state)
					}
				}
			}
		}
		if projections != 7*cfg.Layers {
			t.Errorf("%d 4-bit projections, want %d", projections, 7*cfg.Layers)
		}
		head, ok := m.Head.(*nn.Linear4bit)
		if ok != c.head {
			t.Errorf("--qlora-head %v: lm_head is %T", c.head, m.Head)
		}
		if ok && (head.Q.DType != c.state || head.Q.Packed.Numel() != cfg.Vocab*cfg.DModel/2) {
			t.Errorf("4-bit lm_head: state %v, %d packed bytes, want %v, %d", head.Q.DType, head.Q.Packed.Numel(), c.state,
				cfg.Vocab*cfg.DModel/2)
		}
	}
	tied := tinyLlama(t)
	tied.LoRA, tied.QLoRA, tied.QLoRAHead, tied.Weights = 8, true, true, WeightsBF16
	if err := tied.Validate(); err == nil || !strings.Contains(err.Error(), "ties") {
		t.Errorf("a 4-bit lm_head tied to the embeddings: %v", err)
	}
}

// base4bit returns the 4-bit quant of a projection, through its LoRA wrapper.
func base4bit(p nn.Projection) (*tensor.Quant4, bool) {
	if l, ok := p.(*nn.LoRALinear); ok {
		p = l.Base
	}
	q, ok := p.(*nn.Linear4bit)
	if !ok {
		return nil, false
	}
	return q.Q, true
}
