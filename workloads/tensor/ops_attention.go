package tensor

import (
	"math"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Narrow returns the view of dimension dim from start, length long (x[..., start:start+length, ...]).
func (t *Tensor) Narrow(dim, start, length int) *Tensor {
	t.check()
	dim = t.axis(dim)
	if start < 0 || length < 0 || start+length > t.shape[dim] {
		errShape("Narrow", "[%d:%d] out of range for dimension %d of %v", start, start+length, dim, t.shape)
	}
	shape := slices.Clone(t.shape)
	shape[dim] = length
	full := slices.Clone(t.shape)
	return t.viewOf(shape, slices.Clone(t.strides), t.offset+start*t.strides[dim], "SliceBackward0", func(g *Tensor) *Tensor {
		out := g.rt.Zeros(g.dtype, full, "slice.grad", g.rt.category)
		if g.rt.dev.Computes() {
			strides := contiguousStrides(full)
			scatter(&object{st: out.st, shape: g.shape, strides: strides, offset: start * strides[dim]}, g.host())
		}
		return out
	})
}

// EqualScalar returns the bool tensor x == v (a new allocation; no gradient).
func EqualScalar(x *Tensor, v float32) *Tensor {
	return scalarMask(x, "eq.out", func(a float32) bool { return a == v })
}

// MaskedFill returns x with v where mask is true; mask broadcasts over x's leading dimensions (its shape a
// suffix of x's, leading ones allowed). It saves the mask.
func MaskedFill(x, mask *Tensor, v float32) *Tensor {
	x.check()
	mask.check()
	rt := x.rt
	out := rt.Empty(x.dtype, x.shape, "masked_fill.out")
	inner := mask.Numel() // the mask repeats over x's leading dimensions
	if rt.dev.Computes() {
		d, s, m := out.data(), x.host(), mask.host()
		for i := range d {
			if m[i%inner] != 0 {
				d[i] = v
			} else {
				d[i] = s[i]
			}
		}
	}
	if rt.needsGrad(x) {
		node := rt.node("MaskedFillBackward0", []*Tensor{x}, []*Tensor{out}, nil)
		sm := node.save("mask", mask)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dx := n.rt.Empty(g[0].dtype, g[0].shape, "masked_fill.grad")
			if n.rt.dev.Computes() {
				d, gv, m := dx.data(), g[0].host(), sm.host()
				for i := range d {
					if m[i%inner] != 0 {
						d[i] = 0
					} else {
						d[i] = gv[i]
					}
				}
			}
			return []*Tensor{dx}
		}
	}
	return out
}

// Arange allocates the int64 tensor [0, 1, ..., n-1] (torch.arange).
func (rt *Runtime) Arange(n int, role string) *Tensor {
	out := rt.empty(I64, []int{n}, role, snapshot.CategoryInput)
	if rt.dev.Computes() {
		for i := range out.data() {
			out.data()[i] = float32(i)
		}
	}
	return out
}

// Tril allocates the lower-triangular n x n matrix of ones (torch.tril(torch.ones(n, n))) with the given
// category: nanoGPT's causal-mask buffer.
func (rt *Runtime) Tril(n int, role string, category snapshot.Category) *Tensor {
	out := rt.empty(F32, []int{n, n}, role, category)
	if rt.dev.Computes() {
		d := out.data()
		for i := range n {
			for j := 0; j <= i; j++ {
				d[i*n+j] = 1
			}
		}
	}
	return out
}

// ScaledDotProductAttention is memory-efficient (flash) causal attention over q, k, v of shape
// (batch, heads, seq, head_dim), as F.scaled_dot_product_attention's flash and memory-efficient kernels run
// it: the seq x seq scores are never materialised. It allocates the output as (batch, seq, heads, head_dim)
// and returns it viewed as (batch, heads, seq, head_dim), plus a float32 log-sum-exp per row, and saves q, k,
// v, the output and the log-sum-exp. Dropout, when p > 0 and training, is drawn inside the kernel from a seed
// (no mask in device memory).
func ScaledDotProductAttention(q, k, v *Tensor, causal bool, p float32, training bool) *Tensor {
	return sdpa("ScaledDotProductEfficientAttentionBackward0", q, k, v, AttentionOptions{Causal: causal, Dropout: p, Training: training})
}

