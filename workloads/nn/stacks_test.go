package nn

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/versions"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// stacksCase is a case of testdata/stacks.py: a llamaCase and how the libraries compute it.
type stacksCase struct {
	llamaCase
	Loss      string     `json:"loss,omitempty"` // in-model, shift-logits, shift-labels, chunked:T, linear-ce:N, fused
	NumItems  bool       `json:"num_items,omitempty"`
	QLoRA     *caseQLoRA `json:"qlora,omitempty"`
	LoRADType string     `json:"lora_dtype,omitempty"`
	Torch113  bool       `json:"torch113,omitempty"`
}

type caseQLoRA struct {
	BNB         string `json:"bnb"`
	DoubleQuant bool   `json:"double_quant"`
	Storage     string `json:"storage"`
	KbitPrep    bool   `json:"kbit_prep"`
}

// versions returns the releases the case's libraries are at.
func (c stacksCase) versions(t *testing.T) versions.Set {
	var pairs []string
	switch c.Loss {
	case "in-model":
		pairs = append(pairs, "transformers=4.43.3")
	case "shift-logits":
		pairs = append(pairs, "transformers=4.46.0")
	}
	if c.QLoRA != nil {
		pairs = append(pairs, "bitsandbytes="+c.QLoRA.BNB)
	}
	if c.Torch113 {
		pairs = append(pairs, "torch=1.13.1")
	}
	s, err := versions.Parse(strings.Join(pairs, ","))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// build makes the case's model on rt.
func (c stacksCase) build(t *testing.T, rt *tensor.Runtime) *Llama {
	t.Helper()
	cfg := c.llamaConfig(t)
	switch {
	case strings.HasPrefix(c.Loss, "chunked:"):
		cfg.Loss = Loss{Kind: LossChunked}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(c.Loss, "chunked:")), &cfg.Loss.Chunk); err != nil {
			t.Fatal(err)
		}
	case strings.HasPrefix(c.Loss, "linear-ce:"):
		cfg.Loss = Loss{Kind: LossLinearCE}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(c.Loss, "linear-ce:")), &cfg.Loss.Chunk); err != nil {
			t.Fatal(err)
		}
	case c.Loss == "fused":
		cfg.Loss = Loss{Kind: LossFusedLinearCE}
	}
	if q := c.QLoRA; q != nil {
		storage := map[string]tensor.DType{"uint8": tensor.U8, "bf16": tensor.BF16, "f32": tensor.F32}[q.Storage]
		cfg.QLoRA, cfg.Quant, cfg.Prequantized = true, &tensor.Quant4Options{DoubleQuant: q.DoubleQuant, Storage: storage}, true
	}
	if cfg.Adapter != nil && c.LoRADType == "bf16" {
		cfg.Adapter.DType = tensor.BF16
	}
	m, err := NewLlama(rt, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.QLoRA != nil && c.QLoRA.KbitPrep {
		PrepareForKbitTraining(m)
	}
	if c.Checkpoint {
		m.Checkpoint = func(int) bool { return true }
		m.InputRequiresGrad = c.LoRA != nil
	}
	return m
}

