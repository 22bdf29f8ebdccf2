package nn

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

func gptRuntime(kind device.Kind) *tensor.Runtime {
	return tensor.NewRuntime(device.NewSimulated(kind, 0, 64<<30, 0, allocator.DefaultConfig()), nil, 3)
}

// tokens allocates a (batch, seq) batch of token ids drawn from the runtime's generator.
func tokens(rt *tensor.Runtime, batch, seq, vocab int) *tensor.Tensor {
	v := make([]float32, batch*seq)
	for i := range v {
		v[i] = float32(rt.Rand().IntN(vocab))
	}
	return rt.FromValues(tensor.I64, []int{batch, seq}, v, "idx", snapshot.CategoryInput)
}

// TestGPTSavesWhatPyTorchSaves compares the bytes autograd keeps after the forward pass and the loss with
// PyTorch's, for nanoGPT at dropout 0 (naive attention), counted once per storage without parameters: in
// float32, and under bfloat16 autocast with CUDA's rules (testdata/nanogpt.py runs CPU autocast, which
// applies them to this model, with softmax and cross_entropy called as CUDA autocast calls them). Several
// layer counts per width pin the per-block figure, not just the total.
func TestGPTSavesWhatPyTorchSaves(t *testing.T) {
	type shape struct{ Batch, Seq, D, Heads, Layers, Vocab int }
	shapes := []shape{
		{2, 8, 16, 4, 1, 11}, {2, 8, 16, 4, 2, 11}, {2, 8, 16, 4, 3, 11},
		{3, 16, 32, 2, 2, 50}, {1, 32, 48, 6, 1, 7}, {4, 5, 24, 3, 2, 13},
	}
	rows := make([][]int, len(shapes))
	for i, s := range shapes {
		rows[i] = []int{s.Batch, s.Seq, s.D, s.Heads, s.Layers, s.Vocab}
	}
	arg, _ := json.Marshal(rows)
	for _, amp := range []tensor.DType{tensor.F32, tensor.BF16} {
		var want []uint64
		torchtest.RunFile(t, "testdata/nanogpt.py", &want, string(arg), amp.String())
		for i, s := range shapes {
			t.Run(fmt.Sprintf("%v/%+v", amp, s), func(t *testing.T) {
				rt := gptRuntime(device.Meta)
				g, err := NewGPT(rt, GPTConfig{BlockSize: s.Seq, Vocab: s.Vocab, Layers: s.Layers, Heads: s.Heads, DModel: s.D,
					Bias: true, Attention: "naive", DType: tensor.F32})
				if err != nil {
					t.Fatal(err)
				}
				idx := tokens(rt, s.Batch, s.Seq, s.Vocab)
				loss := autocastLoss(rt, amp, func() *tensor.Tensor { return g.Loss(idx, idx) })
				checkSaved(t, rt, want[i])
				backwardAndRelease(t, rt, loss, idx, g.Release)
			})
		}
	}
}

// checkSaved compares the bytes autograd keeps for backward with PyTorch's, listing them on a difference.
func checkSaved(t *testing.T, rt *tensor.Runtime, want uint64) {
	t.Helper()
	var got uint64
	for _, st := range rt.SavedTensors() {
		got += st.Bytes
	}
	if got != want {
		for _, st := range rt.SavedTensors() {
			t.Logf("%8d  %s  %v", st.Bytes, st.Label, st.Holders)
		}
		t.Errorf("saved %d bytes for backward, PyTorch %d", got, want)
	}
}

// backwardAndRelease runs backward through loss, releases it, the input and the model, and checks that no
// reference is left.
func backwardAndRelease(t *testing.T, rt *tensor.Runtime, loss, idx *tensor.Tensor, release func()) {
	t.Helper()
	loss.Backward(false)
	loss.Release()
	idx.Release()
	release()
	if n := rt.LiveHandles(); n != 0 {
		t.Errorf("%d references left after releasing everything", n)
	}
}

// autocastLoss runs f under autocast to amp, or as it is for F32.
func autocastLoss(rt *tensor.Runtime, amp tensor.DType, f func() *tensor.Tensor) *tensor.Tensor {
	if amp == tensor.F32 {
		return f()
	}
	var loss *tensor.Tensor
	rt.Autocast(amp, func() { loss = f() })
	return loss
}

