package whatif_test

import (
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/allocator/replay"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/whatif"
	"github.com/oomdbg/oomdbg/whatif/transform"
)

// A fix replays at two ends only where it places releases the trace does not record (checkpointing); the
// verdict is at the edge exactly where the ends disagree.
func TestOnlyCheckpointingHasTwoEnds(t *testing.T) {
	s := snapshottest.Trace(snapshottest.Tiny())
	b, err := whatif.Before(s, 0)
	if err != nil {
		t.Fatal(err)
	}
	w := b.Worst
	for _, c := range []struct {
		fix  transform.Transform
		ends bool
	}{
		{transform.BatchScale(0.5), false},
		{transform.SwitchOptimizer(knob.SGD), false},
		{transform.Checkpoint(knob.CheckpointAll), true},
	} {
		p, err := whatif.Prepare(s, c.fix)
		if err != nil {
			t.Fatalf("%s: %v", c.fix.Name, err)
		}
		r, err := p.Replay(allocator.Config{}, w.Device, w.Capacity)
		if err != nil {
			t.Fatalf("%s: %v", c.fix.Name, err)
		}
		if (p.Held != nil) != c.ends || (r.Held != nil) != c.ends {
			t.Errorf("%s: a late end %v, replayed %v; want %v", c.fix.Name, p.Held != nil, r.Held != nil, c.ends)
		}
		if r.After.PeakAllocated <= 0 || r.Edge() {
			t.Errorf("%s: peak %d, at the edge %v; want no edge here", c.fix.Name, r.After.PeakAllocated, r.Edge())
		}
	}
	fails := replay.Outcome{OOM: &replay.OOM{Message: "CUDA out of memory."}}
	for _, c := range []struct {
		after, held replay.Outcome
		edge        bool
	}{
		{replay.Outcome{}, replay.Outcome{}, false},
		{fails, fails, false},
		{replay.Outcome{}, fails, true},
		{fails, replay.Outcome{}, true},
		{replay.Outcome{}, replay.Outcome{RecordedOOMs: []replay.RecordedOOM{{StillHappens: true}}}, true},
	} {
		if got := (whatif.Result{After: c.after, Held: &c.held}).Edge(); got != c.edge {
			t.Errorf("after %+v, held %+v: edge %v, want %v", c.after, c.held, got, c.edge)
		}
	}
}
