package replay

import (
	"fmt"
	"math"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
)

// deferredFrees replays the frees a recording deferred because the block was used on other streams
// (record_stream): PyTorch writes free_requested at the free, and free_completed only when the events it
// recorded on those streams complete, at a later request (process_events) or when it synchronizes
// (empty_cache). The trace does not name the streams that used the block, so each such block is marked
// used on a stream of its own, whose event completes where the recording has the block's free_completed.
//
// A free is known to be deferred at the event after its free_requested: PyTorch writes free_completed
// right after free_requested unless it records events. So the replay frees the block there, before that
// event, which is what PyTorch had done by then.
type deferredFrees struct {
	streams traceStreams
	pending map[uint64]allocator.Event // recorded address -> the event its pending block waits on
	last    uint64                     // the recorded address of the free_requested just seen, or 0
	uses    int64                      // streams handed out so far
}

func newDeferredFrees(a *allocator.Allocator) *deferredFrees {
	d := &deferredFrees{streams: traceStreams{done: map[allocator.Event]bool{}}, pending: map[uint64]allocator.Event{}}
	a.SetStreams(&d.streams)
	return d
}

// next handles a recorded event, of action at addr, before it is replayed. live maps the recording's blocks
// to the model's; a block whose free turns out to be deferred leaves it.
func (d *deferredFrees) next(a *allocator.Allocator, action snapshot.Action, addr uint64, live map[uint64]uint64) error {
	if last := d.last; last != 0 {
		d.last = 0
		if action != snapshot.ActionFreeCompleted || addr != last {
			if err := d.free(a, last, live); err != nil {
				return err
			}
		}
	}
	if action == snapshot.ActionFreeRequested {
		if _, ok := live[addr]; ok {
			d.last = addr
		}
	}
	return nil
}

// end is next at the end of the trace: a free_requested last in the trace was deferred.
func (d *deferredFrees) end(a *allocator.Allocator, live map[uint64]uint64) error {
	return d.next(a, snapshot.ActionAlloc, 0, live)
}

// free frees the block recorded at addr as used on a stream of its own, so that it waits for that stream.
func (d *deferredFrees) free(a *allocator.Allocator, addr uint64, live map[uint64]uint64) error {
	maddr := live[addr]
	delete(live, addr)
	d.uses++
	use := math.MinInt64 + d.uses // far from every real stream handle
	if err := a.RecordStream(maddr, use); err != nil {
		return err
	}
	d.streams.last = allocator.Event{}
	if err := a.Free(maddr); err != nil {
		return fmt.Errorf("free of %#x: %w", addr, err)
	}
	d.pending[addr] = d.streams.last
	return nil
}

// completed handles a recorded free_completed: if it ends a deferred free, the block's event completes and
// the allocator caches it, and completed reports true.
func (d *deferredFrees) completed(a *allocator.Allocator, addr uint64) bool {
	ev, ok := d.pending[addr]
	if !ok {
		return false
	}
	delete(d.pending, addr)
	d.streams.done[ev] = true
	a.ProcessEvents()
	delete(d.streams.done, ev)
	return true
}

// traceStreams is the allocator.Streams of a replay: an event completes when the replay says so, or when
// the allocator waits for it (empty_cache, which PyTorch's recording shows as a free_completed first).
type traceStreams struct {
	next uint64
	last allocator.Event // the event recorded last
	done map[allocator.Event]bool
}

func (s *traceStreams) RecordEvent(stream int64) allocator.Event {
	s.next++
	s.last = allocator.Event{Stream: stream, Seq: s.next}
	return s.last
}

func (s *traceStreams) EventDone(e allocator.Event) bool { return s.done[e] }

func (s *traceStreams) SynchronizeEvent(allocator.Event) {}
