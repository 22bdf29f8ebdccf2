package tensor

import (
	"math"
	"slices"
)

// The pointwise ops a Llama-family decoder is written in (HF transformers' modeling_llama.py composes RMSNorm,
// rotary embeddings and SwiGLU from them), each saving what its derivatives.yaml formula needs.

// unary allocates f applied to every element of x, in x's dtype (contiguous output).
func (rt *Runtime) unary(x *Tensor, role string, f func(v float32) float32) *Tensor {
	out := rt.Empty(x.dtype, x.shape, role)
	if rt.dev.Computes() {
		d, s := out.data(), x.host()
		for i := range d {
			d[i] = f(s[i])
		}
		out.round()
	}
	return out
}

// Pow returns x ** exponent for a scalar exponent. CUDA autocast runs pow in float32. It saves its input
// (PowBackward0: self; the exponent is a scalar).
func Pow(x *Tensor, exponent float32) *Tensor {
	x.check()
	rt := x.rt
	if in, ok := acPow.cast(rt, x); ok {
		defer releaseAll(in)
		defer rt.withoutAutocast()()
		return Pow(in[0], exponent)
	}
	e := float64(exponent)
	out := rt.unary(x, "pow.out", func(v float32) float32 { return float32(math.Pow(float64(v), e)) })
	if rt.needsGrad(x) {
		node := rt.node("PowBackward0", []*Tensor{x}, []*Tensor{out}, nil)
		self := node.save("self", x)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			// pow_backward: grad * (exponent * self.pow(exponent - 1)): two temporaries, then the gradient.
			p := n.rt.unary(self, "pow.grad", func(v float32) float32 { return float32(math.Pow(float64(v), e-1)) })
			defer p.Release()
			s := Scale(p, exponent)
			defer s.Release()
			return []*Tensor{n.rt.productTo(g[0], s, self.shape, "pow.grad")}
		}
	}
	return out
}

// Rsqrt returns 1/sqrt(x). CUDA autocast runs rsqrt in float32. It saves its result.
func Rsqrt(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	if in, ok := acRsqrt.cast(rt, x); ok {
		defer releaseAll(in)
		defer rt.withoutAutocast()()
		return Rsqrt(in[0])
	}
	out := rt.unary(x, "rsqrt.out", func(v float32) float32 { return float32(1 / math.Sqrt(float64(v))) })
	if rt.needsGrad(x) {
		node := rt.node("RsqrtBackward0", []*Tensor{x}, []*Tensor{out}, nil)
		result := node.save("result", out)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			// -0.5 * grad * result.pow(3): the cube, then the product.
			c := n.rt.unary(result, "rsqrt.grad", func(v float32) float32 { return -0.5 * v * v * v })
			defer c.Release()
			return []*Tensor{n.rt.productTo(g[0], c, g[0].shape, "rsqrt.grad")}
		}
	}
	return out
}

// Neg returns -x. It saves nothing.
func Neg(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	out := rt.unary(x, "neg.out", func(v float32) float32 { return -v })
	if rt.needsGrad(x) {
		rt.node("NegBackward0", []*Tensor{x}, []*Tensor{out}, func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			return []*Tensor{Neg(g[0])}
		})
	}
	return out
}

// AddScalar returns x + s for a Python number s (a wrapped scalar: the output keeps x's dtype). It saves
// nothing; the gradient passes through.
func AddScalar(x *Tensor, s float32) *Tensor {
	x.check()
	rt := x.rt
	out := rt.unary(x, "add.out", func(v float32) float32 { return v + s })
	if rt.needsGrad(x) {
		rt.node("AddBackward0", []*Tensor{x}, []*Tensor{out}, passGrad)
	}
	return out
}

