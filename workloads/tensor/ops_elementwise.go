package tensor

import (
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
)

// Add returns a + b, broadcast (e.g. a bias over rows, or a (B, 1, T, T) mask over heads), in the wider
// of the two dtypes. It saves nothing; each input receives the output's gradient, summed to its shape where
// it was broadcast.
func Add(a, b *Tensor) *Tensor {
	a.check()
	b.check()
	shape := mustBroadcast("Add", a, b)
	rt := a.rt
	out := rt.Empty(resultType(a, b), shape, "add.out")
	if rt.dev.Computes() {
		if slices.Equal(a.shape, shape) && isSuffix(b.shape, shape) {
			device.Add(out.data(), a.host(), b.host())
		} else {
			device.Add(out.data(), a.hostAs(shape), b.hostAs(shape))
		}
		out.round()
	}
	if rt.needsGrad(a, b) {
		rt.node("AddBackward0", []*Tensor{a, b}, []*Tensor{out}, addBackward(a.shape, b.shape))
	}
	return out
}

// addBackward is AddBackward0's backward: the output's gradient for each input, summed to the input's shape
// where it was broadcast.
func addBackward(aShape, bShape []int) backwardFunc {
	aShape, bShape = slices.Clone(aShape), slices.Clone(bShape)
	return func(n *Node, g []*Tensor, needs []bool) []*Tensor {
		grads := make([]*Tensor, 2)
		if needs[0] {
			grads[0] = n.rt.sumTo(g[0], aShape, "add.grad")
		}
		if needs[1] {
			grads[1] = n.rt.sumTo(g[0], bShape, "add.grad")
		}
		return grads
	}
}

// isSuffix reports whether shape b is a suffix of shape a (b repeats over a's leading dimensions).
func isSuffix(b, a []int) bool {
	return len(b) <= len(a) && slices.Equal(a[len(a)-len(b):], b)
}

// Add_ is y.add_(b) (y += b, b broadcast to y's shape) on a tensor y the caller made, which is not a leaf
// that requires grad: no allocation, nothing saved; y's history is rebased onto the add. It returns a new
// reference to y.
func Add_(y, b *Tensor) *Tensor {
	y.check()
	b.check()
	return addInPlaceOp(y, b)
}

// addInPlaceOp is y.add_(b) on a tensor y the caller made: no allocation; y's history is rebased onto the
// add. It returns a new reference to y.
func addInPlaceOp(y, b *Tensor) *Tensor {
	broadcastable("add_", y, b)
	rt := y.rt
	if rt.dev.Computes() {
		device.Add(y.data(), y.data(), b.hostAs(y.shape))
		y.round()
	}
	out := y.Ref()
	if rt.needsGrad(y, b) {
		// node reads y's old grad_fn for its edge before making the add y's new one.
		rt.node("AddBackward0", []*Tensor{y, b}, []*Tensor{out}, addBackward(y.shape, b.shape))
	}
	return out
}

// Mul returns a * b elementwise, broadcast like Add's, in the wider of the two dtypes. Each input is saved
// when the other needs a gradient; the gradient of each is the output's gradient times the other, summed to
// its shape where it was broadcast.
func Mul(a, b *Tensor) *Tensor {
	a.check()
	b.check()
	shape := mustBroadcast("Mul", a, b)
	rt := a.rt
	out := rt.Empty(resultType(a, b), shape, "mul.out")
	if rt.dev.Computes() {
		device.Mul(out.data(), a.hostAs(shape), b.hostAs(shape))
		out.round()
	}
	if rt.needsGrad(a, b) {
		node := rt.node("MulBackward0", []*Tensor{a, b}, []*Tensor{out}, nil)
		sa, sb := node.saveCrossed(a, "self", b, "other")
		aShape, bShape := slices.Clone(a.shape), slices.Clone(b.shape)
		node.apply = func(n *Node, g []*Tensor, needs []bool) []*Tensor {
			grads := make([]*Tensor, 2)
			if needs[0] {
				grads[0] = n.rt.productTo(g[0], sb, aShape, "self.grad")
			}
			if needs[1] {
				grads[1] = n.rt.productTo(g[0], sa, bShape, "other.grad")
			}
			return grads
		}
	}
	return out
}

// productTo allocates g * other (broadcast to g's shape) and sums it to shape: mul_tensor_backward followed
// by the engine's sum_to.
func (rt *Runtime) productTo(g, other *Tensor, shape []int, role string) *Tensor {
	full := rt.Empty(resultType(g, other), g.shape, role)
	if rt.dev.Computes() {
		device.Mul(full.data(), g.host(), other.hostAs(g.shape))
		full.round()
	}
	if slices.Equal(g.shape, shape) {
		return full
	}
	defer full.Release()
	return rt.sumTo(full, shape, role)
}

// Scale returns x * s for a scalar s (saves nothing).
func Scale(x *Tensor, s float32) *Tensor {
	x.check()
	rt := x.rt
	out := rt.Empty(x.dtype, x.shape, "mul.out")
	if rt.dev.Computes() {
		copy(out.data(), x.host())
		device.Scale(out.data(), s)
		out.round()
	}
	if rt.needsGrad(x) {
		rt.node("MulBackward1", []*Tensor{x}, []*Tensor{out}, func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			return []*Tensor{Scale(g[0], s)}
		})
	}
	return out
}

