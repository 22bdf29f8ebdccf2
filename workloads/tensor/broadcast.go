package tensor

import (
	"slices"

	"github.com/oomdbg/oomdbg/workloads/device"
)

// Broadcasting follows PyTorch's (and NumPy's) rule: shapes are aligned at their last dimension, and a
// dimension of 1, or a missing leading one, stretches to the other's size. A broadcast input is read through
// a view with stride 0 along the stretched dimensions, which costs no device memory; the gradient of such an
// input is the output's gradient summed back to its shape (the engine's sum_to in validate_outputs).

// broadcastShapes returns the shape a and b broadcast to, or false when they do not broadcast.
func broadcastShapes(a, b []int) ([]int, bool) {
	n := max(len(a), len(b))
	out := make([]int, n)
	for i := range n {
		da, db := 1, 1
		if j := len(a) - n + i; j >= 0 {
			da = a[j]
		}
		if j := len(b) - n + i; j >= 0 {
			db = b[j]
		}
		switch {
		case da == db, db == 1:
			out[i] = da
		case da == 1:
			out[i] = db
		default:
			return nil, false
		}
	}
	return out, true
}

// mustBroadcast returns the broadcast shape of a and b, or panics as PyTorch raises.
func mustBroadcast(op string, a, b *Tensor) []int {
	shape, ok := broadcastShapes(a.shape, b.shape)
	if !ok {
		errShape(op, "shapes %v and %v do not broadcast", a.shape, b.shape)
	}
	return shape
}

// broadcastView returns t's values viewed with shape (which t broadcasts to): stride 0 along the stretched
// dimensions. It is a host-side object for reading values, outside autograd and the allocator.
func (t *object) broadcastView(shape []int) *object {
	strides := make([]int, len(shape))
	off := len(shape) - len(t.shape)
	for i := range t.shape {
		if t.shape[i] != 1 || shape[off+i] == 1 {
			strides[off+i] = t.strides[i]
		}
	}
	return &object{st: t.st, shape: shape, strides: strides, offset: t.offset}
}

// hostAs returns t's values broadcast to shape, row-major (host scratch, not device memory).
func (t *object) hostAs(shape []int) []float32 {
	if slices.Equal(t.shape, shape) {
		return t.host()
	}
	return t.broadcastView(shape).host()
}

// sumTo reduces g to shape by summing over the dimensions shape broadcast along (the gradient of a broadcast
// input); when the shapes already match it returns another reference to g and allocates nothing, else it
// allocates one tensor of shape (at::sum_to).
func (rt *Runtime) sumTo(g *Tensor, shape []int, role string) *Tensor {
	if slices.Equal(g.shape, shape) {
		return g.Ref()
	}
	out := rt.Zeros(g.dtype, shape, role, rt.category)
	if rt.dev.Computes() {
		if isSuffix(shape, g.shape) { // a bias: rows summed
			device.SumRows(out.data(), g.host(), numel(shape))
		} else {
			dst := (&object{st: out.st, shape: shape, strides: contiguousStrides(shape)}).broadcastView(g.shape)
			accumulate(dst, g.host())
		}
		out.round()
	}
	return out
}

// accumulate adds row-major values into the (strided, possibly stride-0) view dst.
func accumulate(dst *object, values []float32) {
	eachOffset(dst, func(i, off int) { dst.st.data[off] += values[i] })
}

// Expand returns t viewed with shape, stretching dimensions of size 1 and adding leading ones, without
// allocating (tensor.expand). A -1 keeps the dimension as it is. Its backward sums the gradient back to t's
// shape (ExpandBackward0).
func (t *Tensor) Expand(shape ...int) *Tensor {
	t.check()
	shape = slices.Clone(shape)
	off := len(shape) - len(t.shape)
	if off < 0 {
		errShape("Expand", "cannot expand %v to %d dimensions", t.shape, len(shape))
	}
	for i, d := range t.shape {
		if shape[off+i] == -1 {
			shape[off+i] = d
		}
		if d != 1 && shape[off+i] != d {
			errShape("Expand", "cannot expand dimension %d of %v to %d", i, t.shape, shape[off+i])
		}
	}
	v := t.broadcastView(shape)
	in := slices.Clone(t.shape)
	return t.viewOf(shape, v.strides, t.offset, "ExpandBackward0", func(g *Tensor) *Tensor {
		return g.rt.sumTo(g, in, "expand.grad")
	})
}

// Unsqueeze inserts a dimension of size 1 at dim (a view; a negative dim counts from the end of the result).
func (t *Tensor) Unsqueeze(dim int) *Tensor {
	t.check()
	n := len(t.shape) + 1
	if dim < 0 {
		dim += n
	}
	if dim < 0 || dim >= n {
		errShape("Unsqueeze", "dimension %d out of range for shape %v", dim, t.shape)
	}
	stride := 1
	if dim < len(t.shape) {
		stride = t.strides[dim] * t.shape[dim]
	}
	shape := slices.Insert(slices.Clone(t.shape), dim, 1)
	strides := slices.Insert(slices.Clone(t.strides), dim, stride)
	in := slices.Clone(t.shape)
	return t.viewOf(shape, strides, t.offset, "UnsqueezeBackward0", func(g *Tensor) *Tensor {
		gs := slices.Delete(slices.Clone(g.strides), dim, dim+1)
		return g.rt.newObject(g.st, g.dtype, slices.Clone(in), gs, g.offset)
	})
}