// stacksCases are the libraries' behaviours on small models: the loss generations with batches of two (where
// the shifted copy of the logits is a copy), num_items_in_batch, the chunked and fused losses, QLoRA before
// and after bitsandbytes 0.43.2, with and without double quantization, in each storage, with peft's
// preparation, LoRA on lm_head and the embeddings, bf16 adapters, torch 1.13's mean.
func stacksCases() []stacksCase {
	gqa := llamaCase{Batch: 2, Seq: 8, D: 32, Heads: 4, KVHeads: 2, Layers: 2, Vocab: 50, FFN: 48}
	mha := llamaCase{Batch: 1, Seq: 6, D: 24, Heads: 3, KVHeads: 3, Layers: 1, Vocab: 37, FFN: 40}
	all := &caseLoRA{R: 2, Alpha: 16, Targets: []string{"q", "k", "v", "o", "gate", "up", "down"}}
	bf16 := func(c llamaCase) llamaCase { c.DType, c.AMP = "bf16", "bf16"; return c }
	var cases []stacksCase
	add := func(name string, c stacksCase) {
		c.name = name
		cases = append(cases, c)
	}
	for _, loss := range []string{"in-model", "shift-logits", "shift-labels", "chunked:3", "linear-ce:3", "fused"} {
		add(loss, stacksCase{llamaCase: gqa, Loss: loss})
		add(loss+"/bf16", stacksCase{llamaCase: bf16(gqa), Loss: loss})
		add(loss+"/batch 1", stacksCase{llamaCase: mha, Loss: loss})
	}
	// linear-ce's chunks: one per position, the last only the ignore column (mask_chunk[0] = True), and more
	// chunks than positions (empty ones).
	for _, loss := range []string{"linear-ce:8", "linear-ce:11"} {
		add(loss+"/bf16", stacksCase{llamaCase: bf16(gqa), Loss: loss})
	}
	add("linear-ce:3/bf16, checkpoint", stacksCase{llamaCase: func() llamaCase { c := bf16(gqa); c.Checkpoint = true; return c }(), Loss: "linear-ce:3"})
	add("shift-logits/num_items", stacksCase{llamaCase: bf16(gqa), Loss: "shift-logits", NumItems: true})
	add("shift-labels/num_items, checkpoint", stacksCase{llamaCase: func() llamaCase { c := bf16(gqa); c.Checkpoint = true; return c }(),
		Loss: "shift-labels", NumItems: true})
	qlora := func(bnb string, dq bool, storage string, prep bool) *caseQLoRA {
		return &caseQLoRA{BNB: bnb, DoubleQuant: dq, Storage: storage, KbitPrep: prep}
	}
	q := bf16(gqa)
	q.LoRA = all
	qc := q
	qc.Checkpoint = true
	for _, bnb := range []string{"0.43.1", "0.43.2"} {
		add("qlora "+bnb, stacksCase{llamaCase: q, QLoRA: qlora(bnb, true, "uint8", false)})
		add("qlora "+bnb+"/checkpoint", stacksCase{llamaCase: qc, QLoRA: qlora(bnb, true, "uint8", false)})
		add("qlora "+bnb+"/kbit prep", stacksCase{llamaCase: q, QLoRA: qlora(bnb, true, "uint8", true)})
		add("qlora "+bnb+"/kbit prep, checkpoint", stacksCase{llamaCase: qc, QLoRA: qlora(bnb, true, "uint8", true)})
	}
	add("qlora/no double quant, bf16 storage", stacksCase{llamaCase: q, QLoRA: qlora("0.43.2", false, "bf16", false)})
	add("qlora/f32 storage, bf16 adapters", stacksCase{llamaCase: q, QLoRA: qlora("0.43.1", true, "f32", true), LoRADType: "bf16"})
	ends := bf16(gqa)
	ends.LoRA = &caseLoRA{R: 4, Alpha: 8, Targets: []string{"q", "v", "lm_head", "embed"}}
	add("lora lm_head and embed", stacksCase{llamaCase: ends})
	add("lora lm_head and embed, checkpoint", stacksCase{llamaCase: func() llamaCase { c := ends; c.Checkpoint = true; return c }()})
	add("torch 1.13 mean", stacksCase{llamaCase: gqa, Torch113: true})
	add("torch 1.13 mean/bf16, checkpoint", stacksCase{llamaCase: func() llamaCase { c := bf16(gqa); c.Checkpoint = true; return c }(), Torch113: true})
	return cases
}

// TestLossGenerationsSaveWhatPyTorchSaves, TestQLoRASavesWhatBitsandbytesSaves and TestMeanBackwardOfTorch113
// compare, for the cases of their kind, the bytes saved for backward after the forward and the loss, the
// bytes MatMul4Bit holds in ctx.tensors then, and those it still holds after backward while the graph lives,
// with testdata/stacks.py's.
func TestLossGenerationsSaveWhatPyTorchSaves(t *testing.T) {
	runStacks(t, func(c stacksCase) bool { return c.QLoRA == nil && !c.Torch113 })
}

