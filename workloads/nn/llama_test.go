package nn

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// llamaCase is one model and run of the comparison with testdata/llama.py; its JSON form is the script's.
type llamaCase struct {
	Batch      int       `json:"batch"`
	Seq        int       `json:"seq"`
	D          int       `json:"d"`
	Heads      int       `json:"heads"`
	KVHeads    int       `json:"kv_heads"`
	Layers     int       `json:"layers"`
	Vocab      int       `json:"vocab"`
	FFN        int       `json:"ffn"`
	Tied       bool      `json:"tied"`
	QKVBias    bool      `json:"qkv_bias,omitempty"`
	AMP        string    `json:"amp,omitempty"`
	DType      string    `json:"dtype,omitempty"`
	Checkpoint bool      `json:"checkpoint,omitempty"`
	LoRA       *caseLoRA `json:"lora,omitempty"`
	name       string    // for the subtest
}

type caseLoRA struct {
	R       int      `json:"r"`
	Alpha   float32  `json:"alpha"`
	Targets []string `json:"targets"`
}

// newLlama builds the case's model on rt, its configuration changed by set.
func (c llamaCase) newLlama(t testing.TB, rt *tensor.Runtime, set func(*LlamaConfig)) *Llama {
	t.Helper()
	cfg := c.llamaConfig(t)
	set(&cfg)
	m, err := NewLlama(rt, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (c llamaCase) llamaConfig(t testing.TB) LlamaConfig {
	t.Helper()
	dtype := tensor.F32
	if c.DType != "" {
		var err error
		if dtype, err = tensor.ParseDType(c.DType); err != nil {
			t.Fatal(err)
		}
	}
	cfg := LlamaConfig{Vocab: c.Vocab, DModel: c.D, Layers: c.Layers, Heads: c.Heads, KVHeads: c.KVHeads, FFN: c.FFN,
		Tied: c.Tied, QKVBias: c.QKVBias, NormEps: 1e-5, RopeTheta: 10000, Attention: "naive", DType: dtype}
	if c.LoRA != nil {
		cfg.Adapter = &LoRAConfig{Rank: c.LoRA.R, Alpha: c.LoRA.Alpha, Targets: c.LoRA.Targets}
	}
	return cfg
}

// llamaCases are the shapes and runs compared: grouped-query (two and one key-value heads) and multi-head
// attention, tied and untied embeddings, Qwen2's biases, float32 and bf16 autocast, bf16 weights,
// checkpointing, and LoRA on different targets.
func llamaCases() []llamaCase {
	gqa := llamaCase{Batch: 2, Seq: 8, D: 32, Heads: 4, KVHeads: 2, Layers: 2, Vocab: 50, FFN: 48}
	mha := llamaCase{Batch: 3, Seq: 6, D: 24, Heads: 3, KVHeads: 3, Layers: 1, Vocab: 37, FFN: 40, Tied: true}
	mqa := llamaCase{Batch: 1, Seq: 16, D: 48, Heads: 6, KVHeads: 1, Layers: 3, Vocab: 29, FFN: 80}
	qwen := gqa
	qwen.QKVBias, qwen.Layers = true, 1
	qv := &caseLoRA{R: 4, Alpha: 8, Targets: []string{"q", "v"}}
	all := &caseLoRA{R: 2, Alpha: 16, Targets: []string{"q", "k", "v", "o", "gate", "up", "down"}}
	mlp := &caseLoRA{R: 8, Alpha: 8, Targets: []string{"gate", "up", "down"}}
	var cases []llamaCase
	add := func(name string, c llamaCase, mod func(*llamaCase)) {
		mod(&c)
		c.name = name
		cases = append(cases, c)
	}
	for _, s := range []struct {
		name string
		c    llamaCase
	}{{"gqa", gqa}, {"mha tied", mha}, {"mqa", mqa}, {"qwen2 biases", qwen}} {
		add(s.name, s.c, func(*llamaCase) {})
		add(s.name+"/bf16 autocast", s.c, func(c *llamaCase) { c.AMP = "bf16" })
		add(s.name+"/checkpoint", s.c, func(c *llamaCase) { c.Checkpoint = true })
		add(s.name+"/bf16 autocast, checkpoint", s.c, func(c *llamaCase) { c.AMP, c.Checkpoint = "bf16", true })
	}
	add("gqa/lora q,v", gqa, func(c *llamaCase) { c.LoRA = qv })
	add("gqa/lora q,v, bf16 autocast", gqa, func(c *llamaCase) { c.LoRA, c.AMP = qv, "bf16" })
	add("gqa/lora q,v, checkpoint", gqa, func(c *llamaCase) { c.LoRA, c.Checkpoint = qv, true })
	add("mha tied/lora all", mha, func(c *llamaCase) { c.LoRA = all })
	add("mha tied/lora all, bf16 weights", mha, func(c *llamaCase) { c.LoRA, c.DType = all, "bf16" })
	add("mqa/lora mlp, bf16 weights, bf16 autocast, checkpoint", mqa, func(c *llamaCase) {
		c.LoRA, c.DType, c.AMP, c.Checkpoint = mlp, "bf16", "bf16", true
	})
	add("qwen2 biases/lora all, checkpoint", qwen, func(c *llamaCase) { c.LoRA, c.Checkpoint = all, true })
	add("gqa/bf16 weights", gqa, func(c *llamaCase) { c.DType = "bf16" })
	return cases
}

// TestLlamaSavesWhatPyTorchSaves compares the bytes autograd keeps after the forward pass and the loss with
// PyTorch's for the HF-style model of testdata/llama.py, counted once per storage without parameters and
// buffers, exactly (no allocator rounding is involved: both count tensor storages).
func TestLlamaSavesWhatPyTorchSaves(t *testing.T) {
	cases := llamaCases()
	arg, _ := json.Marshal(cases)
	var want []uint64
	torchtest.RunFile(t, "testdata/llama.py", &want, "saved", string(arg))
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rt := gptRuntime(device.Meta)
			m, err := NewLlama(rt, c.llamaConfig(t))
			if err != nil {
				t.Fatal(err)
			}
			if c.Checkpoint {
				m.Checkpoint = func(int) bool { return true }
				m.InputRequiresGrad = c.LoRA != nil
			}
			idx := tokens(rt, c.Batch, c.Seq, c.Vocab)
			amp := tensor.F32
			if c.AMP == "bf16" {
				amp = tensor.BF16
			}
			loss := autocastLoss(rt, amp, func() *tensor.Tensor { return m.Loss(idx, idx) })
			checkSaved(t, rt, want[i])
			backwardAndRelease(t, rt, loss, idx, m.Release)
		})
	}
}

