package tensor

import (
	"slices"

	"github.com/oomdbg/oomdbg/workloads/device"
)

// Linear is F.linear: x @ w.T + b, with x of shape (..., in), w (out, in) and b (out) or nil. It follows
// ATen's decomposition, which decides what is saved and what is copied: a 2-D input with a bias is one addmm;
// a contiguous 3-D input is flattened to 2-D by a view, put through addmm and viewed back; anything else is a
// matmul followed by an in-place bias add. addmm saves its input (a view of x) and the weight.
func Linear(x, w, b *Tensor) *Tensor {
	x.check()
	w.check()
	if x.Dim(-1) != w.Dim(1) {
		errShape("Linear", "input %v and weight %v do not match", x.shape, w.shape)
	}
	if in, ok := acLinear.cast(x.rt, x, w, b); ok { // the weight's and bias's casts come from the cache
		defer releaseAll(in)
		defer x.rt.withoutAutocast()()
		return Linear(in[0], in[1], in[2])
	}
	wt := w.T()
	defer wt.Release()
	switch {
	case b != nil && x.NDim() == 2:
		return addmm(b, x, wt)
	case b != nil && x.NDim() == 3 && x.IsContiguous():
		x2 := x.View(-1, x.Dim(-1))
		defer x2.Release()
		y2 := addmm(b, x2, wt)
		defer y2.Release()
		return y2.View(x.Dim(0), x.Dim(1), w.Dim(0))
	}
	y := Matmul(x, wt)
	if b != nil {
		y2 := addInPlaceOp(y, b)
		y.Release()
		y = y2
	}
	return y
}

// addmm is bias + mat1 @ mat2 for 2-D mat1 (n, k), mat2 (k, m) and a bias broadcast over rows.
func addmm(bias, mat1, mat2 *Tensor) *Tensor {
	rt := mat1.rt
	n, k, m := mat1.Dim(0), mat1.Dim(1), mat2.Dim(1)
	dtype := resultType(mat1, mat2)
	out := rt.region.take(opAddmm, []int{n, m})
	if out == nil {
		out = rt.Empty(dtype, []int{n, m}, "linear.out")
		if rt.dev.Computes() {
			o, bv := out.data(), bias.host()
			for r := range n { // the bias in every row, then the product accumulated onto it
				copy(o[r*m:(r+1)*m], bv)
			}
			device.Gemm(false, false, n, m, k, 1, mat1.host(), k, mat2.host(), m, 1, o, m)
			out.round()
		}
		rt.region.keep(opAddmm, out)
	}
	if rt.needsGrad(bias, mat1, mat2) {
		node := rt.node("AddmmBackward0", []*Tensor{bias, mat1, mat2}, []*Tensor{out}, nil)
		var s1, s2 *Tensor
		if mat2.requiresGrad {
			s1 = node.save("mat1", mat1)
		}
		if mat1.requiresGrad {
			s2 = node.save("mat2", mat2)
		}
		biasShape := slices.Clone(bias.shape)
		node.apply = func(n *Node, g []*Tensor, needs []bool) []*Tensor {
			grads := make([]*Tensor, 3)
			if needs[1] {
				grads[1] = mmGrad(g[0], s2, false, true, "mat1.grad") // g @ mat2.T
			}
			if needs[2] {
				grads[2] = mmGrad(s1, g[0], true, false, "mat2.grad") // mat1.T @ g
			}
			if needs[0] {
				grads[0] = n.rt.sumTo(g[0], biasShape, "bias.grad")
			}
			return grads
		}
	}
	return out
}

// mmGrad allocates op(a) @ op(b) for a backward.
func mmGrad(a, b *Tensor, ta, tb bool, role string) *Tensor {
	rt := a.rt
	am, ak := a.Dim(0), a.Dim(1)
	if ta {
		am, ak = ak, am
	}
	bn := b.Dim(1)
	if tb {
		bn = b.Dim(0)
	}
	out := rt.Empty(resultType(a, b), []int{am, bn}, role)
	if rt.dev.Computes() {
		device.Gemm(ta, tb, am, bn, ak, 1, a.host(), a.Dim(1), b.host(), b.Dim(1), 0, out.data(), bn)
		out.round()
	}
	return out
}

// Matmul is torch.matmul for 2-D operands, an N-D operand times a 2-D one (folded into one mm), and batched
// operands with the same batch dimensions (reshaped to 3-D, which copies non-contiguous inputs exactly as
// ATen's reshape does, then bmm).
func Matmul(a, b *Tensor) *Tensor {
	a.check()
	b.check()
	if in, ok := acMatmul.cast(a.rt, a, b); ok {
		defer releaseAll(in)
		defer a.rt.withoutAutocast()()
		return Matmul(in[0], in[1])
	}
	switch {
	case a.NDim() == 2 && b.NDim() == 2:
		return mm(a, b)
	case a.NDim() >= 3 && b.NDim() == 2:
		// ATen folds the batch into rows with expect_contiguous().view(...): a copy only if not contiguous.
		ac := a.Contiguous()
		defer ac.Release()
		a2 := ac.View(-1, a.Dim(-1))
		defer a2.Release()
		y := mm(a2, b)
		defer y.Release()
		shape := append(slices.Clone(a.shape[:a.NDim()-1]), b.Dim(1))
		return y.Reshape(shape...)
	case a.NDim() >= 3 && a.NDim() == b.NDim() && slices.Equal(a.shape[:a.NDim()-2], b.shape[:b.NDim()-2]):
		batch := numel(a.shape[:a.NDim()-2])
		a3 := a.Reshape(batch, a.Dim(-2), a.Dim(-1))
		defer a3.Release()
		b3 := b.Reshape(batch, b.Dim(-2), b.Dim(-1))
		defer b3.Release()
		y := bmm(a3, b3)
		defer y.Release()
		shape := append(slices.Clone(a.shape[:a.NDim()-1]), b.Dim(-1))
		return y.View(shape...)
	}
	errShape("Matmul", "unsupported shapes %v and %v", a.shape, b.shape)
	return nil
}

