package tensor

import (
	"fmt"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// ActivationOffload moves what autograd saves for backward to pinned host memory and brings it back when
// backward needs it, as torchtune's OffloadActivations (training/_activation_offloading.py, a
// saved_tensors_hooks) does around a model's forward:
//
//   - pack: every tensor saved while it packs gets an id, in order; one of at least MinBytes (its view's
//     elements times their size) that is not a parameter itself is copied into a new pinned host tensor
//     (torch.empty_like(pin_memory=True) through the caching host allocator) and the saved tensor holds no
//     device memory. With Streams the copy runs on a side stream and the device tensor stays alive in a
//     forward stash until MaxStash more tensors were packed; without, it is dropped at once. A tensor saved
//     twice is copied twice.
//   - unpack, before a node's backward: a tensor still in the forward stash is used as it is; any other is
//     copied back into a new device tensor, allocated on the side stream with Streams (so its block is cached
//     for that stream's requests only), and the host copy is freed. With Streams the tensors a node brought
//     back stay alive after it in a backward stash until the next node that brings some back has run (or,
//     when the node made a view of one, until the allocator sees the compute stream done with it:
//     record_stream); the forward stash is emptied after the first node that unpacks.
//
// The output head runs without it (torchtune's NoOpManager on model.output): packing stops when the scope
// Head is entered, for the rest of the forward, the loss included, which torchtune computes outside.
type ActivationOffload struct {
	Host     *Runtime // host memory: a runtime on a host device
	Streams  bool     // use_streams: a copy stream and the stashes
	MinBytes int      // min_offload_size (torchtune: 1024)
	MaxStash int      // max_fwd_stash_size (torchtune: 5)
	Head     string   // the output head's scope, which runs without offloading

	rt      *Runtime
	packing bool
	lastID  int       // tensor_id: one per tensor packed
	fwd     []stashed // the forward stash, by id
	bwd     []stashed // the backward stash: tensors brought back, by the node that did
	node    *Node     // curr_autograd_node
	prev    []int     // ids of the backward stash to free once node has run (prev_node_ids)
	brought []broughtBack
}

// copyStream is the side stream the copies run on (torchtune's s1; the compute stream is 0).
const copyStream = 1

// stashed is a device tensor a stash keeps alive.
type stashed struct {
	id int
	t  *Tensor
}

// broughtBack is a tensor the running node brought back from host memory, with its storage's references
// then (torchtune compares _storage_Use_Count after the node).
type broughtBack struct {
	id   int
	st   *storage
	refs int
}

// offloaded is what a saved tensor moved to host memory keeps: its id, the host copy, and the device tensor's
// layout to restore when the forward stash still has it.
type offloaded struct {
	id             int
	host           *Tensor
	shape, strides []int
	offset         int
	unpacked       bool
}

// SetActivationOffload makes o the runtime's saved-tensor hooks (nil: none); they pack only inside
// OffloadForward.
func (rt *Runtime) SetActivationOffload(o *ActivationOffload) {
	if o != nil {
		o.rt = rt
	}
	rt.offload = o
}

// OffloadForward runs f (a model's forward) with the saved tensors offloaded, as `with OffloadActivations():`
// does; without SetActivationOffload it only runs f.
func (rt *Runtime) OffloadForward(f func()) {
	o := rt.offload
	if o == nil {
		f()
		return
	}
	o.packing = true
	defer func() { o.packing = false }()
	f()
}

// enterScope stops packing when the forward reaches the output head.
func (o *ActivationOffload) enterScope(path string) {
	if path == o.Head {
		o.packing = false
	}
}

// pack is the pack hook for t, saved by n as slot: it returns the saved reference, or nil when t stays on
// the device (the caller saves it as usual).
func (o *ActivationOffload) pack(n *Node, slot string, t *Tensor) *Tensor {
	o.lastID++
	id := o.lastID
	bytes := t.Numel() * t.dtype.Size()
	if bytes < o.MinBytes || t.isParameter() || t.st.freed || t.st.managed {
		return nil
	}
	if o.Streams { // sync back and drop the tensors offloaded long enough ago
		for len(o.fwd) > 0 && o.fwd[0].id <= id-o.MaxStash {
			o.fwd[0].t.Release()
			o.fwd = o.fwd[1:]
		}
	}
	if t.st.category == snapshot.CategoryTemporary {
		t.st.setCategory(snapshot.CategoryActivation)
	}
	var host *Tensor
	o.Host.Pinned(func() { host = o.Host.empty(t.dtype, t.shape, "offload."+slot, snapshot.CategoryActivation) })
	if t.rt.dev.Computes() {
		Copy_(host, t)
	}
	strides := contiguousStrides(t.shape)
	if dense(t.shape, t.strides) { // empty_like keeps a dense layout
		strides = slices.Clone(t.strides)
	}
	st := &storage{rt: o.rt, bytes: uint64(bytes), category: snapshot.CategoryActivation, dtype: t.dtype, shape: t.shape,
		role: "offloaded " + slot, freed: true,
		offload: &offloaded{id: id, host: host, shape: t.shape, strides: t.strides, offset: t.offset}}
	s := o.rt.newObject(st, t.dtype, slices.Clone(t.shape), strides, 0)
	s.requiresGrad = t.requiresGrad
	s.owner = owner{node: n, slot: slot}
	n.saved = append(n.saved, s)
	if o.Streams { // the stash keeps the device tensor alive until the copy is done
		o.fwd = append(o.fwd, stashed{id, t.Detach().SetName(fmt.Sprintf("offload.fwd_stash[%d]", id))})
	}
	return s
}

// unpack brings back what n saved to host memory, before n runs.
func (o *ActivationOffload) unpack(n *Node) {
	for _, s := range n.saved {
		if s == nil || s.st.offload == nil || s.st.offload.unpacked {
			continue
		}
		rec := s.st.offload
		rec.unpacked = true
		if !o.Streams {
			o.bringBack(s, 0)
			rec.releaseHost()
			s.st.offload = nil
			continue
		}
		if o.node != n { // a new node: the previous one's tensors go once this one has run
			o.node = n
			o.prev = o.prev[:0]
			for _, b := range o.bwd {
				o.prev = append(o.prev, b.id)
			}
		}
		if i := slices.IndexFunc(o.fwd, func(e stashed) bool { return e.id == rec.id }); i >= 0 {
			o.reattach(s, o.fwd[i].t)
		} else {
			o.bringBack(s, copyStream)
			o.bwd = append(o.bwd, stashed{rec.id, s.Ref().SetName(fmt.Sprintf("offload.bwd_stash[%d]", rec.id))})
			o.brought = append(o.brought, broughtBack{rec.id, s.st, s.st.refs})
		}
		rec.releaseHost() // del self.tracker[id]
		s.st.offload = nil
	}
}

// bringBack allocates s's device memory on stream and copies the host copy into it.
func (o *ActivationOffload) bringBack(s *Tensor, stream int64) {
	st, rec := s.st, s.st.offload
	o.rt.OnStream(stream, func() { st.addr = o.rt.allocate(st) })
	st.freed = false
	if o.rt.dev.Computes() {
		st.data = make([]float32, st.bytes/uint64(s.dtype.Size()))
		scatter(s.object, rec.host.host())
	}
}

// reattach makes s the device tensor the forward stash still holds, in its layout.
func (o *ActivationOffload) reattach(s, gpu *Tensor) {
	placeholder, rec := s.st, s.st.offload
	gpu.st.refs++
	s.object.st, s.object.offset = gpu.st, rec.offset
	s.object.shape, s.object.strides = slices.Clone(rec.shape), slices.Clone(rec.strides)
	placeholder.offload = nil
	placeholder.release()
}

// afterNode is the hook unpack registered on n: what n brought back waits in the backward stash (or, when n
// made a view of it, is freed with record_stream on the compute stream), the forward stash empties, and the
// previous node's tensors are freed.
func (o *ActivationOffload) afterNode(n *Node) {
	if !o.Streams || o.node != n {
		return
	}
	for _, b := range o.brought {
		if b.st.refs > b.refs { // a view of it outlives the node
			if err := o.rt.dev.RecordStream(b.st.addr, 0); err != nil {
				panic(fmt.Sprintf("tensor: %v", err))
			}
			o.dropBackward(b.id)
		}
	}
	o.brought = o.brought[:0]
	for _, e := range o.fwd {
		e.t.Release()
	}
	o.fwd = o.fwd[:0]
	for _, id := range o.prev {
		o.dropBackward(id)
	}
	o.prev = o.prev[:0]
}

func (o *ActivationOffload) dropBackward(id int) {
	if i := slices.IndexFunc(o.bwd, func(e stashed) bool { return e.id == id }); i >= 0 {
		o.bwd[i].t.Release()
		o.bwd = slices.Delete(o.bwd, i, i+1)
	}
}

// endBackward is the callback queued at the end of backward: the backward stash is freed.
func (o *ActivationOffload) endBackward() {
	for _, e := range o.bwd {
		e.t.Release()
	}
	o.bwd, o.node, o.prev = o.bwd[:0], nil, o.prev[:0]
}

// releaseHost frees the host copy of an offloaded storage that goes without having been brought back (a
// graph dropped before backward).
func (rec *offloaded) releaseHost() {
	if rec.host != nil {
		rec.host.Release()
		rec.host = nil
	}
}

// isParameter reports whether t is a parameter itself (torchtune offloads anything else saved, a view of a
// parameter included): a named leaf of a parameter's storage.
func (t *Tensor) isParameter() bool {
	return t.object.name != "" && t.gradFn == nil && t.st.category == snapshot.CategoryParameter
}

// dense reports whether strides lay shape out without gaps or overlap, in some order of its dimensions.
func dense(shape, strides []int) bool {
	idx := make([]int, 0, len(shape))
	for i, d := range shape {
		if d != 1 {
			idx = append(idx, i)
		}
	}
	slices.SortFunc(idx, func(a, b int) int { return strides[a] - strides[b] })
	want := 1
	for _, i := range idx {
		if strides[i] != want {
			return false
		}
		want *= shape[i]
	}
	return true
}
