package tensor

// Streams, as the runtime's ops see them: each op allocates its outputs and runs its kernel on the current
// stream (torch.cuda.current_stream()); a side stream is made current for a while (with
// torch.cuda.stream(s)), and a tensor made on one stream and used on another is marked so that the caching
// allocator does not hand its memory out again before that stream's work is done (Tensor.record_stream).
// How far each stream's work has run is the device's model (device.Streams).

// Stream returns the current stream: where new allocations and kernels go.
func (rt *Runtime) Stream() int64 { return rt.stream }

// OnStream runs f with stream current, as `with torch.cuda.stream(stream):` does.
func (rt *Runtime) OnStream(stream int64, f func()) {
	prev := rt.stream
	rt.stream = stream
	defer func() { rt.stream = prev }()
	f()
}

// RecordStream marks the tensor's memory as used on stream (Tensor.record_stream): when its storage is
// freed, the allocator waits for the work queued on stream by then before it reuses the memory. A tensor
// without device memory (freed, empty, or in host memory) has nothing to mark.
func (t *Tensor) RecordStream(stream int64) {
	t.check()
	st := t.st
	a := st.rt.dev.Allocator()
	if st.freed || st.bytes == 0 || st.managed || a == nil {
		return
	}
	if err := a.RecordStream(st.addr, stream); err != nil {
		panic("tensor: " + err.Error()) // the storage is live: its block is allocated
	}
}