// FlashAttention is F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) on the flash
// kernel, which HF transformers' sdpa attention calls for a Llama without a mask on PyTorch 2.5 and later
// (integrations/sdpa_attention.py, use_gqa_in_sdpa): k and v keep their key-value heads (batch, kv_heads, seq,
// head_dim), each shared by heads/kv_heads query heads, instead of being repeated. It saves what
// ScaledDotProductAttention saves; with fewer key-value heads its backward computes dk and dv per query head
// into (batch, seq, heads, head_dim) workspaces and sums them (flash-attention's mha_bwd).
func FlashAttention(q, k, v *Tensor, causal bool, p float32, training bool) *Tensor {
	return sdpa("ScaledDotProductFlashAttentionBackward0", q, k, v, AttentionOptions{Causal: causal, Dropout: p, Training: training})
}

// AttentionOptions are what a fused attention kernel is told besides its inputs.
type AttentionOptions struct {
	Causal   bool
	Dropout  float32
	Training bool
	// Scale multiplies the scores (0: 1/sqrt(head_dim)); Softcap, when positive, caps them as Gemma 2 does,
	// softcap * tanh(score / softcap); Window, when positive, lets each query see only the Window keys up to
	// its own position (a sliding window).
	Scale, Softcap float32
	Window         int
	// KeyLens, when set, is how many keys of each batch row are tokens (the rest padding, masked).
	KeyLens []int
	// Bias is an additive mask the kernel reads, sdpa's attn_mask: the memory-efficient kernel saves it for
	// backward. KeyLens says what it masks; its values are not read.
	Bias *Tensor
}

// FlashAttentionWith is FlashAttention told more than causality: flash-attention's softmax_scale, softcap
// and window_size, as HF transformers' flash_attention_2 path passes Gemma's (key-value heads not repeated).
func FlashAttentionWith(q, k, v *Tensor, o AttentionOptions) *Tensor {
	return sdpa("ScaledDotProductFlashAttentionBackward0", q, k, v, o)
}

// EfficientAttentionWith is ScaledDotProductAttention with an attention mask (o.Bias), which sends sdpa to
// the memory-efficient kernel: it saves the mask as well as q, k, v, the output and the log-sum-exp.
func EfficientAttentionWith(q, k, v *Tensor, o AttentionOptions) *Tensor {
	return sdpa("ScaledDotProductEfficientAttentionBackward0", q, k, v, o)
}

