package tensor

import "slices"

// Views share their base's storage and allocate nothing; reshape copies only when no view is possible,
// exactly when PyTorch's does, since that copy is device memory.

// View returns a tensor of the given shape over the same storage (tensor.view). One dimension may be -1.
// It panics when the strides do not allow a view, as PyTorch raises.
func (t *Tensor) View(shape ...int) *Tensor {
	t.check()
	shape = t.inferShape("View", shape)
	strides, ok := viewStrides(t.shape, t.strides, shape)
	if !ok {
		errShape("View", "view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces). Use .reshape(...) instead.")
	}
	return t.viewOf(shape, strides, t.offset, "ViewBackward0", t.reshapeBack())
}

// Reshape returns a view when the strides allow one, else a contiguous copy (tensor.reshape).
func (t *Tensor) Reshape(shape ...int) *Tensor {
	t.check()
	shape = t.inferShape("Reshape", shape)
	if strides, ok := viewStrides(t.shape, t.strides, shape); ok {
		return t.viewOf(shape, strides, t.offset, "ViewBackward0", t.reshapeBack())
	}
	c := t.Contiguous()
	defer c.Release()
	return c.View(shape...)
}

// Transpose swaps dimensions d0 and d1 (a view).
func (t *Tensor) Transpose(d0, d1 int) *Tensor {
	t.check()
	d0, d1 = t.axis(d0), t.axis(d1)
	shape, strides := slices.Clone(t.shape), slices.Clone(t.strides)
	shape[d0], shape[d1] = shape[d1], shape[d0]
	strides[d0], strides[d1] = strides[d1], strides[d0]
	return t.viewOf(shape, strides, t.offset, "TransposeBackward0", func(g *Tensor) *Tensor { return g.Transpose(d0, d1) })
}

// T returns the transpose of a 2-D tensor (a view).
func (t *Tensor) T() *Tensor { return t.Transpose(0, 1) }

// Split cuts dimension dim into pieces of size (the last may be smaller), as views (torch.split).
func (t *Tensor) Split(size, dim int) []*Tensor {
	t.check()
	dim = t.axis(dim)
	var outs []*Tensor
	for start := 0; start < t.shape[dim]; start += size {
		n := min(size, t.shape[dim]-start)
		shape := slices.Clone(t.shape)
		shape[dim] = n
		outs = append(outs, t.rt.newObject(t.st, t.dtype, shape, slices.Clone(t.strides), t.offset+start*t.strides[dim]))
	}
	if t.rt.needsGrad(t) {
		full := slices.Clone(t.shape)
		t.rt.node("SplitBackward0", []*Tensor{t}, outs, func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			return []*Tensor{n.rt.cat(g, outs, full, dim, "split.grad")}
		})
	}
	return outs
}

// Contiguous returns t itself (another reference) when it is contiguous, else a contiguous copy.
func (t *Tensor) Contiguous() *Tensor {
	t.check()
	if t.IsContiguous() {
		return t.Ref()
	}
	return t.rt.copyOp(t, "contiguous")
}

// copyOp makes a contiguous copy of t, differentiable (clone / contiguous).
func (rt *Runtime) copyOp(t *Tensor, role string) *Tensor {
	out := rt.Empty(t.dtype, t.shape, role)
	if rt.dev.Computes() {
		copy(out.data(), t.host())
	}
	if rt.needsGrad(t) {
		rt.node("CloneBackward0", []*Tensor{t}, []*Tensor{out}, passGrad)
	}
	return out
}

// passGrad is the backward of ops whose input gradient is the output gradient itself.
func passGrad(_ *Node, g []*Tensor, _ []bool) []*Tensor { return []*Tensor{g[0].Ref()} }

// viewOf makes a view object of t; when t is tracked by autograd, the view gets a node of the given name whose
// backward maps the view's gradient back with back.
func (t *Tensor) viewOf(shape, strides []int, offset int, nodeName string, back func(g *Tensor) *Tensor) *Tensor {
	out := t.rt.newObject(t.st, t.dtype, shape, strides, offset)
	if t.rt.needsGrad(t) {
		t.rt.node(nodeName, []*Tensor{t}, []*Tensor{out}, func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			return []*Tensor{back(g[0])}
		})
	}
	return out
}