// Reciprocal returns 1/x elementwise. It saves its result.
func Reciprocal(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	out := rt.Empty(x.dtype, x.shape, "reciprocal.out")
	if rt.dev.Computes() {
		d, s := out.data(), x.host()
		for i := range d {
			d[i] = 1 / s[i]
		}
		out.round()
	}
	if rt.needsGrad(x) {
		node := rt.node("ReciprocalBackward0", []*Tensor{x}, []*Tensor{out}, nil)
		result := node.save("result", out)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor { // -g * result^2
			dx := n.rt.Empty(g[0].dtype, g[0].shape, "reciprocal.grad")
			if n.rt.dev.Computes() {
				d, gv, r := dx.data(), g[0].host(), result.host()
				for i := range d {
					d[i] = -gv[i] * r[i] * r[i]
				}
				dx.round()
			}
			return []*Tensor{dx}
		}
	}
	return out
}

// ReLU returns max(x, 0). It saves its result.
func ReLU(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	out := rt.Empty(x.dtype, x.shape, "relu.out")
	if rt.dev.Computes() {
		device.ReLU(out.data(), x.host())
	}
	if rt.needsGrad(x) {
		node := rt.node("ReluBackward0", []*Tensor{x}, []*Tensor{out}, nil)
		result := node.save("result", out)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			return []*Tensor{n.rt.binary(g[0], result, "relu.grad", device.ReLUBackward)}
		}
	}
	return out
}

// GELU returns x * Φ(x) (exact form). It saves its input.
func GELU(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	out := rt.Empty(x.dtype, x.shape, "gelu.out")
	if rt.dev.Computes() {
		device.GELU(out.data(), x.host())
		out.round()
	}
	if rt.needsGrad(x) {
		node := rt.node("GeluBackward0", []*Tensor{x}, []*Tensor{out}, nil)
		self := node.save("self", x)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			return []*Tensor{n.rt.binary(g[0], self, "gelu.grad", device.GELUBackward)}
		}
	}
	return out
}

// Dropout zeroes elements with probability p and scales the rest by 1/(1-p) when training. As CUDA's fused
// kernel does, it allocates the output and then a one-byte-per-element mask, and saves the mask. With p == 0
// or outside training it returns x itself (another reference) and allocates nothing, as ATen does.
func Dropout(x *Tensor, p float32, training bool) *Tensor {
	x.check()
	if p == 0 || !training || x.Numel() == 0 {
		return x.Ref()
	}
	rt := x.rt
	out := rt.Empty(x.dtype, x.shape, "dropout.out")
	mask := rt.Empty(Bool, x.shape, "dropout.mask")
	if rt.dev.Computes() {
		device.Dropout(out.data(), mask.data(), x.host(), p, rt.rng.Float32)
		out.round()
	}
	if rt.needsGrad(x) {
		node := rt.node("NativeDropoutBackward0", []*Tensor{x}, []*Tensor{out}, nil)
		saved := node.save("result1", mask)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dx := n.rt.Empty(g[0].dtype, g[0].shape, "dropout.grad")
			if n.rt.dev.Computes() {
				device.DropoutBackward(dx.data(), g[0].host(), saved.host(), p)
				dx.round()
			}
			return []*Tensor{dx}
		}
	}
	mask.Release()
	return out
}

// binary allocates f(a, b) elementwise in a new tensor of a's shape (a backward helper).
func (rt *Runtime) binary(a, b *Tensor, role string, f func(dst, a, b []float32)) *Tensor {
	out := rt.Empty(a.dtype, a.shape, role)
	if rt.dev.Computes() {
		f(out.data(), a.host(), b.host())
		out.round()
	}
	return out
}

// addNoGrad allocates a + b outside autograd (gradient accumulation).
func (rt *Runtime) addNoGrad(a, b *Tensor, role string) *Tensor {
	return rt.binary(a, b, role, device.Add)
}

// addInPlace adds src into dst's values, allocating nothing.
func addInPlace(dst, src *Tensor) {
	if dst.rt.dev.Computes() {
		d := dst.data()
		device.Add(d, d, src.host())
		dst.round()
	}
}

// cloneAs allocates a contiguous copy of t with the given category, outside autograd.
func (rt *Runtime) cloneAs(t *Tensor, role string, category snapshot.Category) *Tensor {
	out := rt.empty(t.dtype, t.shape, role, category)
	if rt.dev.Computes() {
		copy(out.data(), t.host())
	}
	return out
}

// broadcastable checks that b broadcasts to a's shape (an in-place op's operand).
func broadcastable(op string, a, b *Tensor) {
	if shape, ok := broadcastShapes(a.shape, b.shape); !ok || !slices.Equal(shape, a.shape) {
		errShape(op, "shapes %v and %v do not broadcast", a.shape, b.shape)
	}
}

// roundValues rounds values to what dtype can hold.
func roundValues(dtype DType, values []float32) {
	switch dtype {
	case F16:
		device.RoundF16(values)
	case BF16:
		device.RoundBF16(values)
	}
}
