package tensor

import (
	"math"

	"github.com/oomdbg/oomdbg/snapshot"
)

// In-place updates for optimizers and gradient bookkeeping. They allocate nothing and record no graph
// (optimizers run under no_grad), and work on contiguous tensors, as parameters, gradients and optimizer
// state are.

// inplace applies f to dst's values elementwise, with the matching values of srcs.
func inplace(dst *Tensor, f func(i int, d []float32), srcs ...*Tensor) {
	dst.check()
	if !dst.rt.dev.Computes() {
		return
	}
	if !dst.IsContiguous() {
		errShape("inplace", "in-place update of a non-contiguous tensor %v", dst.shape)
	}
	d := dst.data()
	for i := range d {
		f(i, d)
	}
	dst.round()
}

// AddScaled_ sets dst += alpha * src (torch.add_(src, alpha=alpha)).
func AddScaled_(dst, src *Tensor, alpha float32) {
	var s []float32
	if src.rt.dev.Computes() {
		s = src.host()
	}
	inplace(dst, func(i int, d []float32) { d[i] += alpha * s[i] })
}

// Scale_ sets dst *= s.
func Scale_(dst *Tensor, s float32) { inplace(dst, func(i int, d []float32) { d[i] *= s }) }

// AddScalar_ sets dst += s.
func AddScalar_(dst *Tensor, s float32) { inplace(dst, func(i int, d []float32) { d[i] += s }) }

// Zero_ sets every element of dst to 0 (tensor.zero_()).
func Zero_(dst *Tensor) { inplace(dst, func(i int, d []float32) { d[i] = 0 }) }

// Lerp_ sets dst += w * (end - dst).
func Lerp_(dst, end *Tensor, w float32) {
	var e []float32
	if end.rt.dev.Computes() {
		e = end.host()
	}
	inplace(dst, func(i int, d []float32) { d[i] += w * (e[i] - d[i]) })
}

// Addcmul_ sets dst += v * a * b.
func Addcmul_(dst, a, b *Tensor, v float32) {
	var av, bv []float32
	if a.rt.dev.Computes() {
		av, bv = a.host(), b.host()
	}
	inplace(dst, func(i int, d []float32) { d[i] += v * av[i] * bv[i] })
}

// Addcdiv_ sets dst += v * a / b.
func Addcdiv_(dst, a, b *Tensor, v float32) {
	var av, bv []float32
	if a.rt.dev.Computes() {
		av, bv = a.host(), b.host()
	}
	inplace(dst, func(i int, d []float32) { d[i] += v * av[i] / bv[i] })
}

// Sqrt allocates the elementwise square root of x, outside autograd (torch._foreach_sqrt's output).
func Sqrt(x *Tensor, role string) *Tensor {
	out := x.rt.empty(x.dtype, x.shape, role, snapshot.CategoryTemporary)
	if x.rt.dev.Computes() {
		d, s := out.data(), x.host()
		for i := range d {
			d[i] = float32(math.Sqrt(float64(s[i])))
		}
		out.round()
	}
	return out
}

// ZerosLike allocates zeros shaped like x with the given category (torch.zeros_like).
func ZerosLike(x *Tensor, role string, category snapshot.Category) *Tensor {
	return x.rt.Zeros(x.dtype, x.shape, role, category)
}

// Clone allocates a copy of x outside autograd with the given category (torch.clone(x).detach()).
func Clone(x *Tensor, role string, category snapshot.Category) *Tensor {
	return x.rt.cloneAs(x, role, category)
}

// CloneGrad is tensor.clone(): a contiguous copy whose backward passes the gradient through
// (CloneBackward0).
func CloneGrad(x *Tensor) *Tensor {
	x.check()
	return x.rt.copyOp(x, "clone")
}

// AddNoGrad allocates a + alpha*b outside autograd (torch._foreach_add's output).
func AddNoGrad(a, b *Tensor, alpha float32, role string) *Tensor {
	out := a.rt.empty(a.dtype, a.shape, role, snapshot.CategoryTemporary)
	if a.rt.dev.Computes() {
		d, av, bv := out.data(), a.host(), b.host()
		for i := range d {
			d[i] = av[i] + alpha*bv[i]
		}
		out.round()
	}
	return out
}

// AddFused_ updates Adam's moments in place from a gradient, plus wd * p when p is given (the fused
// kernel's L2 term): exp = b1 exp + (1-b1) g; sq = b2 sq + (1-b2) g^2. It allocates nothing.
func AddFused_(exp, sq, g, p *Tensor, wd, b1, b2 float32) {
	if !exp.rt.dev.Computes() {
		return
	}
	gv := g.host()
	var pv []float32
	if p != nil {
		pv = p.host()
	}
	sv := sq.data()
	inplace(exp, func(i int, d []float32) {
		gi := gv[i]
		if pv != nil {
			gi += wd * pv[i]
		}
		d[i] = b1*d[i] + (1-b1)*gi
		sv[i] = b2*sv[i] + (1-b2)*gi*gi
	})
	sq.round()
}

// AdamUpdate_ sets p += step * exp / (sqrt(sq)/bc2sqrt + eps) in place, allocating nothing.
func AdamUpdate_(p, exp, sq *Tensor, step, bc2sqrt, eps float32) {
	var ev, sv []float32
	if p.rt.dev.Computes() {
		ev, sv = exp.host(), sq.host()
	}
	inplace(p, func(i int, d []float32) {
		d[i] += step * ev[i] / (float32(math.Sqrt(float64(sv[i])))/bc2sqrt + eps)
	})
}