// SiLU returns x * sigmoid(x) (nn.SiLU, Llama's hidden_act "silu"). It saves its input.
func SiLU(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	out := rt.unary(x, "silu.out", func(v float32) float32 { return v / (1 + float32(math.Exp(-float64(v)))) })
	if rt.needsGrad(x) {
		node := rt.node("SiluBackward0", []*Tensor{x}, []*Tensor{out}, nil)
		self := node.save("self", x)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dx := n.rt.Empty(g[0].dtype, g[0].shape, "silu.grad")
			if n.rt.dev.Computes() {
				d, gv, xv := dx.data(), g[0].host(), self.host()
				for i := range d {
					s := 1 / (1 + math.Exp(-float64(xv[i])))
					d[i] = gv[i] * float32(s*(1+float64(xv[i])*(1-s)))
				}
				dx.round()
			}
			return []*Tensor{dx}
		}
	}
	return out
}

// Cos returns cos(x). It saves its input.
func Cos(x *Tensor) *Tensor {
	return trig(x, "cos.out", "CosBackward0", math.Cos, func(v float64) float64 { return -math.Sin(v) })
}

// Sin returns sin(x). It saves its input.
func Sin(x *Tensor) *Tensor {
	return trig(x, "sin.out", "SinBackward0", math.Sin, math.Cos)
}

func trig(x *Tensor, role, name string, f, df func(float64) float64) *Tensor {
	x.check()
	rt := x.rt
	out := rt.unary(x, role, func(v float32) float32 { return float32(f(float64(v))) })
	if rt.needsGrad(x) {
		node := rt.node(name, []*Tensor{x}, []*Tensor{out}, nil)
		self := node.save("self", x)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			d := n.rt.unary(self, role+".grad", func(v float32) float32 { return float32(df(float64(v))) })
			defer d.Release()
			return []*Tensor{n.rt.productTo(g[0], d, g[0].shape, role+".grad")}
		}
	}
	return out
}

// MeanLast returns the mean over the last dimension, keeping it as a dimension of 1 (x.mean(-1,
// keepdim=True)). It saves nothing (MeanBackward1 keeps the sizes) from torch 2.0; torch 1.13's keeps x
// (versions.MeanSavesSizes). Its backward allocates the gradient expanded to x's shape and divided by the
// count.
func MeanLast(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	cols := x.Dim(-1)
	shape := slices.Clone(x.shape)
	shape[len(shape)-1] = 1
	out := rt.Empty(x.dtype, shape, "mean.out")
	if rt.dev.Computes() {
		d, s := out.data(), x.host()
		for r := range d {
			var sum float64
			for _, v := range s[r*cols : (r+1)*cols] {
				sum += float64(v)
			}
			d[r] = float32(sum / float64(cols))
		}
		out.round()
	}
	if rt.needsGrad(x) {
		in := slices.Clone(x.shape)
		n := rt.node("MeanBackward1", []*Tensor{x}, []*Tensor{out}, func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dx := n.rt.Empty(g[0].dtype, in, "mean.grad")
			if n.rt.dev.Computes() {
				d, gv := dx.data(), g[0].host()
				for i := range d {
					d[i] = gv[i/cols] / float32(cols)
				}
				dx.round()
			}
			return []*Tensor{dx}
		})
		if rt.versions.MeanKeepsInput() { // torch before 2.0: MeanBackward1 saves self
			n.save("self", x)
		}
	}
	return out
}