func sdpa(name string, q, k, v *Tensor, o AttentionOptions) *Tensor {
	q.check()
	k.check()
	v.check()
	rt := q.rt
	if in, ok := acSDPA.cast(rt, q, k, v); ok {
		defer releaseAll(in)
		defer rt.withoutAutocast()()
		return sdpa(name, in[0], in[1], in[2], o)
	}
	causal, p, training := o.Causal, o.Dropout, o.Training
	b, h, s, d := q.Dim(0), q.Dim(1), q.Dim(2), q.Dim(3)
	kvh := k.Dim(1)
	if kvh == 0 || h%kvh != 0 || v.Dim(1) != kvh {
		errShape("ScaledDotProductAttention", "%d query heads and %d key-value heads", h, kvh)
	}
	if !training {
		p = 0
	}
	dtype := resultType(q, k)
	op := opEfficientAttn
	if name == flashAttnBackward {
		op = opFlashAttention
	}
	var keep []float32 // the dropout draws: host scratch standing in for the kernel's seeded generator
	shape := attnShape{b: b, h: h, kvh: kvh, s: s, d: d, scale: float64(o.Scale), softcap: float64(o.Softcap),
		window: o.Window, keyLens: o.KeyLens}
	if shape.scale == 0 {
		shape.scale = 1 / math.Sqrt(float64(d))
	}
	// Under a selective checkpoint's recompute the kernel's outputs are the ones its forward kept; its
	// dropout draws are drawn again, as the kernel draws from the same seed and offset.
	out := rt.region.take(op, []int{b, h, s, d})
	var lse *Tensor
	if out != nil {
		lse = rt.region.take(op, []int{b, h, s})
		if rt.dev.Computes() {
			keep = dropoutDraws(rt, p, b*h*s*s)
		}
	} else {
		outBTHD := rt.Empty(dtype, []int{b, s, h, d}, "sdpa.out")
		out = outBTHD.Transpose(1, 2)
		outBTHD.Release()
		lse = rt.Empty(F32, []int{b, h, s}, "sdpa.logsumexp")
		if rt.dev.Computes() {
			keep = dropoutDraws(rt, p, b*h*s*s)
			vals := attentionForward(q.host(), k.host(), v.host(), lse.data(), shape, causal, p, keep)
			scatter(out.object, vals)
			out.round()
		}
		rt.region.keep(op, out)
		rt.region.keep(op, lse)
	}
	if rt.needsGrad(q, k, v) {
		node := rt.node(name, []*Tensor{q, k, v}, []*Tensor{out}, nil)
		sq, sk, sv := node.save("query", q), node.save("key", k), node.save("value", v)
		if o.Bias != nil {
			node.save("attn_bias", o.Bias)
		}
		so, sl := node.save("output", out), node.save("log_sumexp", lse)
		node.apply = func(n *Node, g []*Tensor, needs []bool) []*Tensor {
			rt := n.rt
			// The backward kernel's workspace: float32 dq accumulator and per-row softmax sums.
			accum := rt.Empty(F32, []int{b, s, h, d}, "sdpa.grad_q_accum")
			delta := rt.Empty(F32, []int{b, h, s}, "sdpa.softmax_d")
			dq := rt.Empty(sq.dtype, []int{b, h, s, d}, "sdpa.grad_q")
			var dkExp, dvExp *Tensor
			if kvh != h { // dk, dv per query head, summed over each group at the end
				dkExp = rt.Empty(sk.dtype, []int{b, s, h, d}, "sdpa.grad_k_expanded")
				dvExp = rt.Empty(sv.dtype, []int{b, s, h, d}, "sdpa.grad_v_expanded")
			}
			dk := rt.Empty(sk.dtype, []int{b, kvh, s, d}, "sdpa.grad_k")
			dv := rt.Empty(sv.dtype, []int{b, kvh, s, d}, "sdpa.grad_v")
			if rt.dev.Computes() {
				attentionBackward(dq.data(), dk.data(), dv.data(), g[0].host(), sq.host(), sk.host(), sv.host(), so.host(), sl.host(), shape, causal, p, keep)
				dq.round()
				dk.round()
				dv.round()
			}
			dkExp.Release()
			dvExp.Release()
			accum.Release()
			delta.Release()
			grads := []*Tensor{dq, dk, dv}
			for i, need := range needs {
				if !need {
					grads[i].Release()
					grads[i] = nil
				}
			}
			return grads
		}
	}
	lse.Release()
	return out
}

// attnShape is the shape of an attention: batch, query heads, key-value heads, sequence and head size, and
// what shapes its scores: their scale, Gemma's soft-cap, a sliding window and the tokens of each row.
type attnShape struct {
	b, h, kvh, s, d int
	scale, softcap  float64
	window          int
	keyLens         []int
}

// keys returns the keys query i of batch row batch sees, [lo, hi).
func (a attnShape) keys(batch, i int, causal bool) (lo, hi int) {
	hi = a.s
	if causal {
		hi = i + 1
	}
	if a.keyLens != nil {
		hi = min(hi, a.keyLens[batch])
	}
	if a.window > 0 {
		lo = max(0, i-a.window+1)
	}
	return lo, hi
}

// score turns a dot product into the score the softmax sees, and says its derivative.
func (a attnShape) score(dot float64) (s, ds float64) {
	s = dot * a.scale
	if a.softcap == 0 {
		return s, a.scale
	}
	t := math.Tanh(s / a.softcap)
	return a.softcap * t, a.scale * (1 - t*t)
}

