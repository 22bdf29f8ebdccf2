package nn

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// selectivePolicy is --checkpoint selective:ops's policy.
func selectivePolicy() *tensor.CheckpointPolicy { return tensor.NewCheckpointPolicy(knob.SavedOps) }

// TestSelectiveCheckpointKeepsWhatThePolicySaves compares the bytes held for backward after the forward and
// the loss, with every block checkpointed under selective:ops' policy, with PyTorch's: testdata/selective.py
// runs the same models (nanoGPT, the HF-style Llama) and keeps, in each block, every output of the ops the
// policy names as PyTorch's dispatcher runs them, beside the block's saved inputs. PyTorch 1.13 has no
// create_selective_checkpoint_contexts; the script does what its caching dispatch mode does in the forward.
// The per-block figures differ from full checkpointing's by the matmul outputs only, so the comparison pins
// which ops the runtime's modules decompose into, and in which dtype under autocast.
func TestSelectiveCheckpointKeepsWhatThePolicySaves(t *testing.T) {
	ops, _ := json.Marshal(knob.SavedOps)
	gptCases := [][]any{{2, 8, 16, 4, 1, 11, "f32"}, {2, 8, 16, 4, 3, 11, "f32"}, {3, 16, 32, 2, 2, 50, "bf16"},
		{4, 5, 24, 3, 2, 13, "bf16"}}
	arg, _ := json.Marshal(gptCases)
	var want []uint64
	torchtest.RunFile(t, "testdata/selective.py", &want, "gpt", string(ops), string(arg))
	for i, c := range gptCases {
		t.Run(fmt.Sprint("gpt", c), func(t *testing.T) {
			rt := gptRuntime(device.Meta)
			rt.SetCheckpointPolicy(selectivePolicy())
			batch, seq, d, heads, layers, vocab := c[0].(int), c[1].(int), c[2].(int), c[3].(int), c[4].(int), c[5].(int)
			g, err := NewGPT(rt, GPTConfig{BlockSize: seq, Vocab: vocab, Layers: layers, Heads: heads, DModel: d,
				Bias: true, Attention: "naive", DType: tensor.F32})
			if err != nil {
				t.Fatal(err)
			}
			g.Checkpoint = func(int) bool { return true }
			amp := tensor.F32
			if c[6] == "bf16" {
				amp = tensor.BF16
			}
			idx := tokens(rt, batch, seq, vocab)
			loss := autocastLoss(rt, amp, func() *tensor.Tensor { return g.Loss(idx, idx) })
			checkSaved(t, rt, want[i])
			backwardAndRelease(t, rt, loss, idx, g.Release)
		})
	}

	var llama []llamaCase
	for _, c := range llamaCases() {
		if c.Checkpoint { // the checkpointed cases, each under the policy instead
			llama = append(llama, c)
		}
	}
	arg, _ = json.Marshal(llama)
	torchtest.RunFile(t, "testdata/selective.py", &want, "llama", string(ops), string(arg))
	for i, c := range llama {
		t.Run(c.name, func(t *testing.T) {
			rt := gptRuntime(device.Meta)
			rt.SetCheckpointPolicy(selectivePolicy())
			m, err := NewLlama(rt, c.llamaConfig(t))
			if err != nil {
				t.Fatal(err)
			}
			m.Checkpoint = func(int) bool { return true }
			m.InputRequiresGrad = c.LoRA != nil
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

// TestSelectiveCheckpointGradientsAreIdentical checks on the cpu device that the policy changes no gradient,
// bit for bit: the recompute takes back the outputs the forward kept (the matmuls', and the flash kernel's
// output and log-sum-exp) and recomputes the rest with the same dropout draws, in float32 and under
// autocast.
func TestSelectiveCheckpointGradientsAreIdentical(t *testing.T) {
	for _, amp := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, attention := range []string{"naive", "flash"} {
			t.Run(fmt.Sprintf("%v/%s", amp, attention), func(t *testing.T) {
				cfg := smallGPT(attention, 0.2)
				l1, plain := trainGrads(t, cfg, false, amp)
				l2, selective := selectiveGrads(t, cfg, amp)
				if l1 != l2 {
					t.Errorf("loss %v without checkpointing, %v under the policy", l1, l2)
				}
				for name, g := range plain {
					if !slices.Equal(g, selective[name]) {
						t.Errorf("gradient of %s differs under the policy", name)
					}
				}
			})
		}
	}
}

// selectiveGrads is trainGrads with every block checkpointed under selective:ops' policy.
func selectiveGrads(t *testing.T, cfg GPTConfig, amp tensor.DType) (float32, map[string][]float32) {
	t.Helper()
	rt := gptRuntime(device.CPU)
	rt.SetCheckpointPolicy(selectivePolicy())
	g, err := NewGPT(rt, cfg)
	if err != nil {
		t.Fatal(err)
	}
	g.Checkpoint = func(int) bool { return true }
	idx := tokens(rt, 2, cfg.BlockSize, cfg.Vocab)
	loss := autocastLoss(rt, amp, func() *tensor.Tensor { return g.Loss(idx, idx) })
	loss.Backward(false)
	grads := map[string][]float32{}
	for _, p := range g.Parameters() {
		grads[p.Name] = p.Tensor.Grad().Values()
	}
	l := loss.Item()
	loss.Release()
	idx.Release()
	g.Release()
	if n := rt.LiveHandles(); n != 0 {
		t.Errorf("%d references left after releasing everything", n)
	}
	return l, grads
}