// reshapeBack returns the backward of a view: the gradient reshaped to t's shape (ViewBackward0).
func (t *Tensor) reshapeBack() func(g *Tensor) *Tensor {
	in := slices.Clone(t.shape)
	return func(g *Tensor) *Tensor { return g.Reshape(in...) }
}

// cat builds the gradient of a split: the pieces' gradients side by side along dim, zeros where a piece got
// none. It allocates one tensor of the full shape.
func (rt *Runtime) cat(grads, pieces []*Tensor, full []int, dim int, role string) *Tensor {
	var dtype DType
	for i, g := range grads {
		if g != nil {
			dtype = g.dtype
			break
		}
		dtype = pieces[i].dtype
	}
	out := rt.Zeros(dtype, full, role, rt.category)
	if rt.dev.Computes() {
		strides := contiguousStrides(full)
		start := 0
		for i, p := range pieces {
			if g := grads[i]; g != nil {
				dst := &object{st: out.st, shape: p.shape, strides: strides, offset: start * strides[dim]}
				scatter(dst, g.host())
			}
			start += p.shape[dim]
		}
	}
	return out
}

// scatter writes row-major values into the (strided) view dst.
func scatter(dst *object, values []float32) {
	eachOffset(dst, func(i, off int) { dst.st.data[off] = values[i] })
}

// eachOffset calls f with the index and storage offset of every element of dst, in row-major order.
func eachOffset(dst *object, f func(i, off int)) {
	idx := make([]int, len(dst.shape))
	for i := range numel(dst.shape) {
		off := dst.offset
		for d, k := range idx {
			off += k * dst.strides[d]
		}
		f(i, off)
		for d := len(idx) - 1; d >= 0; d-- {
			idx[d]++
			if idx[d] < dst.shape[d] {
				break
			}
			idx[d] = 0
		}
	}
}

// inferShape resolves a -1 in shape and checks the element count.
func (t *Tensor) inferShape(op string, shape []int) []int {
	shape = slices.Clone(shape)
	known, infer := 1, -1
	for i, d := range shape {
		if d == -1 {
			if infer >= 0 {
				errShape(op, "only one dimension can be inferred")
			}
			infer = i
			continue
		}
		known *= d
	}
	if infer >= 0 {
		if known == 0 || t.Numel()%known != 0 {
			errShape(op, "shape %v is invalid for input of size %d", shape, t.Numel())
		}
		shape[infer] = t.Numel() / known
	}
	if numel(shape) != t.Numel() {
		errShape(op, "shape %v is invalid for input of size %d", shape, t.Numel())
	}
	return shape
}

// viewStrides returns the strides of a view of (oldShape, oldStrides) with newShape, or false when no view is
// possible. It is PyTorch's computeStride: dimensions may be merged only where they are contiguous with one
// another.
func viewStrides(oldShape, oldStrides, newShape []int) ([]int, bool) {
	newStrides := make([]int, len(newShape))
	if numel(oldShape) == 0 {
		return contiguousStrides(newShape), true
	}
	viewD := len(newShape) - 1
	chunkBase := oldStrides[len(oldStrides)-1]
	tensorNumel, viewNumel := 1, 1
	for d := len(oldShape) - 1; d >= 0; d-- {
		tensorNumel *= oldShape[d]
		if d == 0 || (oldShape[d-1] != 1 && oldStrides[d-1] != tensorNumel*chunkBase) {
			for viewD >= 0 && (viewNumel < tensorNumel || newShape[viewD] == 1) {
				newStrides[viewD] = viewNumel * chunkBase
				viewNumel *= newShape[viewD]
				viewD--
			}
			if viewNumel != tensorNumel {
				return nil, false
			}
			if d > 0 {
				chunkBase = oldStrides[d-1]
				tensorNumel, viewNumel = 1, 1
			}
		}
	}
	if viewD != -1 {
		return nil, false
	}
	return newStrides, true
}