// trainGrads runs one forward (under autocast to amp unless it is F32) and backward of a small GPT on the cpu
// device and returns the loss and every parameter's gradient.
func trainGrads(t *testing.T, cfg GPTConfig, checkpoint bool, amp tensor.DType) (float32, map[string][]float32) {
	t.Helper()
	rt := gptRuntime(device.CPU)
	g, err := NewGPT(rt, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if checkpoint {
		g.Checkpoint = func(int) bool { return true }
	}
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
	return l, grads
}

func smallGPT(attention string, dropout float32) GPTConfig {
	return GPTConfig{BlockSize: 8, Vocab: 13, Layers: 2, Heads: 2, DModel: 8, Bias: true, Dropout: dropout,
		Attention: attention, DType: tensor.F32}
}

// TestCheckpointedGradientsAreIdentical checks that checkpointing every block changes no gradient, bit for
// bit, in float32 and under autocast: the recompute draws the same dropout masks and, as
// torch/utils/checkpoint.py re-enters the forward's autocast state, runs in the same dtypes.
func TestCheckpointedGradientsAreIdentical(t *testing.T) {
	for _, amp := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
		for _, attention := range []string{"naive", "flash"} {
			t.Run(fmt.Sprintf("%v/%s", amp, attention), func(t *testing.T) {
				cfg := smallGPT(attention, 0.2) // dropout on: the recompute must draw the same masks
				l1, plain := trainGrads(t, cfg, false, amp)
				l2, ckpt := trainGrads(t, cfg, true, amp)
				if l1 != l2 {
					t.Errorf("loss %v without checkpointing, %v with", l1, l2)
				}
				for name, g := range plain {
					if !slices.Equal(g, ckpt[name]) {
						t.Errorf("gradient of %s differs with checkpointing", name)
					}
				}
			})
		}
	}
}

func TestFlashAttentionMatchesNaive(t *testing.T) {
	l1, naive := trainGrads(t, smallGPT("naive", 0), false, tensor.F32)
	l2, flash := trainGrads(t, smallGPT("flash", 0), false, tensor.F32)
	if math.Abs(float64(l1-l2)) > 1e-5 {
		t.Errorf("loss %v naive, %v flash", l1, l2)
	}
	for name, g := range naive {
		for i := range g {
			if d := math.Abs(float64(g[i] - flash[name][i])); d > 1e-5*(1+math.Abs(float64(g[i]))) {
				t.Fatalf("gradient of %s[%d]: naive %v, flash %v", name, i, g[i], flash[name][i])
			}
		}
	}
}

func TestFlashSavesNoScores(t *testing.T) {
	const b, seq, d, heads = 2, 64, 32, 4
	for _, attention := range []string{"naive", "flash"} {
		rt := gptRuntime(device.Meta)
		g, _ := NewGPT(rt, GPTConfig{BlockSize: seq, Vocab: 50, Layers: 2, Heads: heads, DModel: d, Bias: true,
			Dropout: 0.1, Attention: attention, DType: tensor.F32})
		idx := tokens(rt, b, seq, 50)
		loss := g.Loss(idx, idx)
		scores := fmt.Sprintf("[%d,%d,%d,%d]", b, heads, seq, seq)
		var found []string
		for _, st := range rt.SavedTensors() {
			if strings.Contains(st.Label, scores) || strings.Contains(st.Label, fmt.Sprintf("[%d,%d,%d]", b*heads, seq, seq)) {
				found = append(found, st.Label)
			}
			if strings.Contains(st.Label, "dropout.mask") && st.Category != "activation" {
				t.Errorf("%s: dropout mask %s has category %s", attention, st.Label, st.Category)
			}
		}
		switch {
		case attention == "flash" && len(found) > 0:
			t.Errorf("flash attention saved T x T tensors: %v", found)
		case attention == "naive" && len(found) == 0:
			t.Error("naive attention saved no T x T tensor")
		}
		loss.Release()
		idx.Release()
		g.Release()
	}
}

