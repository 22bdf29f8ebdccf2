package tui

import (
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
)

// TestAxisLeavesOutBookkeeping: after the OOM the recording writes heap dumps and their retain edges, which
// change no memory; they take no columns, so the OOM is drawn in the last column, and every column holds the
// same number of allocator events, give or take one.
func TestAxisLeavesOutBookkeeping(t *testing.T) {
	s := fixture(t, "tiny-oom")
	m := newTestModel(t, s, 80, 24)
	// The allocator's events and device readings are the run; the rest are markers.
	runs, before := 0, 0
	for i, e := range s.Events.All() {
		switch e.Action {
		case snapshot.ActionAlloc, snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted, snapshot.ActionSegmentAlloc,
			snapshot.ActionSegmentFree, snapshot.ActionOOM, snapshot.ActionSegmentMap, snapshot.ActionSegmentUnmap,
			snapshot.ActionSample, snapshot.ActionSnapshot:
			if i < m.ix.oom {
				before++
			}
			runs++
		}
	}
	const width = 70
	var a axis
	a.update(s, s.Events.Len())
	cols := a.columns(0, s.Events.Len(), width)
	want := 0 // the column whose share of the run's events holds the OOM's
	for c := range width {
		if c*runs/width <= before {
			want = c
		}
	}
	byEvents := m.ix.oom * width / s.Events.Len() // where counting every event put it
	if c := columnOf(cols, m.ix.oom); c != want || want-byEvents < 10 {
		t.Errorf("the OOM is in column %d, want %d (by events, it was in %d)", c, want, byEvents)
	}
	for c, col := range cols {
		k := 0
		for i := col.from; i < col.to; i++ {
			if !marker(s.Events.At(i).Action) {
				k++
			}
		}
		if lo := runs / width; k < lo || k > lo+1 {
			t.Errorf("column %d holds %d allocator events, want %d or %d", c, k, lo, lo+1)
		}
	}
}

// TestTimeAxis: with t, each column is the same span of recorded time: the events of a column all fall in
// its span, and an event sits in the column its time says.
func TestTimeAxis(t *testing.T) {
	s := fixture(t, "tiny-oom")
	m := newTestModel(t, s, 80, 24)
	press(m, "t")
	if !m.timeline.axis.byTime {
		t.Fatal("t does not switch the axis to time")
	}
	const width = 50
	screen(m) // the timeline takes in the events as it draws
	cols := m.timeline.axis.columns(0, s.Events.Len(), width)
	t0, t1 := s.Events.At(0).Time, s.Events.At(s.Events.Len()-1).Time
	if t1 <= t0 {
		t.Fatal("the fixture's events carry no time")
	}
	for _, i := range []int{s.Events.Len() / 3, s.Events.Len() / 2, m.ix.oom} {
		want := min(int((s.Events.At(i).Time-t0)*width/(t1-t0)), width-1)
		if c := columnOf(cols, i); c != want && !(c == want-1 && s.Events.At(i).Time == t0+(t1-t0)*int64(want)/width) {
			t.Errorf("event %d at %d ns is in column %d, its time says %d", i, s.Events.At(i).Time-t0, c, want)
		}
	}
	press(m, "t")
	if m.timeline.axis.byTime {
		t.Error("t again does not switch back to events")
	}
}

// TestAxisFollowsADeviceView: d shows one device's events, a snapshot of its own; the axis takes in that
// one, not the events it held before.
func TestAxisFollowsADeviceView(t *testing.T) {
	s, err := load.File(torchtest.FixturePath(t, torchtest.F7))
	if err != nil {
		t.Fatal(err)
	}
	m := newTestModel(t, s, 100, 30)
	screen(m)
	for range 3 { // each device, then all again
		press(m, "d")
		screen(m)
		n := 0
		for _, e := range m.snap.Events.All() {
			if !marker(e.Action) {
				n++
			}
		}
		if a := m.timeline.axis; a.snap != m.snap || len(a.run) != n {
			t.Errorf("the axis holds %d events (of the shown snapshot: %v); the view has %d", len(a.run), a.snap == m.snap, n)
		}
	}
}