func TestQLoRASavesWhatBitsandbytesSaves(t *testing.T) {
	runStacks(t, func(c stacksCase) bool { return c.QLoRA != nil })
}

func TestMeanBackwardOfTorch113(t *testing.T) {
	var keeps bool
	torchtest.RunFile(t, "testdata/stacks.py", &keeps, "mean")
	if !keeps {
		t.Skip("this PyTorch's MeanBackward1 saves no input: the rule for torch before 2.0 cannot be checked here")
	}
	runStacks(t, func(c stacksCase) bool { return c.Torch113 })
}

func runStacks(t *testing.T, pick func(stacksCase) bool) {
	var cases []stacksCase
	for _, c := range stacksCases() {
		if pick(c) {
			cases = append(cases, c)
		}
	}
	arg, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	var want [][3]uint64
	torchtest.RunFile(t, "testdata/stacks.py", &want, "saved", string(arg))
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rt := gptRuntime(device.Meta)
			rt.SetVersions(c.versions(t))
			m := c.build(t, rt)
			idx := tokens(rt, c.Batch, c.Seq, c.Vocab)
			amp := tensor.F32
			if c.AMP == "bf16" {
				amp = tensor.BF16
			}
			loss := autocastLoss(rt, amp, func() *tensor.Tensor { return m.Loss(idx, idx) })
			checkSaved(t, rt, want[i][0])
			if got := heldBytes(rt); got != want[i][1] {
				t.Errorf("ctx.tensors hold %d bytes after the forward, PyTorch %d", got, want[i][1])
			}
			loss.Backward(false)
			if got := heldBytes(rt); got != want[i][2] {
				t.Errorf("ctx.tensors hold %d bytes after backward, PyTorch %d", got, want[i][2])
			}
			loss.Release()
			if got := heldBytes(rt); got != 0 {
				t.Errorf("ctx.tensors hold %d bytes once the graph is freed", got)
			}
			idx.Release()
			m.Release()
			if n := rt.LiveHandles(); n != 0 {
				t.Errorf("%d references left", n)
			}
		})
	}
}

func heldBytes(rt *tensor.Runtime) uint64 {
	var n uint64
	for _, st := range rt.HeldTensors("ctx.tensors") {
		n += st.Bytes
	}
	return n
}

// TestQuantStateBytesAreBitsandbytes holds the bytes of the 4-bit weights and their quant state, with and
// without double quantization and in each storage, and the other parameters' after peft's preparation, to
// the script's sums of what quantize_4bit and prepare_model_for_kbit_training leave.
func TestQuantStateBytesAreBitsandbytes(t *testing.T) {
	var cases []stacksCase
	for _, c := range stacksCases() {
		if c.QLoRA != nil {
			cases = append(cases, c)
		}
	}
	arg, _ := json.Marshal(cases)
	var want [][2]uint64
	torchtest.RunFile(t, "testdata/stacks.py", &want, "quant", string(arg))
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rt := gptRuntime(device.Meta)
			m := c.build(t, rt)
			var quant, other uint64
			for _, p := range m.Parameters() {
				if isAdapter(p.Name) {
					continue
				}
				if !p.Packed4Bit {
					other += p.Tensor.Bytes()
				}
			}
			for _, l := range m.Layers {
				for _, p := range []Projection{l.Attn.Q, l.Attn.K, l.Attn.V, l.Attn.O, l.MLP.Gate, l.MLP.Up, l.MLP.Down} {
					for _, q := range p.(*LoRALinear).Base.(*Linear4bit).Q.Tensors() {
						if q != nil {
							quant += q.Bytes()
						}
					}
				}
			}
			if quant != want[i][0] || other != want[i][1] {
				t.Errorf("4-bit weights and state %d bytes, other parameters %d; bitsandbytes and peft %d, %d", quant, other, want[i][0], want[i][1])
			}
			m.Release()
		})
	}
}