// TestLoRATrainsOnlyAdapters checks what gets a gradient under LoRA (the adapters, nothing of the frozen
// base, embeddings and lm_head included) and that the adapted model starts equal to the base one (lora_B is
// zero: the loss is the same with the adapters' scaling set to 0), on the cpu device.
func TestLoRATrainsOnlyAdapters(t *testing.T) {
	c := llamaCases()[0]
	rt := gptRuntime(device.CPU)
	m := c.newLlama(t, rt, func(cfg *LlamaConfig) {
		cfg.Adapter = &LoRAConfig{Rank: 4, Alpha: 8, Targets: []string{"q", "v", "down"}}
	})
	idx := tokens(rt, c.Batch, c.Seq, c.Vocab)
	lossWith := func(scale float32) float32 {
		var l float32
		for _, layer := range m.Layers {
			for _, p := range []Projection{layer.Attn.Q, layer.Attn.V, layer.MLP.Down} {
				p.(*LoRALinear).Scaling = scale
			}
		}
		rt.NoGrad(func() {
			loss := m.Loss(idx, idx)
			l = loss.Item()
			loss.Release()
		})
		return l
	}
	if with, without := lossWith(m.Config.Adapter.Scaling()), lossWith(0); with != without {
		t.Errorf("loss %v with fresh adapters, %v without: lora_B must start at zero", with, without)
	}
	loss := m.Loss(idx, idx)
	loss.Backward(false)
	loss.Release()
	idx.Release()
	var trained []string
	for _, p := range m.Parameters() {
		switch {
		case p.Trainable() != isAdapter(p.Name):
			t.Errorf("%s: trainable %v", p.Name, p.Trainable())
		case p.Tensor.Grad() != nil && !p.Trainable():
			t.Errorf("frozen %s got a gradient", p.Name)
		case p.Trainable() && p.Tensor.Grad() == nil:
			t.Errorf("adapter %s got no gradient", p.Name)
		case p.Trainable():
			trained = append(trained, p.Name)
		}
	}
	if want := 2 * 3 * c.Layers; len(trained) != want {
		t.Errorf("%d adapter weights trained, want %d: %v", len(trained), want, trained)
	}
	m.Release()
	if n := rt.LiveHandles(); n != 0 {
		t.Errorf("%d references left", n)
	}
}

