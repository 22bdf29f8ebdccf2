package nn

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// bertConfig returns the BERT model of a case of family "bert".
func (c familyCase) bertConfig(t testing.TB, attention string) BertConfig {
	t.Helper()
	dtype := tensor.F32
	if c.DType == "bf16" {
		dtype = tensor.BF16
	}
	cfg := BertConfig{Vocab: c.Vocab, DModel: c.D, Layers: c.Layers, Heads: c.Heads, FFN: c.FFN, MaxPositions: c.MaxPos,
		TypeVocab: c.TypeVocab, Task: c.Task, Labels: c.Labels, NormEps: 1e-12, HiddenDropout: c.Dropout,
		AttnDropout: c.Dropout, Attention: attention, DType: dtype}
	if c.LoRA != nil {
		cfg.Adapter = &LoRAConfig{Rank: c.LoRA.R, Alpha: c.LoRA.Alpha, Targets: c.LoRA.Targets}
	}
	return cfg
}

// bertCases are the encoders compared: BertForMaskedLM and BertForSequenceClassification with a padded
// sample and dropout, in float32, under bf16 autocast, with checkpointing, and with LoRA (peft's default
// query and value, and every projection with the classifier's trained copy).
func bertCases() []familyCase {
	base := familyCase{Family: "bert", Batch: 2, Seq: 8, D: 32, Heads: 4, Layers: 2, Vocab: 50, FFN: 48, TypeVocab: 2,
		MaxPos: 16, Dropout: 0.1, Lengths: []int{8, 5}}
	mlm, cls := base, base
	mlm.Task, mlm.name = TaskMLM, "mlm"
	cls.Task, cls.Labels, cls.name = TaskClassify, 3, "classify"
	var cases []familyCase
	for _, c := range []familyCase{mlm, cls} {
		name := c.name
		for _, v := range []struct {
			suffix string
			mod    func(*familyCase)
		}{
			{"", func(*familyCase) {}},
			{"/bf16 autocast", func(c *familyCase) { c.AMP = "bf16" }},
			{"/checkpoint", func(c *familyCase) { c.Checkpoint = true }},
			{"/bf16 autocast, checkpoint", func(c *familyCase) { c.AMP, c.Checkpoint = "bf16", true }},
			{"/lora q,v (peft's default)", func(c *familyCase) { c.LoRA = &caseLoRA{R: 4, Alpha: 8, Targets: []string{"q", "v"}} }},
			{"/lora all, checkpoint", func(c *familyCase) { c.LoRA, c.Checkpoint = &caseLoRA{R: 2, Alpha: 8, Targets: BertProjections}, true }},
		} {
			cc := c
			v.mod(&cc)
			cc.name = name + v.suffix
			cases = append(cases, cc)
		}
	}
	unpadded := cls
	unpadded.Lengths, unpadded.name = nil, "classify/no padding"
	return append(cases, unpadded)
}

// bertBatch makes a batch of the case: token ids, the attention mask of its lengths and the task's labels.
func bertBatch(rt *tensor.Runtime, c familyCase) (idx, mask, labels *tensor.Tensor) {
	idx = tokens(rt, c.Batch, c.Seq, c.Vocab)
	var mv []float32
	for i := range c.Batch {
		for j := range c.Seq {
			if c.Lengths == nil || j < c.Lengths[i] {
				mv = append(mv, 1)
			} else {
				mv = append(mv, 0)
			}
		}
	}
	mask = rt.FromValues(tensor.I64, []int{c.Batch, c.Seq}, mv, "attention_mask", snapshot.CategoryInput)
	if c.Task == TaskMLM {
		return idx, mask, idx.Ref()
	}
	lv := make([]float32, c.Batch)
	for i := range lv {
		lv[i] = float32(i % c.Labels)
	}
	return idx, mask, rt.FromValues(tensor.I64, []int{c.Batch}, lv, "labels", snapshot.CategoryInput)
}

