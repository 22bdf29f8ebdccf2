package device

import (
	"fmt"

	"github.com/oomdbg/oomdbg/allocator"
)

// DefaultStream is the raw handle of the default (legacy) stream, where the model computes.
const DefaultStream int64 = 0

// Streams is the progress of a device's CUDA streams, as the simulated runtime models it. It is what tells
// the caching allocator whether the work a freed block was used for has run (allocator.Streams).
//
// The host issues work in program order; each stream runs its work in the order issued, and after the
// points it was told to wait for (cudaStreamWaitEvent, Stream.wait_stream). No kernel has a duration; the
// model is the regime where training's memory is highest and most often measured, a GPU-bound job:
//
//   - The default stream computes, and the host runs ahead of it: its work has run only as far as the host
//     has waited for it (an event's or a stream's synchronize, a tensor's .item(), the allocator's
//     synchronize_and_free_events), and, through the waits, whatever that work waited for.
//   - Every other stream (communication, copies) runs as soon as what it waits for has run: its work takes
//     no time beside the default stream's.
//
// So a block freed on a side stream's behalf after record_stream on the default stream stays pending until
// the host next waits for the default stream past the free; a block of the default stream recorded on a side
// stream, until the host waits past the point that side stream waited for. Work is what the runtime
// allocates on a stream (an op that makes an output launches a kernel) or says it launches (Launch): an
// event recorded on a stream with nothing issued since the point known to have run has run.
type Streams struct {
	queues map[int64]*streamQueue
	names  map[int64]string
	order  []int64 // streams by creation, default first
	made   int64   // streams NewStream made

	lastStream int64 // the stream queue last returned
	lastQueue  *streamQueue
}

// streamQueue is one stream's issued work and waits, from the first not known to have run.
type streamQueue struct {
	items []streamItem
	base  uint64 // the absolute index of items[0]
	done  uint64 // items before this absolute index have run
	open  bool   // the last item is work with no event recorded after it: more work joins it
}

// streamItem is work (a run of kernels between two events) or a wait for another stream's event.
type streamItem struct {
	wait bool
	on   allocator.Event
}

// NewStreams returns the streams of a device: the default stream alone.
func NewStreams() *Streams {
	s := &Streams{queues: map[int64]*streamQueue{}, names: map[int64]string{}}
	s.queues[DefaultStream] = &streamQueue{}
	s.names[DefaultStream] = "default"
	s.order = []int64{DefaultStream}
	return s
}

// firstSideStream is the raw handle of the first stream NewStream makes. PyTorch's handles are pointers;
// these are small numbers, distinct and in creation order, which is what a snapshot needs of them.
const firstSideStream = 1

// NewStream makes a stream (torch.cuda.Stream()) named name, for what reads the recording, and returns its
// handle.
func (s *Streams) NewStream(name string) int64 {
	h := firstSideStream + s.made
	s.made++
	s.queues[h] = &streamQueue{}
	s.names[h] = name
	s.order = append(s.order, h)
	return h
}

// Name returns the name a stream was made with ("default" for the default stream), or its handle.
func (s *Streams) Name(stream int64) string {
	if n, ok := s.names[stream]; ok {
		return n
	}
	return fmt.Sprintf("stream %d", stream)
}

// Names returns every stream's name by handle.
func (s *Streams) Names() map[int64]string {
	out := make(map[int64]string, len(s.names))
	for h, n := range s.names {
		out[h] = n
	}
	return out
}

func (s *Streams) queue(stream int64) *streamQueue {
	if stream == s.lastStream && s.lastQueue != nil { // every allocation asks: keep the map off the hot path
		return s.lastQueue
	}
	q, ok := s.queues[stream]
	if !ok { // a handle the runtime did not make (a recorded stream): a side stream
		q = &streamQueue{}
		s.queues[stream] = q
		s.order = append(s.order, stream)
	}
	s.lastStream, s.lastQueue = stream, q
	return q
}

// paces reports whether stream's work runs only as far as the host waits for it.
func paces(stream int64) bool { return stream == DefaultStream }

// Launch says work is queued on stream: a kernel, a collective, a copy.
func (s *Streams) Launch(stream int64) {
	q := s.queue(stream)
	if q.open && q.done < q.base+uint64(len(q.items)) { // more of the work not yet run
		return
	}
	q.items = append(q.items, streamItem{})
	q.open = true
}

// RecordEvent is cudaEventRecord: a mark after the work queued on stream so far.
func (s *Streams) RecordEvent(stream int64) allocator.Event {
	q := s.queue(stream)
	q.open = false
	return allocator.Event{Stream: stream, Seq: q.base + uint64(len(q.items))}
}

// WaitEvent is cudaStreamWaitEvent: the work stream is given from now runs after e's.
func (s *Streams) WaitEvent(stream int64, e allocator.Event) {
	if e.Stream == stream {
		return
	}
	q := s.queue(stream)
	q.items = append(q.items, streamItem{wait: true, on: e})
	q.open = false
}

// WaitStream is Stream.wait_stream: the work stream is given from now runs after everything queued on on
// so far.
func (s *Streams) WaitStream(stream, on int64) {
	if stream == on {
		return
	}
	s.WaitEvent(stream, s.RecordEvent(on))
}

// EventDone is cudaEventQuery: whether everything queued before e has run.
func (s *Streams) EventDone(e allocator.Event) bool {
	q := s.queue(e.Stream)
	if q.done >= e.Seq {
		return true
	}
	s.run(e.Stream, e.Seq, false)
	return q.done >= e.Seq
}

// SynchronizeEvent is cudaEventSynchronize: the host waits until everything queued before e has run.
func (s *Streams) SynchronizeEvent(e allocator.Event) { s.run(e.Stream, e.Seq, true) }

// SynchronizeStream is cudaStreamSynchronize (and what .item() waits for): the host waits for everything
// queued on stream.
func (s *Streams) SynchronizeStream(stream int64) { s.SynchronizeEvent(s.RecordEvent(stream)) }

// Synchronize is torch.cuda.synchronize(): the host waits for every stream.
func (s *Streams) Synchronize() {
	for _, h := range s.order {
		s.SynchronizeStream(h)
	}
}

// run runs stream's items up to the absolute index to, as far as they can: work of the default stream only
// when the host waits (wait), a wait once what it waits for has run (made to run when the host waits).
func (s *Streams) run(stream int64, to uint64, wait bool) {
	q := s.queue(stream)
	to = min(to, q.base+uint64(len(q.items)))
	for q.done < to {
		it := q.items[q.done-q.base]
		switch {
		case it.wait && wait:
			s.run(it.on.Stream, it.on.Seq, true)
		case it.wait:
			if !s.EventDone(it.on) {
				return
			}
		case paces(stream) && !wait:
			return
		}
		q.done++
	}
	if n := q.done - q.base; n > 32 && n > uint64(len(q.items))/2 { // drop what has run
		q.items = q.items[:copy(q.items, q.items[n:])]
		q.base = q.done
	}
}
