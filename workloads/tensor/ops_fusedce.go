package tensor

import (
	"math"
	"math/bits"
)

// FusedLinearCrossEntropy is Liger's fused linear cross-entropy (liger_kernel/ops/fused_linear_cross_entropy.py,
// fused_linear_cross_entropy_forward, mean reduction, no bias, a frozen weight): the mean cross-entropy of
// x @ w.T against target (ignore_index -100) without materialising the logits. It allocates grad_input (x's
// shape and dtype, zeros), grad_weight (w's, zeros) when w trains, the float32 per-row losses and the mask of
// rows counted; then, for each chunk of
// next_power_of_2(ceil(rows / ceil(vocab / hidden))) rows, the chunk's logits (in x's dtype), which the
// cross-entropy kernel overwrites with their gradient, grad_logits @ w, copied into grad_input, and
// grad_logits.T @ x added into grad_weight in place. The gradients are computed in the forward: they are what
// it saves (ctx.save_for_backward), and its backward hands them back, scaled in place when the incoming
// gradient is not 1. w is cast to x's dtype first when they differ (autocast's cast of a float32 lm_head).
func FusedLinearCrossEntropy(x, w, target *Tensor) *Tensor {
	x.check()
	w.check()
	target.check()
	rt := x.rt
	if x.NDim() != 2 || w.NDim() != 2 || x.Dim(1) != w.Dim(1) || target.Numel() != x.Dim(0) {
		errShape("FusedLinearCrossEntropy", "input %v, weight %v and target %v do not match", x.shape, w.shape, target.shape)
	}
	if w.dtype != x.dtype {
		wc := ToDType(w, x.dtype)
		defer wc.Release()
		w = wc
	}
	rows, hidden, vocab := x.Dim(0), x.Dim(1), w.Dim(0)
	chunk := fusedCEChunk(rows, hidden, vocab)
	gradInput := rt.Zeros(x.dtype, x.shape, "fused_linear_ce.grad_input", rt.category)
	var gradWeight *Tensor
	if rt.needsGrad(w) {
		gradWeight = rt.Zeros(w.dtype, w.shape, "fused_linear_ce.grad_weight", rt.category)
	}
	loss1d := rt.Zeros(F32, []int{rows}, "fused_linear_ce.loss_1d", rt.category)
	mask := rt.Empty(Bool, []int{rows}, "fused_linear_ce.target_mask")
	counted := 0
	if rt.dev.Computes() {
		for _, t := range target.host() {
			if t != ignoreIndex {
				counted++
			}
		}
	}
	mask.Release()
	for start := 0; start < rows; start += chunk {
		n := min(chunk, rows-start)
		logits := rt.Empty(x.dtype, []int{n, vocab}, "fused_linear_ce.logits_chunk")
		gradChunk := rt.Empty(x.dtype, []int{n, hidden}, "fused_linear_ce.grad_input_chunk")
		if rt.dev.Computes() {
			fusedCEChunkMath(x.host()[start*hidden:(start+n)*hidden], w.host(), target.host()[start:start+n], counted,
				logits.data(), loss1d.data()[start:start+n], gradChunk.data(), hidden, vocab)
			gradChunk.round()
			copy(gradInput.data()[start*hidden:], gradChunk.data())
			if gradWeight != nil { // torch.addmm(grad_weight, logits_chunk.t(), input_chunk, out=grad_weight)
				gw, xs := gradWeight.data(), x.host()[start*hidden:]
				for r := range n {
					for v := range vocab {
						g := logits.data()[r*vocab+v]
						for k := range hidden {
							gw[v*hidden+k] += g * xs[r*hidden+k]
						}
					}
				}
				gradWeight.round()
			}
		}
		logits.Release()
		gradChunk.Release()
	}
	out := rt.Empty(F32, nil, "fused_linear_ce.loss")
	if rt.dev.Computes() {
		var sum float64
		for _, l := range loss1d.data() {
			sum += float64(l)
		}
		out.data()[0] = float32(sum)
	}
	loss1d.Release()
	if rt.needsGrad(x, w) {
		node := rt.node("LigerFusedLinearCrossEntropyFunctionBackward", []*Tensor{x, w}, []*Tensor{out}, nil)
		saved := []*Tensor{node.save("grad_input", gradInput), nil}
		if gradWeight != nil {
			saved[1] = node.save("grad_weight", gradWeight)
		}
		node.apply = func(n *Node, g []*Tensor, needs []bool) []*Tensor {
			grads := make([]*Tensor, 2)
			for i, s := range saved {
				if s == nil || !needs[i] {
					continue
				}
				if n.rt.dev.Computes() { // element_mul_kernel: grad *= grad_output, in place
					if f := g[0].host()[0]; f != 1 {
						d := s.data()
						for j := range d {
							d[j] *= f
						}
						s.round()
					}
				}
				grads[i] = s.Ref()
			}
			return grads
		}
	}
	if gradWeight != nil {
		gradWeight.Release()
	}
	gradInput.Release()
	return out
}

// ignoreIndex is cross_entropy's default ignore_index.
const ignoreIndex = -100

// fusedCEChunk is Liger's chunk size: inc_factor = cdiv(V, H); next_power_of_2(cdiv(BT, inc_factor)).
func fusedCEChunk(rows, hidden, vocab int) int {
	inc := ceilDiv(vocab, hidden)
	n := ceilDiv(rows, inc)
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len(uint(n-1))
}

// fusedCEChunkMath computes a chunk's logits, each row's loss (mean reduction: divided by the rows counted)
// and the gradient of the input rows: (softmax - onehot) / counted @ w.
func fusedCEChunkMath(x, w, target []float32, counted int, logits, loss, grad []float32, hidden, vocab int) {
	n := len(target)
	for r := range n {
		for v := range vocab {
			var s float32
			for k := range hidden {
				s += x[r*hidden+k] * w[v*hidden+k]
			}
			logits[r*vocab+v] = s
		}
	}
	for i := range grad {
		grad[i] = 0
	}
	for r := range n {
		t := int(target[r])
		row := logits[r*vocab : (r+1)*vocab]
		if t == ignoreIndex || counted == 0 {
			for v := range row {
				row[v] = 0
			}
			continue
		}
		m := float64(row[0])
		for _, v := range row {
			m = math.Max(m, float64(v))
		}
		var z float64
		for _, v := range row {
			z += math.Exp(float64(v) - m)
		}
		lse := m + math.Log(z)
		loss[r] = float32((lse - float64(row[t])) / float64(counted))
		for v := range row {
			p := math.Exp(float64(row[v]) - lse)
			if v == t {
				p--
			}
			row[v] = float32(p / float64(counted))
		}
		for v := range vocab {
			for k := range hidden {
				grad[r*hidden+k] += row[v] * w[v*hidden+k]
			}
		}
	}
}
