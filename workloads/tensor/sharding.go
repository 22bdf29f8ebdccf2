package tensor

import (
	"fmt"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// What data-parallel training (DDP, ZeRO, FSDP, CPU offload) does to tensors beyond eager ops: it hooks into
// autograd when a gradient is ready and into every module's forward, rebinds parameters onto flat buffers,
// frees a parameter's memory while autograd still holds the tensor and brings it back before backward needs
// it, and keeps some host memory page-locked. Each is a primitive PyTorch has; the strategies themselves
// live in workloads/dist.

// OnGradAccumulated registers f to run each time autograd has accumulated a gradient into this leaf's .grad
// (Tensor.register_post_accumulate_grad_hook; DDP's and ZeRO's hooks on the AccumulateGrad node). f may
// replace the gradient (SetGrad), as DDP does when it makes the gradient a view of its bucket.
func (t *Tensor) OnGradAccumulated(f func()) {
	t.check()
	t.object.gradHooks = append(t.object.gradHooks, f)
}

// SetScopeHook sets f to be called each time a module scope is entered (enter true) or left: a module's
// forward, the backward of an op that ran in a module (the engine runs it in the op's scope), and parameter
// construction. It stands for the module hooks FSDP and ZeRO-3 register (pre- and post-forward, pre- and
// post-backward); the runtime's phase tells which. nil removes it.
func (rt *Runtime) SetScopeHook(f func(path string, enter bool)) { rt.scopeHook = f }

// SetData makes t's object use src's memory, as `param.data = src` does: every reference to the object
// (the parameter, what autograd saved of it) sees src's storage, dtype, shape and strides; t's old storage
// is released (freed when nothing else holds it). src is not consumed.
func (t *Tensor) SetData(src *Tensor) {
	t.check()
	src.check()
	o := t.object
	if src.rt != o.rt {
		panic("tensor: SetData across runtimes")
	}
	old := o.st
	src.st.refs++
	o.st, o.dtype, o.offset = src.st, src.dtype, src.offset
	o.shape, o.strides = slices.Clone(src.shape), slices.Clone(src.strides)
	old.release()
}

// FreeStorage gives the tensor's memory back to the allocator while every reference to it stays valid, as
// FSDP's _free_storage (storage.resize_(0)) and ZeRO-3's release of a gathered parameter do. The values are
// kept on a computing device: they stand for the shards the other ranks hold, which an all-gather brings
// back. Freeing a freed storage does nothing.
func (t *Tensor) FreeStorage() {
	t.check()
	st := t.st
	if st.freed || st.bytes == 0 {
		return
	}
	if st.managed {
		panic("tensor: FreeStorage of unified memory")
	}
	st.rt.dev.Free(st.addr)
	st.addr, st.freed = 0, true
}

// AllocStorage allocates the memory of a tensor whose storage was freed (FSDP's _alloc_storage before an
// all-gather; ZeRO-3's fetch). It panics with an *OOMError when the device has no room, as any allocation.
// Allocating a storage that holds memory does nothing.
func (t *Tensor) AllocStorage() {
	t.check()
	st := t.st
	if !st.freed {
		return
	}
	st.addr, st.freed = st.rt.allocate(st), false
}

// StorageFreed reports whether the tensor's memory is given back (FreeStorage) and not yet allocated again.
func (t *object) StorageFreed() bool { return t.st.freed }

// SetCategory records that the tensor's storage now holds something else, e.g. a bucket of gradients.
func (t *Tensor) SetCategory(c snapshot.Category) { t.st.setCategory(c) }

// Pinned runs f with the runtime's new allocations in page-locked host memory (tensor.pin_memory(), or
// DeepSpeed's pin_memory option): on a host device they go through the caching host allocator, whose blocks
// are rounded up to powers of two and kept for reuse. Elsewhere it only runs f.
func (rt *Runtime) Pinned(f func()) {
	prev := rt.pinned
	rt.pinned = true
	defer func() { rt.pinned = prev }()
	f()
}

// malloc allocates bytes on the runtime's device: page-locked when a host device is asked for pinned memory.
func (rt *Runtime) malloc(bytes uint64) (uint64, error) {
	if rt.pinned {
		return rt.dev.MallocPinned(bytes)
	}
	return rt.dev.MallocOn(bytes, rt.stream)
}

// Copy_ copies src's values into dst (dst.copy_(src)), converting to dst's dtype: a bucket filled from a
// gradient, a half parameter from its float32 master copy, a host buffer from a device tensor (src may
// belong to another runtime: a host and a device of the same kind). It allocates nothing.
func Copy_(dst, src *Tensor) {
	src.check()
	if dst.Numel() != src.Numel() {
		panic(fmt.Sprintf("tensor.Copy_: %d elements into %d", src.Numel(), dst.Numel()))
	}
	var s []float32
	if src.rt.dev.Computes() {
		s = src.host()
	}
	inplace(dst, func(i int, d []float32) {
		if s != nil {
			d[i] = s[i]
		}
	})
}
