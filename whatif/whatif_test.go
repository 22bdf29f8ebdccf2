package whatif_test

import (
	"strings"
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

// TestVerdictKeepsTheMargin: a fix whose replay runs without an OOM but peaks inside the headroom rule's
// margin is tight, not a fit, and the report states the margin beside the verdict; with the margin's room
// it fits.
func TestVerdictKeepsTheMargin(t *testing.T) {
	s := snapshottest.Trace(snapshottest.Tiny())
	fix := whatif.Fix{Transforms: []transform.Transform{transform.SwitchOptimizer(knob.SGD)}}
	free, err := whatif.Evaluate(s, fix, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	need := uint64(free.After.PeakReserved)
	for _, c := range []struct {
		capacity uint64
		want     string
	}{
		{need, whatif.VerdictTight},                                       // the run's peak to the byte: nothing left
		{need * 100 / 97, whatif.VerdictTight},                            // 3% left, inside the 5% margin
		{need*100/95 + 1<<20, whatif.VerdictFits},                         // the margin's room, and a MiB
		{need / 2, whatif.VerdictOOM},                                     // half of what it needs
		{uint64(free.Before.PeakReserved) * 100 / 90, whatif.VerdictFits}, // SGD needs less than the run as recorded
	} {
		r, err := whatif.Evaluate(s, fix, c.capacity)
		if err != nil {
			t.Fatal(err)
		}
		if r.Verdict != c.want || r.After.Verdict != c.want {
			t.Errorf("capacity %d (the fix peaks at %d reserved): verdict %q, after %q; want %q", c.capacity, need,
				r.Verdict, r.After.Verdict, c.want)
		}
		if r.Margin != 0.05 || r.Limit != int64(float64(c.capacity)*0.95) {
			t.Errorf("capacity %d: margin %v, limit %d", c.capacity, r.Margin, r.Limit)
		}
		var text strings.Builder
		if err := r.WriteText(&text); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(text.String(), "(a 5% margin") {
			t.Errorf("capacity %d: the report does not state the margin:\n%s", c.capacity, text.String())
		}
		if c.want == whatif.VerdictTight && !strings.Contains(text.String(), "tight") {
			t.Errorf("capacity %d: the report does not say tight:\n%s", c.capacity, text.String())
		}
	}
}
