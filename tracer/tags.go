package tracer

import "github.com/oomdbg/oomdbg/snapshot"

// The runtime's tags. The training loop, modules, tensors and autograd call these as things happen.

// SetPhase records that phase p of the current iteration begins.
func (r *Recorder) SetPhase(p snapshot.Phase) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phase = p
	r.emit(r.begin(snapshot.ActionPhase, 0, 0))
}

// BeginIteration records that training iteration i begins.
func (r *Recorder) BeginIteration(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.iteration = int32(i)
	r.emit(r.begin(snapshot.ActionIteration, 0, 0))
}

// PushScope enters a module: allocations until the matching PopScope carry path (e.g. "blocks.3.attn.qkv").
func (r *Recorder) PushScope(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.scopes = append(r.scopes, r.sink.InternString(path))
}

// PopScope leaves the innermost module entered with PushScope.
func (r *Recorder) PopScope() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.scopes); n > 0 {
		r.scopes = r.scopes[:n-1]
	}
}

// TagNextAlloc says what the next allocation holds: its category and a tensor label such as
// "bf16[8,1024,2048] qkv.out". The tags apply to that one allocation (or the OOM that replaces it).
func (r *Recorder) TagNextAlloc(c snapshot.Category, label string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next = nextAlloc{category: c, label: r.sink.InternString(label)}
}

// SetCategory records that the live block at addr now holds something else, e.g. a temporary that autograd
// saved, which became an activation. An empty label keeps the block's label.
func (r *Recorder) SetCategory(device int, addr uint64, c snapshot.Category, label string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.begin(snapshot.ActionCategory, device, 0)
	e.Addr, e.Category, e.Label = addr, c, r.sink.InternString(label)
	r.emit(e)
}

// Annotate records user text at this point of the run.
func (r *Recorder) Annotate(text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.begin(snapshot.ActionAnnotation, 0, 0)
	e.Text = r.sink.InternString(text)
	r.emit(e)
}

// Retainer is one edge of the heap graph at a heap dump: Holder (described by Description, e.g.
// "AddmmBackward[blocks.3.mlp.fc] saved input" or "loss_history[7]") is held by Parent (0: a root) and, when
// Addr is not 0, holds the block at Addr on Device.
type Retainer struct {
	Holder      uint64
	Parent      uint64
	Description string
	Device      int
	Addr        uint64
}

// HeapDump records who holds each live tensor, as one uninterrupted run of events: a heap_dump marker saying
// why (e.g. "iteration end", "oom"), then one retain event per edge.
func (r *Recorder) HeapDump(reason string, edges []Retainer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.begin(snapshot.ActionHeapDump, 0, 0)
	e.Text = r.sink.InternString(reason)
	r.emit(e)
	for _, edge := range edges {
		e := r.begin(snapshot.ActionRetain, edge.Device, 0)
		e.Holder, e.Parent, e.Addr = edge.Holder, edge.Parent, edge.Addr
		e.Text = r.sink.InternString(edge.Description)
		r.emit(e)
	}
}

// Sample records a device reading, e.g. source "nvml.used" and the bytes the driver reports in use.
func (r *Recorder) Sample(device int, source string, bytes int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.begin(snapshot.ActionSample, device, 0)
	e.Size, e.Text = bytes, r.sink.InternString(source)
	r.emit(e)
}
