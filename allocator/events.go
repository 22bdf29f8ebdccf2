package allocator

import (
	"fmt"
	"slices"
)

// Event is a CUDA event as a Streams hands it out: a mark in one stream's queue of work.
type Event struct {
	Stream int64
	Seq    uint64 // the mark's place in its stream, for the Streams that made it
}

// Streams tells the allocator how far the work queued on each stream has run, as CUDA events tell
// PyTorch's. The allocator records an event on every stream that used a freed block (insert_events), asks
// whether it has completed before each request (process_events), and waits for all of them before it
// releases memory (synchronize_and_free_events). Its calls are made with the allocator's lock held, so a
// Streams must not call back into the allocator.
type Streams interface {
	// RecordEvent is cudaEventRecord: a mark after the work queued on stream so far.
	RecordEvent(stream int64) Event
	// EventDone is cudaEventQuery: whether the stream has run everything queued before the mark.
	EventDone(e Event) bool
	// SynchronizeEvent is cudaEventSynchronize: the host waits until the mark is reached.
	SynchronizeEvent(e Event)
}

// immediate is the Streams of an allocator given none: every event has completed by the time anything
// asks, as if the other streams' work always finished before the program asked for memory again.
type immediate struct{}

func (immediate) RecordEvent(stream int64) Event { return Event{Stream: stream} }
func (immediate) EventDone(Event) bool           { return true }
func (immediate) SynchronizeEvent(Event)         {}

// SetStreams sets what says how far each stream's work has run; nil (the default) takes every event to
// have completed by the next request. Set it before the first Free of a block used on another stream:
// the events already recorded keep the Streams that made them.
func (a *Allocator) SetStreams(s Streams) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s == nil {
		s = immediate{}
	}
	a.streams = s
}

// streamEvents is one stream's outstanding events, oldest first: cuda_events[stream].
type streamEvents struct {
	stream int64
	queue  []pendingEvent
	head   int // events before head have completed
}

// pendingEvent is an event recorded on a stream when a block used there was freed.
type pendingEvent struct {
	ev    Event
	block *block
}

// RecordStream marks the allocated block at addr as used on stream (Tensor.record_stream), so that freeing
// it waits for the work queued on that stream by then. Uses on the block's own stream are ignored: work
// there is ordered after the free anyway.
func (a *Allocator) RecordStream(addr uint64, stream int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.live[addr]
	if !ok {
		return fmt.Errorf("record_stream: no allocated block at %#x", addr)
	}
	if stream == b.stream || slices.Contains(b.streamUses, stream) {
		return nil
	}
	b.streamUses = append(b.streamUses, stream)
	return nil
}

// ProcessEvents caches the blocks whose cross-stream events have completed, as every request does first
// (process_events): each stream's events are queried oldest first, up to the first that has not completed.
// It does not wait for anything.
func (a *Allocator) ProcessEvents() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.processEvents()
}

// Synchronize waits for every outstanding cross-stream event and caches the blocks that were waiting
// (synchronize_and_free_events, which counts in num_sync_all_streams).
func (a *Allocator) Synchronize() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.synchronizeAndFreeEvents()
}

// PendingFrees returns the number of blocks freed and waiting on events of other streams.
func (a *Allocator) PendingFrees() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pendingBlocks())
}

// insertEvents is insert_events: one event recorded on each stream that used b; b stays active until
// they complete. Streams are taken in ascending order so that runs are reproducible (PyTorch iterates a
// hash set).
func (a *Allocator) insertEvents(b *block) {
	slices.SortFunc(b.streamUses, streamCmp)
	for _, s := range b.streamUses {
		b.eventCount++
		q := a.eventQueue(s)
		q.queue = append(q.queue, pendingEvent{ev: a.streams.RecordEvent(s), block: b})
	}
	b.streamUses = b.streamUses[:0]
}

// eventQueue returns stream's queue of events, making it when there is none. Queues are kept in ascending
// stream order, the order process_events walks them in here (PyTorch's is a hash map's).
func (a *Allocator) eventQueue(stream int64) *streamEvents {
	i, ok := slices.BinarySearchFunc(a.events, stream, func(q *streamEvents, s int64) int { return streamCmp(q.stream, s) })
	if !ok {
		a.events = slices.Insert(a.events, i, &streamEvents{stream: stream})
	}
	return a.events[i]
}

// processEvents is process_events: each stream's events, oldest first, until one has not completed; a
// block is cached when its last event completes. Streams whose queues empty are forgotten.
func (a *Allocator) processEvents() {
	a.drainEvents(func(e Event) bool { return a.streams.EventDone(e) })
}

// synchronizeAndFreeEvents is synchronize_and_free_events: it waits on every outstanding event, in the
// order process_events walks them, and caches the blocks that were waiting.
func (a *Allocator) synchronizeAndFreeEvents() {
	a.stats.NumSyncAllStreams++
	a.drainEvents(func(e Event) bool {
		a.streams.SynchronizeEvent(e)
		return true
	})
}

// drainEvents completes each stream's events, oldest first, while done says they have.
func (a *Allocator) drainEvents(done func(Event) bool) {
	if len(a.events) == 0 {
		return
	}
	keep := a.events[:0]
	for _, q := range a.events {
		for q.head < len(q.queue) && done(q.queue[q.head].ev) {
			b := q.queue[q.head].block
			q.queue[q.head] = pendingEvent{}
			q.head++
			b.eventCount--
			if b.eventCount == 0 {
				a.freeBlock(b)
			}
		}
		if q.head == len(q.queue) {
			continue
		}
		if q.head > len(q.queue)/2 { // bound the queue: drop what has completed
			q.queue = q.queue[:copy(q.queue, q.queue[q.head:])]
			q.head = 0
		}
		keep = append(keep, q)
	}
	clear(a.events[len(keep):])
	a.events = keep
}

// pendingBlocks returns every block that waits on events, once each, in the order of the queues.
func (a *Allocator) pendingBlocks() []*block {
	var out []*block
	seen := map[*block]bool{}
	for _, q := range a.events {
		for _, e := range q.queue[q.head:] {
			if !seen[e.block] {
				seen[e.block] = true
				out = append(out, e.block)
			}
		}
	}
	return out
}
