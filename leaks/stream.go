package leaks

import (
	"maps"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// Stream finds leaks in a run indexed page by page (timeline.Scan), without holding the run: it keeps, for
// each iteration, where it ends and the memory then; the bytes of each group of blocks at the iteration ends
// it may measure (the first ones, for a warm-up, and the last 258); each optimizer step and the gradients
// left from the step before as it begins; and the pages from the one before the
// second to last iteration end on, for the live set and the retainers there. Its Result is Analyze's on the
// whole run.
type Stream struct {
	cfg     config
	spans   []timeline.IterationSpan // every iteration's span, setup included, pieced together across pages
	ends    []iterationEnd           // the end of each span but the last (which may go on)
	ooms    []int
	dumps   []timeline.HeapDump // every heap dump, its edges counted across pages
	markers int
	peak    int64
	steps   stepper              // every optimizer step, each measured for gradients never cleared as it begins
	kept    []*timeline.Timeline // the last pages; the last is the tail
}

// iterationEnd is memory after an iteration's last event.
type iterationEnd struct {
	seq                 int
	allocated, reserved int64
	groups              map[groupKey]groupSum // nil where the analysis cannot measure
	page                *timeline.Timeline    // the page holding it, for the last two ends
}

// NewStream returns a Stream that analyzes with opts.
func NewStream(opts ...Option) *Stream { return &Stream{cfg: newConfig(opts)} }

// Observe takes the next page: a Timeline of the events after those of the pages before, resumed from the
// State the previous page ended in.
func (st *Stream) Observe(tl *timeline.Timeline) {
	// A heap dump the page before ended in goes on with the retain events this page starts with.
	if n, tail := len(st.dumps), st.tail(); n > 0 && tail != nil && st.dumps[n-1].Seq+st.dumps[n-1].Edges+1 == tail.Len() {
		for _, a := range tl.Snapshot().Events.Actions() {
			if a != snapshot.ActionRetain {
				break
			}
			st.dumps[n-1].Edges++
		}
	}
	if p := tl.Peak(timeline.Allocated); p.Seq >= 0 {
		st.peak = max(st.peak, p.Bytes)
	}
	st.markers += tl.Stats().ByAction[snapshot.ActionIteration]
	st.ooms = append(st.ooms, tl.OOMs()...)
	st.dumps = append(st.dumps, tl.HeapDumps()...)
	for _, it := range tl.Iterations() {
		if n := len(st.spans); n > 0 && st.spans[n-1].Iteration == it.Iteration && st.spans[n-1].End == it.Start {
			st.spans[n-1].End = it.End // the iteration goes on from the page before
			continue
		}
		if n := len(st.spans); n > 0 { // the iteration before ends where this one starts
			page := tl
			if it.Start == tl.Base() {
				page = st.tail()
			}
			st.end(page, it.Start-1)
		}
		st.spans = append(st.spans, it)
	}
	for _, p := range tl.Phases() {
		if !st.steps.add(p) || len(st.steps.steps) < 2 {
			continue
		}
		page := tl
		if p.Start == tl.Base() {
			page = st.tail()
		}
		st.steps.measure(len(st.steps.steps)-1, func(seq int) []timeline.Allocation {
			if page == nil {
				return nil
			}
			return page.LiveAt(seq, nil)
		})
	}
	st.kept = append(st.kept, tl)
	st.trim()
}

// tail returns the last page observed, nil before the first.
func (st *Stream) tail() *timeline.Timeline {
	if len(st.kept) == 0 {
		return nil
	}
	return st.kept[len(st.kept)-1]
}

// trim drops the pages before the one before the page of the second to last iteration end: the retainers
// of the last complete iteration's blocks are in the heap dumps around its end, which may begin a page
// before it.
func (st *Stream) trim() {
	if len(st.ends) < 2 {
		return
	}
	keep := st.ends[len(st.ends)-2].page
	for i, p := range st.kept {
		if p == keep {
			st.kept = slices.Delete(st.kept, 0, max(i-1, 0))
			return
		}
	}
}

// head is how many of the first iteration ends keep their groups: the analysis measures from the end of the
// last warm-up iteration on when the run is short.
func (st *Stream) head() int { return st.cfg.warmup + maxMeasured + 2 }

// end records the end of the iteration whose last event is seq, which page holds.
func (st *Stream) end(page *timeline.Timeline, seq int) {
	e := iterationEnd{seq: seq, allocated: page.Allocated(seq), reserved: page.Reserved(seq),
		groups: sumGroups(page.LiveAt(seq, nil)), page: page}
	// A training loop ends its iterations with the same live set, group for group: the end shares the one
	// before's groups, which are only read, so that hundreds of ends kept take one map, not hundreds.
	if n := len(st.ends); n > 0 && st.ends[n-1].groups != nil && maps.Equal(st.ends[n-1].groups, e.groups) {
		e.groups = st.ends[n-1].groups
	}
	st.ends = append(st.ends, e)
	n := len(st.ends)
	if k := n - 3; k >= 0 { // only the last two ends say which page is theirs
		st.ends[k].page = nil
	}
	if k := n - (maxMeasured + 2) - 1; k >= st.head() { // past the first ones and the last 258
		st.ends[k].groups = nil
	}
}

// Result returns the analysis of the run observed. s is the run's snapshot as the reader left it: its
// tables name stacks and scopes, its footer and warning say whether the recording ended normally.
func (st *Stream) Result(s *snapshot.Snapshot) *Result {
	tail := st.tail()
	if tail != nil && len(st.spans) > 0 && len(st.ends) < len(st.spans) {
		st.end(tail, tail.Len()-1) // the last iteration ends with the run
	}
	n := 0
	if tail != nil {
		n = tail.Len()
	}
	its := completeIterations(st.spans, st.ooms, st.dumps, n, s.Footer != nil && s.Warning == nil)
	return analyze(st.cfg, s, st.peak, st.markers, its, streamMeasurer{st, s})
}

// streamMeasurer measures with what a Stream kept.
type streamMeasurer struct {
	st *Stream
	s  *snapshot.Snapshot
}

func (m streamMeasurer) find(seq int) *iterationEnd {
	i, ok := slices.BinarySearchFunc(m.st.ends, seq, func(e iterationEnd, seq int) int { return e.seq - seq })
	if !ok {
		return nil
	}
	return &m.st.ends[i]
}

func (m streamMeasurer) at(seq int) (int64, int64, map[groupKey]groupSum) {
	if e := m.find(seq); e != nil {
		return e.allocated, e.reserved, e.groups
	}
	return 0, 0, nil // before the first event
}

func (m streamMeasurer) gradients() *GradientFinding {
	return m.st.steps.finding(m.s.Meta.Source == "oomdbg")
}

func (m streamMeasurer) liveAt(seq int) []timeline.Allocation {
	if e := m.find(seq); e != nil && e.page != nil {
		return e.page.LiveAt(seq, nil)
	}
	return nil
}

// retainer finds the heap dump nearest to event at among those taken while b was allocated, as
// Timeline.RetainerPath does on the whole run, and walks its edges, which may span pages.
func (m streamMeasurer) retainer(b timeline.Allocation, at int) (timeline.RetainerPath, bool) {
	kept := m.st.kept
	// The page holding at knows of b's free only up to its end; the pages after it say when.
	for _, p := range kept {
		if b.Free >= 0 || p.Base() <= at {
			continue
		}
		carried := p.ActiveAt(p.Base()-1, nil)
		i := slices.IndexFunc(carried, func(a timeline.Allocation) bool { return a.Alloc == b.Alloc })
		if i < 0 {
			break
		}
		b.Free = carried[i].Free
	}
	d := timeline.NearestDump(m.st.dumps, b, at)
	if d < 0 {
		return timeline.RetainerPath{}, false
	}
	dump := m.st.dumps[d]
	from, to := dump.Seq+1, dump.Seq+1+dump.Edges
	var edges []snapshot.Event
	for _, p := range kept {
		edges = append(edges, p.Snapshot().Events.Slice(max(from, p.Base()), min(to, p.Len()))...)
	}
	if len(edges) != dump.Edges || len(kept) == 0 || kept[0].Base() > from {
		return timeline.RetainerPath{Dump: dump}, false // not among the pages kept
	}
	return timeline.WalkRetainers(m.s, dump, edges, b)
}
