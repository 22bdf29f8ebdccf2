package tensor

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/oomdbg/oomdbg/snapshot"
)

// storage is one block of device memory and, on a computing device, its values. Tensor handles share it
// (views, saved copies of a handle); it goes back to the allocator when the last one is released.
type storage struct {
	rt       *Runtime
	addr     uint64
	bytes    uint64
	data     []float32 // the values, on a computing device; nil on meta
	refs     int
	category snapshot.Category
	// What the label says ("f32[8,768] fc.out"), made when first asked for (labelText): without a tracer
	// most storages never are.
	dtype   DType
	shape   []int
	role    string
	label   string
	managed bool // unified memory outside the caching allocator (EmptyManaged)
	freed   bool // the memory was given back while the tensor lives on (FreeStorage)
	// offload is set while the tensor is a saved tensor moved to host memory (ActivationOffload).
	offload *offloaded
}

// newStorage allocates bytes of device memory for a tensor described by dtype, shape and role, tagged with
// category. On failure it calls the runtime's OOM hook and panics with an *OOMError.
func (rt *Runtime) newStorage(dtype DType, shape []int, role string, category snapshot.Category) *storage {
	n := numel(shape)
	st := &storage{rt: rt, bytes: uint64(n * dtype.Size()), refs: 0, category: category, dtype: dtype, shape: shape, role: role}
	if st.bytes == 0 {
		return st // PyTorch does not allocate for empty tensors
	}
	st.addr = rt.allocate(st)
	if rt.dev.Computes() {
		st.data = make([]float32, n)
	}
	return st
}

// allocate gets the device memory of st, telling the tracer its category and label first. On failure it
// calls the runtime's OOM hook and panics with an *OOMError.
func (rt *Runtime) allocate(st *storage) uint64 {
	if rt.tr != nil {
		rt.tr.TagNextAlloc(st.category, st.labelText())
	}
	addr, err := rt.malloc(st.bytes)
	if err != nil {
		oom := &OOMError{Bytes: st.bytes, Label: st.labelText(), Err: err}
		if rt.onOOM != nil {
			rt.onOOM(oom)
		}
		panic(oom)
	}
	return addr
}

// release drops one reference and frees the block when none is left.
func (st *storage) release() {
	st.refs--
	if st.refs > 0 || st.bytes == 0 {
		return
	}
	if st.offload != nil { // a saved tensor offloaded and never brought back: its host copy goes
		st.offload.releaseHost()
	}
	if st.freed { // its memory went back already (FreeStorage)
		st.data = nil
		return
	}
	if st.managed {
		m, _ := st.rt.dev.Managed()
		if err := m.FreeManaged(st.addr); err != nil {
			panic(fmt.Sprintf("tensor: %v", err))
		}
	} else {
		st.rt.dev.Free(st.addr)
	}
	st.data = nil
}

// EmptyManaged allocates a tensor in the device's unified memory (bitsandbytes' get_paged:
// cudaMallocManaged), outside the caching allocator: it is not in memory_allocated, its pages reach the device
// when prefetched and leave it when the device needs the room. On a device without unified memory it is an
// ordinary allocation. The new tensor holds zeros on the cpu device.
func (rt *Runtime) EmptyManaged(dtype DType, shape []int, role string, category snapshot.Category) *Tensor {
	m, ok := rt.dev.Managed()
	if !ok {
		return rt.Zeros(dtype, shape, role, category)
	}
	shape = slices.Clone(shape)
	n := numel(shape)
	st := &storage{rt: rt, bytes: uint64(n * dtype.Size()), category: category, managed: true, label: label(dtype, shape, role)}
	if st.bytes > 0 {
		addr, err := m.MallocManaged(st.bytes)
		if err != nil {
			panic(fmt.Sprintf("tensor: %v", err))
		}
		st.addr = addr
		if rt.dev.Computes() {
			st.data = make([]float32, n)
		}
	}
	return rt.newObject(st, dtype, shape, contiguousStrides(shape), 0)
}

// Managed reports whether the tensor lives in unified memory.
func (t *object) Managed() bool { return t.st.managed }

// Prefetch brings a unified-memory tensor's pages to the device (cudaMemPrefetchAsync) and returns the
// bytes the device had no room for; 0 for any other tensor.
func (t *Tensor) Prefetch() uint64 {
	if !t.st.managed || t.st.bytes == 0 {
		return 0
	}
	m, _ := t.rt.dev.Managed()
	return m.Prefetch(t.st.addr)
}

// setCategory records that the block now holds something else (e.g. autograd saved a temporary).
func (st *storage) setCategory(c snapshot.Category) {
	if st.category == c || st.bytes == 0 {
		return
	}
	if st.managed { // not a block the tracer knows
		st.category = c
		return
	}
	st.category = c
	if st.rt.tr != nil {
		st.rt.tr.SetCategory(st.rt.dev.Index(), st.addr, c, "")
	}
}

// label formats a tensor label such as "f32[8,1024,768] fc.out".
// labelText returns the storage's label ("" for an empty one, which has no memory).
func (st *storage) labelText() string {
	if st.label == "" && st.bytes > 0 {
		st.label = label(st.dtype, st.shape, st.role)
	}
	return st.label
}

func label(dtype DType, shape []int, role string) string {
	b := make([]byte, 0, 24+len(role))
	b = append(b, dtype.String()...)
	b = append(b, '[')
	for i, d := range shape {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(d), 10)
	}
	b = append(b, ']')
	if role != "" {
		b = append(b, ' ')
		b = append(b, role...)
	}
	return string(b)
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