// Cat concatenates tensors along dim into a new tensor (torch.cat). CUDA autocast lists cat as promote:
// inputs of different floating dtypes are converted to the widest first. It saves nothing; its backward
// hands each input a view of the gradient.
func Cat(ts []*Tensor, dim int) *Tensor {
	first := ts[0]
	rt := first.rt
	dim = first.axis(dim)
	dtype := first.dtype
	for _, t := range ts {
		t.check()
		switch {
		case t.dtype == F64, t.dtype == F32 && dtype != F64:
			dtype = t.dtype
		}
	}
	in := ts
	if rt.autocast != F32 { // promote: convert to the widest type
		in = make([]*Tensor, len(ts))
		for i, t := range ts {
			in[i] = ToDType(t, dtype)
		}
		defer releaseAll(in)
	}
	shape := slices.Clone(first.shape)
	shape[dim] = 0
	for _, t := range in {
		if len(t.shape) != len(shape) {
			errShape("Cat", "tensors of %d and %d dimensions", len(t.shape), len(shape))
		}
		shape[dim] += t.shape[dim]
	}
	out := rt.Empty(dtype, shape, "cat.out")
	if rt.dev.Computes() {
		strides := contiguousStrides(shape)
		start := 0
		for _, t := range in {
			scatter(&object{st: out.st, shape: t.shape, strides: strides, offset: start * strides[dim]}, t.host())
			start += t.shape[dim]
		}
		out.round()
	}
	if rt.needsGrad(in...) {
		sizes := make([]int, len(in))
		for i, t := range in {
			sizes[i] = t.shape[dim]
		}
		rt.node("CatBackward0", in, []*Tensor{out}, func(n *Node, g []*Tensor, needs []bool) []*Tensor {
			grads := make([]*Tensor, len(sizes))
			start := 0
			for i, s := range sizes {
				if needs[i] {
					grads[i] = g[0].Narrow(dim, start, s)
				}
				start += s
			}
			return grads
		})
	}
	return out
}

// Triu returns a copy of the 2-D x with the elements below diagonal d zeroed (torch.triu), outside
// autograd.
func Triu(x *Tensor, d int) *Tensor {
	x.check()
	rt := x.rt
	rows, cols := x.Dim(0), x.Dim(1)
	out := rt.Empty(x.dtype, x.shape, "triu.out")
	if rt.dev.Computes() {
		dst, s := out.data(), x.host()
		for i := range rows {
			for j := range cols {
				if j-i >= d {
					dst[i*cols+j] = s[i*cols+j]
				} else {
					dst[i*cols+j] = 0
				}
			}
		}
	}
	return out
}

// Greater returns the bool tensor a > b, broadcast (no gradient).
func Greater(a, b *Tensor) *Tensor {
	a.check()
	b.check()
	shape := mustBroadcast("Greater", a, b)
	out := a.rt.Empty(Bool, shape, "gt.out")
	if a.rt.dev.Computes() {
		d, av, bv := out.data(), a.hostAs(shape), b.hostAs(shape)
		for i := range d {
			d[i] = 0
			if av[i] > bv[i] {
				d[i] = 1
			}
		}
	}
	return out
}

// Mul_ sets dst *= src in place, src broadcast to dst's shape (tensor.mul_), outside autograd.
func Mul_(dst, src *Tensor) {
	broadcastable("mul_", dst, src)
	var s []float32
	if src.rt.dev.Computes() {
		s = src.hostAs(dst.shape)
	}
	inplace(dst, func(i int, d []float32) { d[i] *= s[i] })
}

// PadLast returns x with n elements of value v appended along its last dimension, outside autograd
// (F.pad(x, (0, n), value=v)); HF's causal-LM loss pads the labels with -100 this way.
func PadLast(x *Tensor, n int, v float32) *Tensor {
	x.check()
	rt := x.rt
	cols := x.Dim(-1)
	shape := slices.Clone(x.shape)
	shape[len(shape)-1] += n
	out := rt.empty(x.dtype, shape, "pad.out", rt.category)
	if rt.dev.Computes() {
		d, s := out.data(), x.host()
		rows := len(s) / max(cols, 1)
		for r := range rows {
			copy(d[r*(cols+n):], s[r*cols:(r+1)*cols])
			for j := range n {
				d[r*(cols+n)+cols+j] = v
			}
		}
	}
	return out
}

// AutocastDisabled runs f with autocast off (torch.autocast(enabled=False)), as HF's rotary embedding
// computes its frequencies.
func (rt *Runtime) AutocastDisabled(f func()) {
	defer rt.withoutAutocast()()
	f()
}

// FullLike is torch.full(shape, v, dtype) for a tensor made inside the forward (its category is the
// runtime's current one).
func (rt *Runtime) FullLike(dtype DType, shape []int, v float32, role string) *Tensor {
	return rt.Full(dtype, shape, v, role, rt.category)
}