// mm is the 2-D product; it saves each operand when the other needs a gradient.
func mm(a, b *Tensor) *Tensor {
	if a.Dim(1) != b.Dim(0) {
		errShape("mm", "shapes %v and %v cannot be multiplied", a.shape, b.shape)
	}
	rt := a.rt
	n, k, m := a.Dim(0), a.Dim(1), b.Dim(1)
	out := rt.region.take(opMM, []int{n, m})
	if out == nil {
		out = rt.Empty(resultType(a, b), []int{n, m}, "mm.out")
		if rt.dev.Computes() {
			device.Gemm(false, false, n, m, k, 1, a.host(), k, b.host(), m, 0, out.data(), m)
			out.round()
		}
		rt.region.keep(opMM, out)
	}
	if rt.needsGrad(a, b) {
		node := rt.node("MmBackward0", []*Tensor{a, b}, []*Tensor{out}, nil)
		sa, sb := node.saveCrossed(a, "self", b, "mat2")
		node.apply = func(n *Node, g []*Tensor, needs []bool) []*Tensor {
			grads := make([]*Tensor, 2)
			if needs[0] {
				grads[0] = mmGrad(g[0], sb, false, true, "self.grad")
			}
			if needs[1] {
				grads[1] = mmGrad(sa, g[0], true, false, "mat2.grad")
			}
			return grads
		}
	}
	return out
}

// bmm is the batched product of (batch, n, k) and (batch, k, m).
func bmm(a, b *Tensor) *Tensor {
	if a.Dim(0) != b.Dim(0) || a.Dim(2) != b.Dim(1) {
		errShape("bmm", "shapes %v and %v cannot be multiplied", a.shape, b.shape)
	}
	rt := a.rt
	shape := []int{a.Dim(0), a.Dim(1), b.Dim(2)}
	out := rt.region.take(opBmm, shape)
	if out == nil {
		out = rt.Empty(resultType(a, b), shape, "bmm.out")
		if rt.dev.Computes() {
			bmmKernel(out.data(), a.host(), b.host(), a.Dim(0), a.Dim(1), a.Dim(2), b.Dim(2), false, false)
			out.round()
		}
		rt.region.keep(opBmm, out)
	}
	if rt.needsGrad(a, b) {
		node := rt.node("BmmBackward0", []*Tensor{a, b}, []*Tensor{out}, nil)
		sa, sb := node.saveCrossed(a, "self", b, "mat2")
		node.apply = func(n *Node, g []*Tensor, needs []bool) []*Tensor {
			grads := make([]*Tensor, 2)
			batch := g[0].Dim(0)
			if needs[0] { // g (batch,n,m) @ b^T (batch,m,k)
				ga := n.rt.Empty(g[0].dtype, []int{batch, g[0].Dim(1), sb.Dim(1)}, "self.grad")
				if n.rt.dev.Computes() {
					bmmKernel(ga.data(), g[0].host(), sb.host(), batch, g[0].Dim(1), g[0].Dim(2), sb.Dim(1), false, true)
					ga.round()
				}
				grads[0] = ga
			}
			if needs[1] { // a^T (batch,k,n) @ g (batch,n,m)
				gb := n.rt.Empty(g[0].dtype, []int{batch, sa.Dim(2), g[0].Dim(2)}, "mat2.grad")
				if n.rt.dev.Computes() {
					bmmKernel(gb.data(), sa.host(), g[0].host(), batch, sa.Dim(2), sa.Dim(1), g[0].Dim(2), true, false)
					gb.round()
				}
				grads[1] = gb
			}
			return grads
		}
	}
	return out
}

// bmmKernel computes per batch op(a) (n x k) @ op(b) (k x m) into out, with a and b stored untransposed.
func bmmKernel(out, a, b []float32, batch, n, k, m int, ta, tb bool) {
	lda, ldb := k, m
	if ta {
		lda = n
	}
	if tb {
		ldb = k
	}
	for i := range batch {
		device.Gemm(ta, tb, n, m, k, 1, a[i*n*k:(i+1)*n*k], lda, b[i*k*m:(i+1)*k*m], ldb, 0, out[i*n*m:(i+1)*n*m], m)
	}
}

// resultType is the dtype of an op on a and b: the wider float type.
func resultType(a, b *Tensor) DType {
	if a.dtype == F32 || b.dtype == F32 {
		return F32
	}
	return a.dtype
}
