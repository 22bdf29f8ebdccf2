package tensor

import (
	"fmt"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Tensor is one reference to a tensor object, like one Python reference: it keeps the object (and so its
// storage) alive until Release. Ref makes another reference to the same object, sharing its gradient and
// autograd history; views and Detach make new objects over the same storage.
type Tensor struct {
	*object
	id         uint64 // creation order, for deterministic heap dumps
	owner      owner
	released   bool
	prev, next *Tensor // in the runtime's list of live references
}

// object is a tensor proper: a (possibly strided) view of a storage, with its autograd state.
type object struct {
	rt      *Runtime
	st      *storage
	shape   []int
	strides []int // in elements
	offset  int   // in elements
	dtype   DType

	requiresGrad bool
	gradFn       *Node   // the node that made this tensor; nil for leaves
	outputNr     int     // which output of gradFn this is
	grad         *Tensor // accumulated gradient of a leaf
	accumulate   *Node   // the AccumulateGrad node of a leaf that requires grad
	refs         int
	name         string   // the first name a reference gave it (e.g. a parameter's), for describing its gradient
	gradHooks    []func() // run after a gradient is accumulated into grad (OnGradAccumulated)
}

// owner says who holds a reference, for heap dumps.
type owner struct {
	name   string  // a named root: a parameter, an optimizer slot, a user variable such as "loss_history[7]"
	node   *Node   // a node that saved this reference for backward ...
	slot   string  // ... as its "input", "weight", "result", "mask", ...
	gradOf *object // the leaf whose .grad this is
	kept   bool    // node holds it as a ctx attribute, not as a saved tensor
}

// link puts t in the list of live references.
func (rt *Runtime) link(t *Tensor) {
	t.next = rt.handles
	if rt.handles != nil {
		rt.handles.prev = t
	}
	rt.handles = t
	rt.nHandles++
}

// unlink takes t out of the list of live references.
func (rt *Runtime) unlink(t *Tensor) {
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		rt.handles = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	}
	t.prev, t.next = nil, nil
	rt.nHandles--
}

// newObject makes a tensor object on st and returns the first reference to it.
func (rt *Runtime) newObject(st *storage, dtype DType, shape, strides []int, offset int) *Tensor {
	st.refs++
	// The object and its first reference in one allocation: most objects never get another.
	b := &struct {
		o object
		t Tensor
	}{o: object{rt: rt, st: st, shape: shape, strides: strides, offset: offset, dtype: dtype, refs: 1}}
	rt.nextRef++
	b.t = Tensor{object: &b.o, id: rt.nextRef}
	rt.link(&b.t)
	return &b.t
}

// ref makes a reference to o and registers it.
func (o *object) ref() *Tensor {
	o.refs++
	o.rt.nextRef++
	t := &Tensor{object: o, id: o.rt.nextRef}
	o.rt.link(t)
	return t
}

// empty allocates an uninitialised contiguous tensor tagged with category.
func (rt *Runtime) empty(dtype DType, shape []int, role string, category snapshot.Category) *Tensor {
	// The shape and its strides in one allocation (shape capped, so appending to it copies).
	n := len(shape)
	buf := make([]int, 2*n)
	copy(buf, shape)
	shape, strides := buf[:n:n], buf[n:]
	acc := 1
	for i := n - 1; i >= 0; i-- {
		strides[i] = acc
		acc *= shape[i]
	}
	st := rt.newStorage(dtype, shape, role, category)
	return rt.newObject(st, dtype, shape, strides, 0)
}

// Empty allocates an uninitialised tensor; role names it in the trace (e.g. "fc.out"). Its category is the
// runtime's current one.
func (rt *Runtime) Empty(dtype DType, shape []int, role string) *Tensor {
	return rt.empty(dtype, shape, role, rt.category)
}

// Zeros allocates a tensor of zeros with the given category.
func (rt *Runtime) Zeros(dtype DType, shape []int, role string, category snapshot.Category) *Tensor {
	return rt.empty(dtype, shape, role, category) // new storage is zeroed on the cpu device; meta holds no values
}

// Full allocates a tensor with every element v.
func (rt *Runtime) Full(dtype DType, shape []int, v float32, role string, category snapshot.Category) *Tensor {
	t := rt.empty(dtype, shape, role, category)
	if t.st.data != nil {
		for i := range t.st.data {
			t.st.data[i] = v
		}
		t.round()
	}
	return t
}

// Randn allocates a tensor of normal samples with mean 0 and standard deviation std.
func (rt *Runtime) Randn(dtype DType, shape []int, std float32, role string, category snapshot.Category) *Tensor {
	t := rt.empty(dtype, shape, role, category)
	if t.st.data != nil {
		for i := range t.st.data {
			t.st.data[i] = float32(rt.rng.NormFloat64()) * std
		}
		t.round()
	}
	return t
}

// Uniform allocates a tensor of samples uniform in [lo, hi).
func (rt *Runtime) Uniform(dtype DType, shape []int, lo, hi float32, role string, category snapshot.Category) *Tensor {
	t := rt.empty(dtype, shape, role, category)
	if t.st.data != nil {
		for i := range t.st.data {
			t.st.data[i] = lo + (hi-lo)*rt.rng.Float32()
		}
		t.round()
	}
	return t
}

// FromValues allocates a tensor holding values (copied on a computing device, ignored on meta).
func (rt *Runtime) FromValues(dtype DType, shape []int, values []float32, role string, category snapshot.Category) *Tensor {
	if len(values) != numel(shape) {
		errShape("FromValues", "%d values for shape %v", len(values), shape)
	}
	t := rt.empty(dtype, shape, role, category)
	if t.st.data != nil {
		copy(t.st.data, values)
		t.round()
	}
	return t
}

// round rounds a fresh contiguous tensor's values to its dtype.
func (t *object) round() { roundValues(t.dtype, t.st.data) }

// Release drops this reference. The object goes when its last reference does (releasing its gradient), and
// the storage when its last object does. Releasing twice is a bug.
func (t *Tensor) Release() {
	if t == nil {
		return
	}
	if t.released {
		panic(fmt.Sprintf("tensor: %s released twice", t.describe()))
	}
	t.released = true
	t.rt.unlink(t)
	o := t.object
	o.refs--
	if o.refs > 0 {
		return
	}
	if o.grad != nil {
		o.grad.Release()
		o.grad = nil
	}
	if o.gradFn != nil {
		o.gradFn.unref()
	}
	o.st.release()
}

// Ref returns another reference to the same tensor: same storage, same gradient, same autograd history.
func (t *Tensor) Ref() *Tensor {
	t.check()
	return t.object.ref()
}

// Detach returns a new tensor on the same storage, outside autograd (tensor.detach()).
func (t *Tensor) Detach() *Tensor {
	t.check()
	return t.rt.newObject(t.st, t.dtype, t.shape, t.strides, t.offset)
}

// SetName names the reference for heap dumps: a user variable ("loss_history[7]"), a parameter, an optimizer
// slot. Named references are roots of the heap graph.
func (t *Tensor) SetName(name string) *Tensor {
	t.owner = owner{name: name}
	if t.object.name == "" {
		t.object.name = name
	}
	return t
}

// Name returns the reference's name, or "".
func (t *Tensor) Name() string { return t.owner.name }

func (t *Tensor) check() {
	if t.released {
		panic(fmt.Sprintf("tensor: %s used after Release", t.describe()))
	}
}

// Shape returns the tensor's dimensions (do not modify).
func (t *object) Shape() []int { return t.shape }

// Dim returns the size of dimension i; negative i counts from the end.
func (t *object) Dim(i int) int { return t.shape[t.axis(i)] }

// NDim returns the number of dimensions.
func (t *object) NDim() int { return len(t.shape) }

// Numel returns the number of elements.
func (t *object) Numel() int { return numel(t.shape) }

// DType returns the element type.
func (t *object) DType() DType { return t.dtype }

// Bytes returns the bytes of the storage this tensor views.
func (t *object) Bytes() uint64 { return t.st.bytes }

// Addr returns the device address of the storage (0 for an empty tensor).
func (t *object) Addr() uint64 { return t.st.addr }

// Category returns what the storage holds.
func (t *object) Category() snapshot.Category { return t.st.category }

// Label returns the storage's label, e.g. "f32[8,768] fc.out".
func (t *object) Label() string { return t.st.labelText() }

// SharesStorage reports whether t and u view the same storage.
func (t *object) SharesStorage(u *Tensor) bool { return t.st == u.st }

// RequiresGrad reports whether autograd tracks this tensor.
func (t *object) RequiresGrad() bool { return t.requiresGrad }

// SetRequiresGrad marks a leaf as needing a gradient (tensor.requires_grad_()).
func (t *Tensor) SetRequiresGrad(on bool) *Tensor {
	if t.gradFn != nil && !on {
		errShape("SetRequiresGrad", "cannot clear requires_grad of a non-leaf")
	}
	t.requiresGrad = on
	return t
}

// GradFn returns the node that made this tensor, or nil for a leaf.
func (t *object) GradFn() *Node { return t.gradFn }

// Grad returns the accumulated gradient of a leaf, or nil.
func (t *object) Grad() *Tensor { return t.grad }

// SetGrad replaces the leaf's gradient (the old reference is released) and takes ownership of g; nil clears
// it (zero_grad's set-to-none).
func (t *Tensor) SetGrad(g *Tensor) {
	if t.grad != nil {
		t.grad.Release()
	}
	t.grad = g
	if g != nil {
		g.owner = owner{gradOf: t.object}
	}
}

// IsContiguous reports whether the view is dense and row-major.
func (t *object) IsContiguous() bool {
	s := 1
	for i := len(t.shape) - 1; i >= 0; i-- {
		if t.shape[i] != 1 && t.strides[i] != s {
			return false
		}
		s *= t.shape[i]
	}
	return true
}

// Values returns the tensor's values in row-major order (a copy), or nil on a device that computes nothing.
func (t *Tensor) Values() []float32 {
	t.check()
	if t.st.data == nil {
		return nil
	}
	return slices.Clone(t.host())
}

// Item returns the value of a one-element tensor (0 on meta).
func (t *Tensor) Item() float32 {
	if t.Numel() != 1 {
		errShape("Item", "tensor of shape %v has %d elements", t.shape, t.Numel())
	}
	if s := t.rt.dev.Streams(); s != nil { // the copy to the host waits for the stream
		s.SynchronizeStream(t.rt.stream)
	}
	if t.st.data == nil {
		return 0
	}
	return t.st.data[t.offset]
}

// host returns the values row-major: the storage itself when the view is contiguous, else a gathered copy in
// host memory. Host copies are math scratch, not device memory, so they are not accounted.
func (t *object) host() []float32 {
	n := t.Numel()
	if t.IsContiguous() {
		return t.st.data[t.offset : t.offset+n]
	}
	out := make([]float32, n)
	idx := make([]int, len(t.shape))
	for i := range out {
		off := t.offset
		for d, k := range idx {
			off += k * t.strides[d]
		}
		out[i] = t.st.data[off]
		for d := len(idx) - 1; d >= 0; d-- {
			idx[d]++
			if idx[d] < t.shape[d] {
				break
			}
			idx[d] = 0
		}
	}
	return out
}

// data returns the contiguous values of a tensor this package just allocated (the output of an op).
func (t *object) data() []float32 {
	if t.st.data == nil {
		return nil
	}
	return t.st.data[t.offset : t.offset+t.Numel()]
}

func (t *object) axis(i int) int {
	n := len(t.shape)
	if i < 0 {
		i += n
	}
	if i < 0 || i >= n {
		errShape("axis", "dimension %d out of range for shape %v", i, t.shape)
	}
	return i
}

func (t *object) describe() string {
	if l := t.st.labelText(); l != "" {
		return l
	}
	return label(t.dtype, t.shape, "")
}

func (t *object) String() string { return t.describe() }

func contiguousStrides(shape []int) []int {
	s := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= shape[i]
	}
	return s
}

// Runtime returns the runtime the tensor belongs to.
func (t *object) Runtime() *Runtime { return t.rt }