// TestLlamaFlashMatchesEager checks on the cpu device that the sdpa path (grouped-query flash attention,
// no mask) gives the eager path's loss and gradients.
func TestLlamaFlashMatchesEager(t *testing.T) {
	c := llamaCases()[0]
	run := func(attention string) (float32, map[string][]float32) {
		rt := gptRuntime(device.CPU)
		m := c.newLlama(t, rt, func(cfg *LlamaConfig) { cfg.Attention = attention })
		idx := tokens(rt, c.Batch, c.Seq, c.Vocab)
		loss := m.Loss(idx, idx)
		loss.Backward(false)
		grads := map[string][]float32{}
		for _, p := range m.Parameters() {
			grads[p.Name] = p.Tensor.Grad().Values()
		}
		l := loss.Item()
		loss.Release()
		idx.Release()
		m.Release()
		return l, grads
	}
	l1, eager := run("naive")
	l2, flash := run("flash")
	if math.Abs(float64(l1-l2)) > 1e-5 {
		t.Errorf("loss %v eager, %v flash", l1, l2)
	}
	for name, g := range eager {
		for i := range g {
			if d := math.Abs(float64(g[i] - flash[name][i])); d > 1e-4*(1+math.Abs(float64(g[i]))) {
				t.Fatalf("gradient of %s[%d]: eager %v, flash %v", name, i, g[i], flash[name][i])
			}
		}
	}
}

// TestLlamaCheckpointedGradientsAreIdentical checks that checkpointing every layer changes no gradient, with
// LoRA (the adapters inside checkpointed layers get theirs through the input made to require grad).
func TestLlamaCheckpointedGradientsAreIdentical(t *testing.T) {
	c := llamaCases()[0]
	run := func(ckpt bool) map[string][]float32 {
		rt := gptRuntime(device.CPU)
		m := c.newLlama(t, rt, func(cfg *LlamaConfig) {
			cfg.Adapter = &LoRAConfig{Rank: 4, Alpha: 8, Dropout: 0.1, Targets: []string{"q", "k", "up"}}
		})
		// lora_B starts at zero: give it values so lora_A gets a gradient too.
		for _, p := range m.Parameters() {
			if strings.Contains(p.Name, "lora_B") {
				tensor.AddScalar_(p.Tensor, 0.01)
			}
		}
		if ckpt {
			m.Checkpoint = func(int) bool { return true }
		}
		m.InputRequiresGrad = true
		idx := tokens(rt, c.Batch, c.Seq, c.Vocab)
		loss := m.Loss(idx, idx)
		loss.Backward(false)
		grads := map[string][]float32{}
		for _, p := range Trainable(m) {
			grads[p.Name] = p.Tensor.Grad().Values()
		}
		loss.Release()
		idx.Release()
		m.Release()
		if n := rt.LiveHandles(); n != 0 {
			t.Errorf("%d references left", n)
		}
		return grads
	}
	plain, ckpt := run(false), run(true)
	if len(plain) == 0 {
		t.Fatal("no adapter gradients")
	}
	for name, g := range plain {
		if !slices.Equal(g, ckpt[name]) {
			t.Errorf("gradient of %s differs with checkpointing", name)
		}
	}
}

// TestLlamaConfigErrors checks the shape errors NewLlama reports instead of building a wrong model.
func TestLlamaConfigErrors(t *testing.T) {
	good := llamaCases()[0].llamaConfig(t)
	for name, mod := range map[string]func(*LlamaConfig){
		"heads not a multiple of kv heads": func(c *LlamaConfig) { c.KVHeads = 3 },
		"odd head dim":                     func(c *LlamaConfig) { c.HeadDim = 7 },
		"no layers":                        func(c *LlamaConfig) { c.Layers = 0 },
		"unknown attention":                func(c *LlamaConfig) { c.Attention = "sparse" },
		"qlora without lora":               func(c *LlamaConfig) { c.QLoRA = true },
	} {
		cfg := good
		mod(&cfg)
		if _, err := NewLlama(gptRuntime(device.Meta), cfg); err == nil {
			t.Errorf("%s: no error", name)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %q spans lines", name, err)
		}
	}
}