// TestChunkedAndFusedLossesMatchFull checks on the cpu device that torchtune's chunked and linear losses and
// Liger's fused linear cross-entropy give the full loss's value and the same gradients to every trained
// parameter.
func TestChunkedAndFusedLossesMatchFull(t *testing.T) {
	c := llamaCases()[0]
	run := func(loss Loss) (float32, map[string][]float32) {
		rt := gptRuntime(device.CPU)
		m := c.newLlama(t, rt, func(cfg *LlamaConfig) { cfg.Loss = loss })
		idx := tokens(rt, c.Batch, c.Seq, c.Vocab)
		l := m.Loss(idx, idx)
		l.Backward(false)
		grads := map[string][]float32{}
		for _, p := range m.Parameters() {
			if g := p.Tensor.Grad(); g != nil {
				grads[p.Name] = g.Values()
			}
		}
		v := l.Item()
		l.Release()
		idx.Release()
		m.Release()
		if n := rt.LiveHandles(); n != 0 {
			t.Errorf("%v: %d references left", loss, n)
		}
		return v, grads
	}
	full, fg := run(Loss{})
	for _, loss := range []Loss{{Kind: LossChunked, Chunk: 3}, {Kind: LossChunked, Chunk: 100}, {Kind: LossFusedLinearCE},
		{Kind: LossLinearCE, Chunk: 3}, {Kind: LossLinearCE, Chunk: 100}, {Kind: LossChunkedHeld, Chunk: 3},
		{Kind: LossChunkedHeld, Chunk: 7}, {Kind: LossChunkedHeld, Chunk: 100}} {
		got, gg := run(loss)
		if d := math.Abs(float64(got - full)); d > 1e-5 {
			t.Errorf("%v: loss %v, full %v", loss, got, full)
		}
		for name, g := range fg {
			for i := range g {
				if d := math.Abs(float64(g[i] - gg[name][i])); d > 1e-4*(1+math.Abs(float64(g[i]))) {
					t.Fatalf("%v: gradient of %s[%d]: %v, full %v", loss, name, i, gg[name][i], g[i])
				}
			}
		}
	}
}

// TestLitGPTLoopHoldsItsFloat32Logits checks LossChunkedHeld against LitGPT's loop: after the loss and its
// backward the float32 logits of every chunk are still alive (Fabric's convert_output made them, the
// loop's name holds them), B*n*V*4 bytes a chunk of n tokens, where torchtune's chunked loss holds none;
// the next forward frees them as it rebinds the name, so a second step ends where the first did.
func TestLitGPTLoopHoldsItsFloat32Logits(t *testing.T) {
	c := llamaCases()[0] // batch 2, 8 tokens, vocabulary 50
	after := func(loss Loss, steps int) int64 {
		rt := gptRuntime(device.Meta)
		m := c.newLlama(t, rt, func(cfg *LlamaConfig) { cfg.Loss = loss })
		idx := tokens(rt, c.Batch, c.Seq, c.Vocab)
		for range steps {
			l := m.Loss(idx, idx)
			l.Backward(false)
			l.Release()
			for _, p := range m.Parameters() {
				p.Tensor.SetGrad(nil)
			}
		}
		a := rt.Device().Allocator().Stats().AllocatedBytes.All().Current
		idx.Release()
		m.Release()
		if n := rt.LiveHandles(); n != 0 {
			t.Errorf("%v: %d references left", loss, n)
		}
		return a
	}
	for _, chunk := range []int{3, 8} {
		var want int64
		for start := 0; start < c.Seq; start += chunk {
			n := int64(min(chunk, c.Seq-start))
			want += (int64(c.Batch)*n*int64(c.Vocab)*4 + 511) / 512 * 512
		}
		torchtune := after(Loss{Kind: LossChunked, Chunk: chunk}, 1)
		one, two := after(Loss{Kind: LossChunkedHeld, Chunk: chunk}, 1), after(Loss{Kind: LossChunkedHeld, Chunk: chunk}, 2)
		if one-torchtune != want {
			t.Errorf("chunks of %d: %d bytes more held after backward than torchtune's loss, want the float32 logits' %d",
				chunk, one-torchtune, want)
		}
		if two != one {
			t.Errorf("chunks of %d: %d bytes after two steps, %d after one: the previous logits were not freed", chunk, two, one)
		}
	}
}