// kvBase returns the offset of the key-value head that query head bh (batch * heads + head) reads.
func (a attnShape) kvBase(bh int) int {
	batch, head := bh/a.h, bh%a.h
	return (batch*a.kvh + head/(a.h/a.kvh)) * a.s * a.d
}

// dropoutDraws returns n keep-scales (0 or 1/(1-p)) for attention dropout, or nil when p is 0.
func dropoutDraws(rt *Runtime, p float32, n int) []float32 {
	if p == 0 {
		return nil
	}
	keep := make([]float32, n)
	for i := range keep {
		if rt.rng.Float32() >= p {
			keep[i] = 1 / (1 - p)
		}
	}
	return keep
}

// attentionForward computes softmax(scores of q k^T [causal, windowed, padded]) (dropped out) @ v, row by
// row, writing each row's log-sum-exp. It returns the output in (b, h, s, d) order.
func attentionForward(q, k, v, lse []float32, a attnShape, causal bool, p float32, keep []float32) []float32 {
	b, h, s, d := a.b, a.h, a.s, a.d
	out := make([]float32, b*h*s*d)
	row := make([]float64, s)
	for bh := range b * h {
		base, kv := bh*s*d, a.kvBase(bh)
		for i := range s {
			lo, hi := a.keys(bh/h, i, causal)
			m := math.Inf(-1)
			for j := lo; j < hi; j++ {
				var dot float64
				for c := range d {
					dot += float64(q[base+i*d+c]) * float64(k[kv+j*d+c])
				}
				row[j], _ = a.score(dot)
				m = max(m, row[j])
			}
			var sum float64
			for j := lo; j < hi; j++ {
				row[j] = math.Exp(row[j] - m)
				sum += row[j]
			}
			lse[bh*s+i] = float32(m + math.Log(sum))
			for j := lo; j < hi; j++ {
				w := row[j] / sum
				if keep != nil {
					w *= float64(keep[(bh*s+i)*s+j])
				}
				for c := range d {
					out[base+i*d+c] += float32(w * float64(v[kv+j*d+c]))
				}
			}
		}
	}
	return out
}

// attentionBackward computes the gradients of attentionForward from the saved log-sum-exp, recomputing the
// probabilities row by row as the flash kernels do. dq, dk, dv are in (b, h, s, d) order.
func attentionBackward(dq, dk, dv, dout, q, k, v, out, lse []float32, a attnShape, causal bool, p float32, keep []float32) {
	b, h, s, d := a.b, a.h, a.s, a.d
	clear(dq)
	clear(dk)
	clear(dv)
	prob := make([]float64, s)
	dscore := make([]float64, s)
	dp := make([]float64, s)
	for bh := range b * h {
		base, kv := bh*s*d, a.kvBase(bh)
		for i := range s {
			lo, hi := a.keys(bh/h, i, causal)
			for j := lo; j < hi; j++ {
				var dot float64
				for c := range d {
					dot += float64(q[base+i*d+c]) * float64(k[kv+j*d+c])
				}
				sc, ds := a.score(dot)
				prob[j], dscore[j] = math.Exp(sc-float64(lse[bh*s+i])), ds
			}
			// dP = dout . v (through dropout); dS = P * (dP - sum(dP * P_dropped))
			var rowDot float64
			for j := lo; j < hi; j++ {
				var g float64
				for c := range d {
					g += float64(dout[base+i*d+c]) * float64(v[kv+j*d+c])
				}
				kj := 1.0
				if keep != nil {
					kj = float64(keep[(bh*s+i)*s+j])
				}
				dp[j] = g * kj
				rowDot += dp[j] * prob[j]
				for c := range d {
					dv[kv+j*d+c] += float32(prob[j] * kj * float64(dout[base+i*d+c]))
				}
			}
			for j := lo; j < hi; j++ {
				ds := prob[j] * (dp[j] - rowDot) * dscore[j]
				for c := range d {
					dq[base+i*d+c] += float32(ds * float64(k[kv+j*d+c]))
					dk[kv+j*d+c] += float32(ds * float64(q[base+i*d+c]))
				}
			}
		}
	}
}
