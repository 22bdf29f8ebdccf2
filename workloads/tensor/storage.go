package tensor

import (
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
	label    string
}

// newStorage allocates bytes of device memory for a tensor described by dtype, shape and role, tagged with
// category. On failure it calls the runtime's OOM hook and panics with an *OOMError.
func (rt *Runtime) newStorage(dtype DType, shape []int, role string, category snapshot.Category) *storage {
	n := numel(shape)
	st := &storage{rt: rt, bytes: uint64(n * dtype.Size()), refs: 0, category: category}
	if st.bytes == 0 {
		return st // PyTorch does not allocate for empty tensors
	}
	st.label = label(dtype, shape, role)
	if rt.tr != nil {
		rt.tr.TagNextAlloc(category, st.label)
	}
	addr, err := rt.dev.Malloc(st.bytes)
	if err != nil {
		oom := &OOMError{Bytes: st.bytes, Label: st.label, Err: err}
		if rt.onOOM != nil {
			rt.onOOM(oom)
		}
		panic(oom)
	}
	st.addr = addr
	if rt.dev.Computes() {
		st.data = make([]float32, n)
	}
	return st
}

// release drops one reference and frees the block when none is left.
func (st *storage) release() {
	st.refs--
	if st.refs > 0 || st.bytes == 0 {
		return
	}
	st.rt.dev.Free(st.addr)
	st.data = nil
}

// setCategory records that the block now holds something else (e.g. autograd saved a temporary).
func (st *storage) setCategory(c snapshot.Category) {
	if st.category == c || st.bytes == 0 {
		return
	}
	st.category = c
	if st.rt.tr != nil {
		st.rt.tr.SetCategory(st.rt.dev.Index(), st.addr, c, "")
	}
}

// label formats a tensor label such as "f32[8,1024,768] fc.out".
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
