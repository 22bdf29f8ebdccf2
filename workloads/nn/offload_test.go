package nn

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// TestActivationOffloadMovesWhatTorchtuneMoves compares what torchtune's OffloadActivations (without
// streams) moves to pinned host memory, and what it leaves saved on the device, with PyTorch's saved tensors
// under the same rule (testdata/offload.py): the model's forward up to the output head offloaded, every saved
// view of at least 1024 bytes that is not a parameter itself (a transposed weight is offloaded), each copy a
// power-of-two pinned block; the head and the loss saved as usual. nanoGPT and the HF-style Llama, in
// float32 and bf16 autocast, with checkpointing (whose saved inputs are offloaded) and LoRA.
func TestActivationOffloadMovesWhatTorchtuneMoves(t *testing.T) {
	offloaded := func(rt *tensor.Runtime) *allocator.HostAllocator {
		h := allocator.NewHostAllocator()
		rt.SetActivationOffload(&tensor.ActivationOffload{Host: tensor.NewRuntime(device.NewHost(device.Meta, h), nil, 1),
			MinBytes: 1024, MaxStash: 5, Head: "lm_head"})
		return h
	}
	check := func(t *testing.T, rt *tensor.Runtime, h *allocator.HostAllocator, want [2]uint64) {
		t.Helper()
		if got := h.Stats().Allocated; got != want[0] {
			t.Errorf("%d bytes of pinned host memory, PyTorch's saved tensors under the rule %d", got, want[0])
		}
		checkSaved(t, rt, want[1])
	}

	gptCases := [][]any{{2, 8, 16, 4, 1, 11, "f32"}, {3, 16, 32, 2, 2, 50, "bf16"}, {4, 5, 24, 3, 2, 13, "f32"}}
	arg, _ := json.Marshal(gptCases)
	var want [][2]uint64
	torchtest.RunFile(t, "testdata/offload.py", &want, "gpt", string(arg))
	for i, c := range gptCases {
		t.Run(fmt.Sprint("gpt", c), func(t *testing.T) {
			rt := gptRuntime(device.Meta)
			h := offloaded(rt)
			batch, seq, d, heads, layers, vocab := c[0].(int), c[1].(int), c[2].(int), c[3].(int), c[4].(int), c[5].(int)
			g, err := NewGPT(rt, GPTConfig{BlockSize: seq, Vocab: vocab, Layers: layers, Heads: heads, DModel: d,
				Bias: true, Attention: "naive", DType: tensor.F32})
			if err != nil {
				t.Fatal(err)
			}
			amp := tensor.F32
			if c[6] == "bf16" {
				amp = tensor.BF16
			}
			idx := tokens(rt, batch, seq, vocab)
			var loss *tensor.Tensor
			rt.OffloadForward(func() { loss = autocastLoss(rt, amp, func() *tensor.Tensor { return g.Loss(idx, idx) }) })
			check(t, rt, h, want[i])
			backwardAndRelease(t, rt, loss, idx, g.Release)
		})
	}

	var llama []llamaCase
	for _, c := range llamaCases() {
		if c.DType == "" || c.LoRA != nil { // the float32 models, and the adapters
			llama = append(llama, c)
		}
	}
	arg, _ = json.Marshal(llama)
	torchtest.RunFile(t, "testdata/offload.py", &want, "llama", string(arg))
	for i, c := range llama {
		t.Run(c.name, func(t *testing.T) {
			rt := gptRuntime(device.Meta)
			h := offloaded(rt)
			m, err := NewLlama(rt, c.llamaConfig(t))
			if err != nil {
				t.Fatal(err)
			}
			if c.Checkpoint {
				m.Checkpoint = func(int) bool { return true }
				m.InputRequiresGrad = c.LoRA != nil
			}
			amp := tensor.F32
			if c.AMP == "bf16" {
				amp = tensor.BF16
			}
			idx := tokens(rt, c.Batch, c.Seq, c.Vocab)
			var loss *tensor.Tensor
			rt.OffloadForward(func() { loss = autocastLoss(rt, amp, func() *tensor.Tensor { return m.Loss(idx, idx) }) })
			check(t, rt, h, want[i])
			backwardAndRelease(t, rt, loss, idx, m.Release)
		})
	}
}

// TestActivationOffloadGradientsAreIdentical checks on the cpu device that offloading (with the copy stream
// and its stashes, with and without checkpointing) changes no gradient: every saved tensor comes back with
// its values, in its layout.
func TestActivationOffloadGradientsAreIdentical(t *testing.T) {
	for _, checkpoint := range []bool{false, true} {
		for _, attention := range []string{"naive", "flash"} {
			t.Run(fmt.Sprintf("checkpoint %v/%s", checkpoint, attention), func(t *testing.T) {
				cfg := smallGPT(attention, 0.2)
				l1, plain := trainGrads(t, cfg, checkpoint, tensor.F32)
				rt := gptRuntime(device.CPU)
				rt.SetActivationOffload(&tensor.ActivationOffload{Streams: true, MinBytes: 64, MaxStash: 5, Head: "lm_head",
					Host: tensor.NewRuntime(device.NewHost(device.CPU, allocator.NewHostAllocator()), nil, 1)})
				g, err := NewGPT(rt, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if checkpoint {
					g.Checkpoint = func(int) bool { return true }
				}
				idx := tokens(rt, 2, cfg.BlockSize, cfg.Vocab)
				var loss *tensor.Tensor
				rt.OffloadForward(func() { loss = g.Loss(idx, idx) })
				loss.Backward(false)
				if l2 := loss.Item(); l1 != l2 {
					t.Errorf("loss %v, %v offloaded", l1, l2)
				}
				for _, p := range g.Parameters() {
					if got := p.Tensor.Grad().Values(); !slices.Equal(got, plain[p.Name]) {
						t.Errorf("gradient of %s differs offloaded", p.Name)
					}
				}
				loss.Release()
				idx.Release()
				g.Release()
				if n := rt.LiveHandles(); n != 0 {
					t.Errorf("%d references left after releasing everything", n)
				}
			})
		}
	}
}
