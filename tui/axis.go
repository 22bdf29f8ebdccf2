package tui

import (
	"slices"
	"sort"

	"github.com/oomdbg/oomdbg/snapshot"
)

// axis is the timeline's x-axis: the events that take a column. Allocations, frees, segments, the OOM and
// device readings do; markers do not (phase and iteration marks, annotations, category changes, heap dumps
// and their retain edges), so that the heap dumps after an OOM or at each iteration's end are not drawn as a
// plateau of bookkeeping. Markers still are events the cursor can stand on: they share the column of the
// run's event before them.
type axis struct {
	run     []int32 // the events that take a column, in order
	indexed int     // events looked at so far
	byTime  bool    // columns are equal spans of time instead (t toggles)
	snap    *snapshot.Snapshot
}

// marker reports whether an action leaves memory as it is and takes no column.
func marker(a snapshot.Action) bool {
	switch a {
	case snapshot.ActionPhase, snapshot.ActionIteration, snapshot.ActionAnnotation, snapshot.ActionCategory,
		snapshot.ActionRetain, snapshot.ActionHeapDump:
		return true
	}
	return false
}

// update takes in the events appended since the last call.
func (a *axis) update(s *snapshot.Snapshot, n int) {
	if n < a.indexed || s != a.snap { // another snapshot (a device's view of it)
		a.run, a.indexed = a.run[:0], 0
	}
	for i := a.indexed; i < n; i++ {
		if !marker(s.Events.Action(i)) {
			a.run = append(a.run, int32(i))
		}
	}
	a.indexed, a.snap = n, s
}

// column is the events [from, to) one column of the timeline draws.
type column struct{ from, to int }

// columns splits the run's events in [from, to) into width columns of (nearly) equal numbers of them; each
// column takes the markers after its events up to the next column. A column narrower than one event repeats
// the event under it; columns past the events are empty (from == to). Without a run event in [from, to)
// (a window of markers only), the events themselves are the columns.
func (a *axis) columns(from, to, width int) []column {
	if a.byTime {
		if cols := a.timeColumns(from, to, width); cols != nil {
			return cols
		}
	}
	cols := make([]column, width)
	lo, _ := slices.BinarySearch(a.run, int32(from))
	hi, _ := slices.BinarySearch(a.run, int32(to))
	n := hi - lo
	at := func(k int) int { return int(a.run[lo+k]) }
	if n == 0 {
		n, at = to-from, func(k int) int { return from + k }
	}
	if n <= 0 {
		return cols
	}
	for c := range width {
		i, j := c*n/width, (c+1)*n/width
		if i >= n {
			cols[c] = column{to, to}
			continue
		}
		start, end := at(i), to
		if j < n {
			end = at(j)
		}
		if c == 0 {
			start = from // the markers before the first run event in view
		}
		cols[c] = column{start, max(end, start+1)}
	}
	return cols
}

// timeColumns splits events [from, to) into width equal spans of recorded time; a span without an event
// repeats the event before it (memory stays as it was). Nil when the events carry no time.
func (a *axis) timeColumns(from, to, width int) []column {
	if a.snap == nil || to > a.snap.Events.Len() {
		return nil
	}
	evs := &a.snap.Events
	if to-from < 2 || evs.Time(to-1) <= evs.Time(from) {
		return nil
	}
	t0, span := evs.Time(from), evs.Time(to-1)-evs.Time(from)
	at := func(t int64) int { // the first event at or after t, within [from, to]
		return from + sort.Search(to-from, func(i int) bool { return evs.Time(from+i) >= t })
	}
	cols := make([]column, width)
	for c := range width {
		lo, hi := at(t0+span*int64(c)/int64(width)), at(t0+span*int64(c+1)/int64(width))
		if c == width-1 {
			hi = to
		}
		if hi <= lo {
			lo, hi = max(lo-1, from), max(lo, from+1)
		}
		cols[c] = column{lo, hi}
	}
	return cols
}

// columnOf returns the column of cols drawing event i: the last one starting at or before it; -1 when i is
// outside them.
func columnOf(cols []column, i int) int {
	c := -1
	for k, col := range cols {
		if col.from < col.to && col.from <= i {
			c = k
		}
	}
	if c >= 0 && i >= cols[len(cols)-1].to && cols[len(cols)-1].to > cols[len(cols)-1].from {
		return -1
	}
	return c
}