// TestBertSavesWhatPyTorchSaves compares the bytes autograd keeps after the forward and the loss with
// PyTorch's for testdata/families.py's BertForMaskedLM and BertForSequenceClassification (eager attention,
// the padding mask added to the scores, dropout's one-byte masks), exactly.
func TestBertSavesWhatPyTorchSaves(t *testing.T) {
	cases := bertCases()
	arg, _ := json.Marshal(cases)
	var want []uint64
	torchtest.RunFile(t, "testdata/families.py", &want, "saved", string(arg))
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rt := gptRuntime(device.Meta)
			m, err := NewBert(rt, c.bertConfig(t, "naive"))
			if err != nil {
				t.Fatal(err)
			}
			if c.Checkpoint {
				m.Checkpoint = func(int) bool { return true }
				m.InputRequiresGrad = c.LoRA != nil
			}
			idx, mask, labels := bertBatch(rt, c)
			m.UseAttentionMask(mask, c.Lengths)
			mask.Release()
			amp := tensor.F32
			if c.AMP == "bf16" {
				amp = tensor.BF16
			}
			loss := autocastLoss(rt, amp, func() *tensor.Tensor { return m.Loss(idx, labels) })
			checkSaved(t, rt, want[i])
			labels.Release()
			backwardAndRelease(t, rt, loss, idx, m.Release)
		})
	}
}

// TestBertSDPAMatchesEager checks on the cpu device that sdpa attention (the memory-efficient kernel with the
// padded batch's mask, the flash kernel without one) gives eager attention's loss and gradients, and that
// checkpointing every layer changes no gradient.
func TestBertSDPAMatchesEager(t *testing.T) {
	for _, c := range bertCases() {
		if c.AMP != "" || c.Checkpoint || c.LoRA != nil {
			continue
		}
		c.Dropout = 0 // the kernels draw their dropout apart from eager attention's mask
		run := func(attention string, ckpt bool) (float32, map[string][]float32) {
			rt := gptRuntime(device.CPU)
			m, err := NewBert(rt, c.bertConfig(t, attention))
			if err != nil {
				t.Fatal(err)
			}
			if ckpt {
				m.Checkpoint = func(int) bool { return true }
			}
			idx, mask, labels := bertBatch(rt, c)
			m.UseAttentionMask(mask, c.Lengths)
			mask.Release()
			loss := m.Loss(idx, labels)
			loss.Backward(false)
			grads := map[string][]float32{}
			for _, p := range m.Parameters() {
				if g := p.Tensor.Grad(); g != nil {
					grads[p.Name] = g.Values()
				}
			}
			l := loss.Item()
			loss.Release()
			labels.Release()
			idx.Release()
			m.Release()
			if n := rt.LiveHandles(); n != 0 {
				t.Errorf("%d references left", n)
			}
			return l, grads
		}
		t.Run(c.name, func(t *testing.T) {
			l1, eager := run("naive", false)
			l2, sdpa := run("flash", false)
			_, ckpt := run("naive", true)
			if math.Abs(float64(l1-l2)) > 1e-5 {
				t.Errorf("loss %v eager, %v sdpa", l1, l2)
			}
			for p, g := range eager {
				if !slices.Equal(g, ckpt[p]) {
					t.Errorf("gradient of %s differs with checkpointing", p)
				}
				for i := range g {
					if d := math.Abs(float64(g[i] - sdpa[p][i])); d > 1e-4*(1+math.Abs(float64(g[i]))) {
						t.Fatalf("gradient of %s[%d]: eager %v, sdpa %v", p, i, g[i], sdpa[p][i])
					}
				}
			}
		})
	}
}

// TestBertConfigErrors checks the errors NewBert reports.
func TestBertConfigErrors(t *testing.T) {
	good := bertCases()[0].bertConfig(t, "naive")
	for name, mod := range map[string]func(*BertConfig){
		"heads do not divide d_model": func(c *BertConfig) { c.Heads = 5 },
		"unknown task":                func(c *BertConfig) { c.Task = "ner" },
		"classify without labels":     func(c *BertConfig) { c.Task, c.Labels = TaskClassify, 0 },
		"no gate in bert":             func(c *BertConfig) { c.Adapter = &LoRAConfig{Rank: 2, Alpha: 2, Targets: []string{"gate"}} },
	} {
		cfg := good
		mod(&cfg)
		if _, err := NewBert(gptRuntime(device.Meta), cfg); err == nil {
			t.Errorf("%s: no error", name)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %q spans lines", name, err)
		}
	}
}
