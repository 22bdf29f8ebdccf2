package tensor

import (
	"math"
	"slices"
)

// The pointwise ops the model families beside Llama add: Gemma's tanh soft-capping and GeGLU (gelu with the
// tanh approximation), Qwen2-MoE's sigmoid gate, BERT's pooler tanh and its extended attention mask
// (1 - mask), and the masks Gemma rebuilds for its sliding-window layers.

// Tanh returns tanh(x). It saves its result (TanhBackward0: result).
func Tanh(x *Tensor) *Tensor {
	return resultSaving(x, "tanh.out", "TanhBackward0", math.Tanh, func(y float64) float64 { return 1 - y*y })
}

// Sigmoid returns 1 / (1 + exp(-x)). It saves its result (SigmoidBackward0: result).
func Sigmoid(x *Tensor) *Tensor {
	return resultSaving(x, "sigmoid.out", "SigmoidBackward0", func(v float64) float64 { return 1 / (1 + math.Exp(-v)) },
		func(y float64) float64 { return y * (1 - y) })
}

// resultSaving is a unary op whose derivative is a function of its result, which it saves.
func resultSaving(x *Tensor, role, name string, f, dfOfResult func(float64) float64) *Tensor {
	x.check()
	rt := x.rt
	out := rt.unary(x, role, func(v float32) float32 { return float32(f(float64(v))) })
	if rt.needsGrad(x) {
		node := rt.node(name, []*Tensor{x}, []*Tensor{out}, nil)
		result := node.save("result", out)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			d := n.rt.unary(result, role+".grad", func(y float32) float32 { return float32(dfOfResult(float64(y))) })
			defer d.Release()
			return []*Tensor{n.rt.productTo(g[0], d, g[0].shape, role+".grad")}
		}
	}
	return out
}

// GELUTanh returns gelu(x, approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), Gemma's
// gelu_pytorch_tanh. It saves its input (GeluBackward0: self).
func GELUTanh(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	out := rt.unary(x, "gelu.out", func(v float32) float32 {
		xf := float64(v)
		return float32(0.5 * xf * (1 + math.Tanh(geluTanhC*(xf+0.044715*xf*xf*xf))))
	})
	if rt.needsGrad(x) {
		node := rt.node("GeluBackward0", []*Tensor{x}, []*Tensor{out}, nil)
		self := node.save("self", x)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			d := n.rt.unary(self, "gelu.grad", func(v float32) float32 {
				xf := float64(v)
				inner := geluTanhC * (xf + 0.044715*xf*xf*xf)
				t := math.Tanh(inner)
				return float32(0.5*(1+t) + 0.5*xf*(1-t*t)*geluTanhC*(1+3*0.044715*xf*xf))
			})
			defer d.Release()
			return []*Tensor{n.rt.productTo(g[0], d, g[0].shape, "gelu.grad")}
		}
	}
	return out
}

const geluTanhC = 0.7978845608028654 // sqrt(2/pi)

// Rsub returns s - x for a Python number s (torch.rsub, 1.0 - mask). It saves nothing.
func Rsub(x *Tensor, s float32) *Tensor {
	x.check()
	rt := x.rt
	out := rt.unary(x, "rsub.out", func(v float32) float32 { return s - v })
	if rt.needsGrad(x) {
		rt.node("RsubBackward1", []*Tensor{x}, []*Tensor{out}, func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			return []*Tensor{Neg(g[0])}
		})
	}
	return out
}

// SlidingWindowMask is what Gemma2DecoderLayer (and Gemma 3's) does to the 4-D additive mask of a
// sliding-window layer, outside autograd: torch.tril(torch.ones_like(mask, dtype=torch.bool),
// diagonal=-window) (a bool tensor of the mask's full shape, the expanded batch materialised), torch.where
// of it, the mask's minimum and the mask (a new tensor of the full shape in the mask's dtype), and the columns
// arange(min(max(seq, window), keys)) indexed out (a copy; in training, without a cache, every column). It
// returns the new mask, (batch, 1, seq, keys) with the far past masked, and the locals the layer's forward
// holds until it returns: the bool mask and the column indices.
func SlidingWindowMask(mask *Tensor, window, seq int) (out *Tensor, locals []*Tensor) {
	mask.check()
	rt := mask.rt
	shape := slices.Clone(mask.shape)
	rows, keys := shape[2], shape[3]
	ones := rt.Temporary(Bool, shape, "ones_like")
	tri := rt.Temporary(Bool, shape, "tril.out")
	ones.Release() // a temporary of the expression
	where := rt.Empty(mask.dtype, shape, "where.out")
	if rt.dev.Computes() {
		d, m := where.data(), mask.host()
		minimum := MinFinite(mask.dtype)
		for i := range d {
			r, c := (i/keys)%rows, i%keys
			if c <= r-window {
				d[i] = minimum
			} else {
				d[i] = m[i]
			}
		}
	}
	n := min(max(seq, window), keys)
	idx := rt.Arange(n, "mask_indexes")
	outShape := slices.Clone(shape)
	outShape[3] = n
	out = rt.Empty(mask.dtype, outShape, "index.out")
	if rt.dev.Computes() {
		d, s := out.data(), where.data()
		for i := range len(d) / n {
			copy(d[i*n:(i+1)*n], s[i*keys:i*keys+n])
		}
	}
	where.Release() // the name is rebound to the indexed copy
	return out, []*Tensor{tri, idx}
}

// MinFinite is torch.finfo(dtype).min, the additive masks' "minus infinity".
func MinFinite(dtype DType) float32 {
	switch dtype {
	case F16:
		return -65504
	case BF16:
		return -3.3895313892515355e38
	}
	return -math.MaxFloat32
}

// Or_ sets dst |= src for bool tensors, src broadcast to dst's shape (bitwise_or_), outside autograd.
func Or_(dst, src *Tensor) {
	broadcastable("bitwise_or_", dst, src)
	var s []float32
	if src.rt.dev.Computes() {
		s = src.hostAs(dst.shape)
	}
	inplace(dst, func(i int, d []float32) {
		if s[i] != 0 {
			d[i] = 1
		}
	})
}
