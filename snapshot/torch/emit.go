package torch

import (
	"cmp"
	"container/heap"
	"math"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/oomdbg/oomdbg/snapshot"
)

// emitter writes the events in order, inferring phases and iterations as it goes.
type emitter struct {
	im     *importer
	events []snapshot.Event
	err    error // the budget ran out: no more events
	t0     int64 // time_us of the first entry: Event.Time counts from it

	iteration int32
	inferred  snapshot.Phase // from the stacks of the latest allocations
	phase     snapshot.Phase // the phase of the events being written
	regions   []region       // record_function regions that set the phase (Optimizer.step#...)
	stacks    []stackFacts   // by StackID
}

// region is an open record_function region that names a phase.
type region struct {
	name  string
	phase snapshot.Phase
}

func (em *emitter) add(e snapshot.Event) {
	if len(em.events) == cap(em.events) && em.reserve(2*cap(em.events)) != nil {
		return
	}
	em.events = append(em.events, e)
	em.events[len(em.events)-1].Seq = uint64(len(em.events) - 1)
}

// eventBytes is the size of an event in memory.
const eventBytes = int64(unsafe.Sizeof(snapshot.Event{}))

// reserve makes room for n events, counted in the budget; the old slice, if any, is alive while it is copied.
func (em *emitter) reserve(n int) error {
	if em.err == nil {
		em.err = em.im.mem.add(int64(n)*eventBytes, "building the events")
	}
	if em.err != nil {
		return em.err
	}
	old := cap(em.events)
	em.events = append(make([]snapshot.Event, 0, n), em.events...)
	em.im.mem.release(int64(old) * eventBytes)
	return nil
}

// setPhase writes a phase marker when the phase the next events carry changes.
func (em *emitter) setPhase(t int64, dev int16) {
	p := em.inferred
	if n := len(em.regions); n > 0 {
		p = em.regions[n-1].phase
	}
	if rp, ok := em.recordedPhase(); ok {
		p = rp
	}
	if p != em.phase {
		em.phase = p
		em.add(snapshot.Event{Time: t, Action: snapshot.ActionPhase, Device: dev, Phase: p, Iteration: em.iteration})
	}
}

// trace writes the trace entries of every device and the annotations: merged by time_us when every entry
// has one, else device after device in recorded order with Event.Time the entry's index (from 1).
func (em *emitter) trace() {
	im := em.im
	annots := im.annots
	slices.SortStableFunc(annots, func(a, b annotation) int { return cmp.Compare(a.time, b.time) })
	if im.timeKnown {
		em.t0 = math.MaxInt64
		for _, t := range im.traces {
			if len(t) > 0 {
				em.t0 = min(em.t0, t[0].time)
			}
		}
		if len(annots) > 0 {
			em.t0 = min(em.t0, annots[0].time)
		}
	}
	// The next entry is the earliest by time over all devices (device order breaks ties), kept in a heap of
	// each device's next entry; time_us that steps back on a device is held at the device's latest. Without
	// times, devices follow each other in order.
	var next devHeap
	cursor := make([]int, len(im.traces))
	for d, tr := range im.traces {
		if len(tr) > 0 {
			t := int64(0)
			if im.timeKnown {
				t = tr[0].time
			}
			next = append(next, devKey{t, d})
		}
	}
	heap.Init(&next)
	ai := 0
	index := int64(0)
	for em.err == nil {
		dev, t := -1, int64(0)
		if len(next) > 0 {
			dev, t = next[0].dev, next[0].time
		}
		// Annotations go before entries of their time (after, for an END), and after all entries when the
		// entries have no time.
		if ai < len(annots) && (dev < 0 || im.timeKnown && (annots[ai].time < t || annots[ai].time == t && annots[ai].start)) {
			a := annots[ai]
			ai++
			at := em.nanos(a.time)
			if !im.timeKnown {
				at = index
			}
			em.annotation(a, at)
			continue
		}
		if dev < 0 {
			for d := range im.traces {
				em.applyRecorded(d, len(im.traces[d]), em.nanos(math.MaxInt64))
			}
			return
		}
		tr := im.traces[dev]
		at := cursor[dev]
		e := &tr[at]
		cursor[dev]++
		if cursor[dev] < len(tr) {
			nt := t
			if im.timeKnown {
				nt = max(tr[cursor[dev]].time, t)
			}
			next[0].time = nt
			heap.Fix(&next, 0)
		} else {
			heap.Pop(&next)
		}
		index++
		et := index
		if im.timeKnown {
			et = em.nanos(t)
		}
		em.applyRecorded(dev, at, et)
		em.entry(e, int16(dev), et)
		if e.act == snapshot.ActionAlloc && im.rec != nil {
			last := &em.events[len(em.events)-1]
			last.Label = im.recordedLabel(dev, at)
			if last.Scope == 0 {
				last.Scope = em.recordedScope()
			}
		}
	}
}

