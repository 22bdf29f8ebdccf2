package tensor

import (
	"math/rand/v2"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

// TestFamilyOpGradients checks the gradients of the ops the model families beside Llama add against central
// finite differences: Gemma's tanh and gelu tanh, Qwen2-MoE's sigmoid, the router's top-k and in-place
// renormalisation, the experts' gathers and index_add_, the auxiliary loss's mean over rows, and flash
// attention told a scale, a soft-cap, a window and padded keys.
func TestFamilyOpGradients(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	idx := func(v ...float32) input { return input{shape: []int{len(v)}, values: v, dtype: I64, noGrad: true} }
	tests := map[string]struct {
		inputs []input
		build  func(rt *Runtime, xs []*Tensor) *Tensor
	}{
		"tanh":      {[]input{randInput(r, 3, 4)}, func(_ *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Tanh(xs[0])) }},
		"sigmoid":   {[]input{randInput(r, 3, 4)}, func(_ *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Sigmoid(xs[0])) }},
		"gelu tanh": {[]input{randInput(r, 3, 4)}, func(_ *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, GELUTanh(xs[0])) }},
		"rsub":      {[]input{randInput(r, 3, 4)}, func(_ *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Rsub(xs[0], 1)) }},
		"mean rows": {[]input{randInput(r, 5, 3)}, func(_ *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, MeanRows(xs[0])) }},
		"top-k renormalised in place": {
			inputs: []input{randInput(r, 4, 6)},
			build: func(_ *Runtime, xs []*Tensor) *Tensor {
				p := Softmax(xs[0])
				defer p.Release()
				w, ix := TopK(p, 2)
				defer ix.Release()
				s := SumLast(w)
				defer s.Release()
				d := Div_(w, s)
				w.Release()
				return out(weightedSum, d)
			},
		},
		"gather, pick and index_add_": {
			inputs: []input{randInput(r, 5, 3), randInput(r, 5, 2), idx(0, 2, 3, 4), idx(1, 0, 1, 1)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				rows := IndexRows(xs[0], xs[2])
				defer rows.Release()
				w := IndexPairs(xs[1], xs[2], xs[3])
				defer w.Release()
				p := Mul(rows, w)
				defer p.Release()
				final := rt.Zeros(F32, []int{5, 3}, "final", snapshot.CategoryTemporary)
				defer final.Release()
				return out(weightedSum, IndexAdd_(final, xs[2], p))
			},
		},
		"flash attention with scale, soft-cap, window and padding": {
			inputs: []input{randInput(r, 2, 2, 5, 4), randInput(r, 2, 1, 5, 4), randInput(r, 2, 1, 5, 4)},
			build: func(_ *Runtime, xs []*Tensor) *Tensor {
				return out(weightedSum, FlashAttentionWith(xs[0], xs[1], xs[2], AttentionOptions{
					Causal: true, Scale: 0.3, Softcap: 2, Window: 3, KeyLens: []int{5, 4}}))
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { gradCheck(t, tc.inputs, tc.build) })
	}
}
