package nn

import (
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// TestSequenceParallelLinearsSaveTheShard: under sequence parallelism over 2 ranks every column-parallel
// projection, lm_head's included, saves the rank's half of the tokens, not the gathered sequence, as
// Megatron's LinearWithGradAccumulationAndAsyncCommunication does.
func TestSequenceParallelLinearsSaveTheShard(t *testing.T) {
	const b, s, d = 2, 8, 16
	for _, sp := range []int{2, 4} {
		rt := gptRuntime(device.Meta)
		m, err := NewLlama(rt, LlamaConfig{Vocab: 32, DModel: d, Layers: 1, Heads: 2, KVHeads: 2, FFN: 24, NormEps: 1e-5,
			RopeTheta: 10000, Attention: "flash", DType: tensor.BF16, Split: Split{SP: sp}})
		if err != nil {
			t.Fatal(err)
		}
		idx := rt.Zeros(tensor.I64, []int{b, s}, "idx", snapshot.CategoryInput)
		logits, loss := m.ForwardLoss(idx, idx)
		want := []int{b, s / sp, d}
		inputs := 0
		seen := map[*tensor.Node]bool{}
		var walk func(n *tensor.Node)
		walk = func(n *tensor.Node) {
			if n == nil || seen[n] {
				return
			}
			seen[n] = true
			if n.Name() == "LinearWithGradAccumulationAndAsyncCommunicationBackward" {
				for _, x := range n.Saved() {
					if x.NDim() == 3 && x.Dim(-1) == d {
						inputs++
						if !slices.Equal(x.Shape(), want) {
							t.Errorf("sp %d: %s in %s saves %v, want %v", sp, n.Name(), n.Scope(), x.Shape(), want)
						}
					}
				}
			}
			for _, next := range n.Next() {
				walk(next)
			}
		}
		walk(loss.GradFn())
		if inputs != 6 { // q, k, v, gate, up and lm_head
			t.Errorf("sp %d: %d gathering linears save an input, want 6", sp, inputs)
		}
		logits.Release()
		loss.Release()
	}
}
