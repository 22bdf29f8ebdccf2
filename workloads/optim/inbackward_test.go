package optim

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// TestInBackwardStepsAsTorchtuneDoes holds the optimizer step in backward against PyTorch running torchtune's
// hooks (testdata/inbackward.py): the parameters are stepped in the order backward accumulates their
// gradients, and when each hook runs the only gradient alive is its parameter's, which is gone after it: at
// no moment of backward are two gradients held. nanoGPT with tied embeddings, whose gradient is
// accumulated from two uses before its one hook runs.
func TestInBackwardStepsAsTorchtuneDoes(t *testing.T) {
	shape := []int{2, 8, 16, 4, 2, 11} // batch, seq, d, heads, layers, vocab
	arg, _ := json.Marshal(shape)
	var want [][3]any
	torchtest.RunFile(t, "testdata/inbackward.py", &want, string(arg))

	rt := runtimeOn(device.Meta)
	g, err := nn.NewGPT(rt, nn.GPTConfig{BlockSize: shape[1], Vocab: shape[5], Layers: shape[4], Heads: shape[3],
		DModel: shape[2], Bias: true, Attention: "naive", DType: tensor.F32})
	if err != nil {
		t.Fatal(err)
	}
	params := g.Parameters()
	gradBytes := func() (n uint64) {
		for _, p := range params {
			if gr := p.Tensor.Grad(); gr != nil {
				n += uint64(gr.Numel() * gr.DType().Size())
			}
		}
		return n
	}
	var got [][3]any
	for _, p := range params { // runs before the step: the hooks run in the order they were registered
		p.Tensor.OnGradAccumulated(func() { got = append(got, [3]any{p.Name, float64(gradBytes()), nil}) })
	}
	opt, err := NewInBackward(rt, params, Config{Kind: knob.AdamW}, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range params {
		p.Tensor.OnGradAccumulated(func() { got[len(got)-1][2] = float64(gradBytes()) })
	}
	idx := rt.FromValues(tensor.I64, []int{shape[0], shape[1]}, make([]float32, shape[0]*shape[1]), "idx", snapshot.CategoryInput)
	loss := g.Loss(idx, idx)
	loss.Backward(false)
	if len(got) != len(want) {
		t.Fatalf("%d hooks ran, PyTorch %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if !slices.Equal(got[i][:], want[i][:]) {
			t.Errorf("hook %d: %v, PyTorch %v", i, got[i], want[i])
		}
	}
	if n := gradBytes(); n != 0 {
		t.Errorf("%d bytes of gradients alive after backward", n)
	}
	loss.Release()
	idx.Release()
	opt.Release()
	g.Release()
	if n := rt.LiveHandles(); n != 0 {
		t.Errorf("%d references left", n)
	}
}
