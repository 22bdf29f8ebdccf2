package dist

import (
	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/workloads/device"
)

// How a rank's strategy uses CUDA streams: each implementation makes its own side streams (FSDP's unshard,
// pre_unshard and post_backward streams, ProcessGroupNCCL's, DeepSpeed's all-gather stream), allocates on
// them, orders them against the default stream with waits and marks the tensors one stream makes and
// another uses (record_stream). The device's model says when each stream's work has run
// (device.Streams). Under Settings.OneStream every side stream is the default one, where waits and
// record_stream do nothing.

// newStream makes a side stream named name, or returns the default stream when streams are off.
func (b *base) newStream(name string) int64 {
	s := b.rt.Device().Streams()
	if b.s.OneStream || s == nil {
		return device.DefaultStream
	}
	return s.NewStream(name)
}

// waitStream is stream.wait_stream(on).
func (b *base) waitStream(stream, on int64) {
	if s := b.rt.Device().Streams(); s != nil {
		s.WaitStream(stream, on)
	}
}

// recordEvent is torch.cuda.Event().record(stream).
func (b *base) recordEvent(stream int64) allocator.Event {
	if s := b.rt.Device().Streams(); s != nil {
		return s.RecordEvent(stream)
	}
	return allocator.Event{Stream: stream}
}

// synchronizeEvent is Event.synchronize(): the host waits for the event.
func (b *base) synchronizeEvent(e allocator.Event) {
	if s := b.rt.Device().Streams(); s != nil {
		s.SynchronizeEvent(e)
	}
}

// launch says a collective or a copy runs on stream.
func (b *base) launch(stream int64) {
	if s := b.rt.Device().Streams(); s != nil {
		s.Launch(stream)
	}
}

// current is torch.cuda.current_stream().
func (b *base) current() int64 { return b.rt.Stream() }

// waitEvent is stream.wait_event(e).
func (b *base) waitEvent(stream int64, e allocator.Event) {
	if s := b.rt.Device().Streams(); s != nil {
		s.WaitEvent(stream, e)
	}
}