func TestDropoutMaskIsOneBytePerElement(t *testing.T) {
	rt := gptRuntime(device.Meta)
	x := rt.Empty(tensor.F32, []int{4, 1000}, "x").SetRequiresGrad(true)
	y := tensor.Dropout(x, 0.1, true)
	var mask *tensor.SavedTensor
	for _, st := range rt.SavedTensors() {
		if strings.Contains(st.Label, "dropout.mask") {
			mask = &st
		}
	}
	if mask == nil || mask.Bytes != 4000 {
		t.Fatalf("dropout saved %+v, want a 4000-byte mask", mask)
	}
	y.Release()
	x.Release()
}

func TestGradientAccumulationEqualsTheLargeBatch(t *testing.T) {
	cfg := smallGPT("flash", 0)
	rt := gptRuntime(device.CPU)
	g, _ := NewGPT(rt, cfg)
	idx := tokens(rt, 4, cfg.BlockSize, cfg.Vocab)
	tgt := tokens(rt, 4, cfg.BlockSize, cfg.Vocab)
	grads := func() map[string][]float32 {
		out := map[string][]float32{}
		for _, p := range g.Parameters() {
			out[p.Name] = p.Tensor.Grad().Values()
			p.Tensor.SetGrad(nil)
		}
		return out
	}

	loss := g.Loss(idx, tgt)
	loss.Backward(false)
	loss.Release()
	large := grads()

	for _, half := range [][2]int{{0, 2}, {2, 2}} { // two micro-batches of 2, each loss divided by 2
		x, y := idx.Narrow(0, half[0], half[1]), tgt.Narrow(0, half[0], half[1])
		xc, yc := x.Contiguous(), y.Contiguous()
		l := g.Loss(xc, yc)
		scaled := tensor.Scale(l, 0.5)
		scaled.Backward(false)
		for _, r := range []*tensor.Tensor{x, y, xc, yc, l, scaled} {
			r.Release()
		}
	}
	accum := grads()
	for name, want := range large {
		for i := range want {
			if d := math.Abs(float64(want[i] - accum[name][i])); d > 1e-5*(1+math.Abs(float64(want[i]))) {
				t.Fatalf("%s[%d]: batch of 4 gives %v, two accumulated micro-batches %v", name, i, want[i], accum[name][i])
			}
		}
	}
	idx.Release()
	tgt.Release()
	g.Release()
}

// TestCheckpointingKeepsOnlyBlockInputs checks what stays saved after the forward pass when every block is
// checkpointed: each block's input, held by its CheckpointFunctionBackward, and nothing saved inside a block;
// the embeddings, final LayerNorm, LM head and loss outside the blocks save as usual.
func TestCheckpointingKeepsOnlyBlockInputs(t *testing.T) {
	for _, attention := range []string{"naive", "flash"} {
		t.Run(attention, func(t *testing.T) {
			rt := gptRuntime(device.Meta)
			cfg := GPTConfig{BlockSize: 32, Vocab: 50, Layers: 3, Heads: 2, DModel: 16, Bias: true, Dropout: 0.1,
				Attention: attention, DType: tensor.F32}
			g, _ := NewGPT(rt, cfg)
			g.Checkpoint = func(int) bool { return true }
			idx := tokens(rt, 2, cfg.BlockSize, cfg.Vocab)
			loss := g.Loss(idx, idx)
			var inputs int
			for _, st := range rt.SavedTensors() {
				for _, h := range st.Holders {
					switch {
					case strings.HasPrefix(h, "CheckpointFunctionBackward"):
						inputs++
						if want := fmt.Sprintf("f32[2,%d,%d]", cfg.BlockSize, cfg.DModel); !strings.HasPrefix(st.Label, want) {
							t.Errorf("checkpoint saved %s, want a block input %s", st.Label, want)
						}
					case strings.Contains(h, "[transformer.h."):
						t.Errorf("%s saved %s inside a checkpointed block", h, st.Label)
					}
				}
			}
			if inputs != cfg.Layers {
				t.Errorf("%d checkpointed block inputs saved, want %d", inputs, cfg.Layers)
			}
			loss.Backward(false)
			loss.Release()
			idx.Release()
			g.Release()
			if n := rt.LiveHandles(); n != 0 {
				t.Errorf("%d references left", n)
			}
		})
	}
}