// devKey is a device's next trace entry in the merge: its time, then the device ordinal.
type devKey struct {
	time int64
	dev  int
}

// devHeap is a min-heap of devKeys (container/heap).
type devHeap []devKey

func (h devHeap) Len() int { return len(h) }

func (h devHeap) Less(i, j int) bool {
	return h[i].time < h[j].time || h[i].time == h[j].time && h[i].dev < h[j].dev
}

func (h devHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

func (h *devHeap) Push(x any) { *h = append(*h, x.(devKey)) }

func (h *devHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// nanos converts time_us to nanoseconds since the first entry, saturating on absurd values.
func (em *emitter) nanos(us int64) int64 {
	if us <= em.t0 {
		return 0
	}
	d := uint64(us) - uint64(em.t0) // exact: the difference of two int64s fits a uint64
	if d > math.MaxInt64/1000 {
		return math.MaxInt64 / 1000 * 1000
	}
	return int64(d) * 1000
}

// entry writes one trace entry.
func (em *emitter) entry(e *entry, dev int16, t int64) {
	switch e.act {
	case snapshot.ActionAlloc, snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap, snapshot.ActionOOM:
		// Allocation stacks tell the phase; a free's stack is often its allocation's, so it does not.
		if p, ok := em.stacks[e.stack].phase.phase(); ok {
			em.inferred = p
		}
		em.setPhase(t, dev)
	}
	ev := snapshot.Event{Time: t, Action: e.act, Device: dev, Stream: e.stream, Addr: e.addr, Size: e.size,
		BlockSize: e.block, Stack: e.stack, Scope: e.scope, Category: e.cat, Text: e.text,
		Phase: em.phase, Iteration: em.iteration}
	if e.act == snapshot.ActionOOM {
		ev.DeviceFree = e.extra
	}
	em.add(ev)
}

// annotation writes a record_function region boundary: ProfilerStep#N starts iteration N, Optimizer.step#...
// and Optimizer.zero_grad#... are the optimizer and zero_grad phases, and every other name is an annotation
// whose Label is the stage, "START" or "END".
func (em *emitter) annotation(a annotation, t int64) {
	if n, ok := strings.CutPrefix(a.name, "ProfilerStep#"); ok && !em.recordedIterations() {
		if it, err := strconv.ParseInt(n, 10, 32); err == nil && it >= 0 {
			if a.start {
				em.iteration = int32(it)
				em.add(snapshot.Event{Time: t, Action: snapshot.ActionIteration, Device: a.device, Phase: em.phase, Iteration: em.iteration})
				em.inferred, em.regions = snapshot.PhaseNone, em.regions[:0]
				em.setPhase(t, a.device)
			}
			return
		}
	}
	phase, named := snapshot.PhaseNone, false
	switch {
	case strings.HasPrefix(a.name, "Optimizer.step#"):
		phase, named = snapshot.PhaseOptimizer, true
	case strings.HasPrefix(a.name, "Optimizer.zero_grad#"):
		phase, named = snapshot.PhaseZeroGrad, true
	}
	if named {
		if a.start {
			em.regions = append(em.regions, region{a.name, phase})
		} else {
			for i := len(em.regions) - 1; i >= 0; i-- {
				if em.regions[i].name == a.name {
					em.regions = slices.Delete(em.regions, i, i+1)
					break
				}
			}
			em.inferred = snapshot.PhaseNone // the step is over; the next allocations say what comes
		}
		em.setPhase(t, a.device)
		return
	}
	stage := "END"
	if a.start {
		stage = "START"
	}
	em.add(snapshot.Event{Time: t, Action: snapshot.ActionAnnotation, Device: a.device, Text: em.im.tab.str(a.name),
		Label: em.im.tab.str(stage), Phase: em.phase, Iteration: em.iteration})
}
