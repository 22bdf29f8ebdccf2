package transform_test

import (
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/whatif/transform"
)

// fuzzActions are the actions a fuzzed trace is made of.
var fuzzActions = []snapshot.Action{snapshot.ActionAlloc, snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted,
	snapshot.ActionCategory, snapshot.ActionPhase, snapshot.ActionIteration, snapshot.ActionSegmentFree,
	snapshot.ActionOOM, snapshot.ActionSegmentAlloc, snapshot.ActionAnnotation}

// fuzzTrace reads data as a trace, 6 bytes an event: action, phase, category, address, size, scope,
// iteration and stack. Anything goes: frees of blocks never allocated, addresses allocated twice, phases out
// of order, stacks that share callers or not, empty ones and unknown ones.
func fuzzTrace(data []byte) *snapshot.Snapshot {
	s := &snapshot.Snapshot{Strings: []string{"", "h.0", "h.1", "h.1.fc", "h.0.fc", "h.x", "h.01", "optimizer", "f", "g"}}
	s.Frames = []snapshot.Frame{{}, {Function: 8, Line: 1}, {Function: 8, Line: 2}, {Function: 9, Line: 1}, {Function: 11}}
	s.Stacks = [][]snapshot.FrameID{nil, {1, 3}, {2, 3}, {3}, {1, 2, 3}, {4, 9}, {}}
	for len(data) >= 6 && s.Events.Len() < 4096 {
		e := snapshot.Event{Seq: uint64(s.Events.Len()), Action: fuzzActions[int(data[0])%len(fuzzActions)],
			Phase: snapshot.Phase(data[1] % byte(snapshot.NumPhases)), Category: snapshot.Category(data[2] % byte(snapshot.NumCategories)),
			Addr: uint64(data[3]%16) << 9, Size: int64(data[4]) << (data[5] % 24), Scope: snapshot.StringID(data[5] % 8),
			Iteration: int32(data[1]/16) - 1, Stack: snapshot.StackID(data[3] / 16 % 8)}
		e.BlockSize = (e.Size + 511) / 512 * 512
		s.Events.Append(&e)
		data = data[6:]
	}
	return s
}

// FuzzApply: no input makes a transformation panic, hang or emit a trace whose frees do not match its
// allocations.
func FuzzApply(f *testing.F) {
	f.Add([]byte{0, 3 * 16, 5, 1, 10, 1, 3, 3 * 16, 4, 1, 0, 1, 1, 4 * 16, 0, 1, 10, 1, 4, 4 * 16, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := fuzzTrace(data)
		for _, tr := range []transform.Transform{transform.BatchScale(0.5), transform.BatchScale(3),
			transform.Accumulate(3), transform.SwitchOptimizer(knob.SGD), transform.SwitchOptimizer(knob.Adam),
			transform.SwitchOptimizer(knob.Momentum), transform.ZeroGrad(knob.ZeroGradZero),
			transform.ZeroGrad(knob.ZeroGradNone), transform.SwitchOptimizer(knob.AdamW8bit),
			transform.OptimizerImpl(knob.ForLoop),
			transform.Checkpoint(knob.CheckpointAll), transform.Checkpoint(knob.CheckpointEvery(2))} {
			early, held, _, err := transform.ApplyEnds(s, tr)
			if err != nil {
				continue
			}
			if strings.HasPrefix(tr.Name, "checkpoint") {
				// Checkpointing moves releases and copies blocks; it never leaves one unreleased that the input released.
				in := unreleased(s)
				for _, out := range []*snapshot.Snapshot{early, held} {
					if got := unreleased(out); got > in {
						t.Fatalf("%s: %d blocks never released, %d in the input", tr.Name, got, in)
					}
				}
			}
			for _, out := range []*snapshot.Snapshot{early, held} {
				if out == nil {
					continue
				}
				if out.Events.Len() > 64*s.Events.Len()+64 {
					t.Fatalf("%s: %d events from %d", tr.Name, out.Events.Len(), s.Events.Len())
				}
				// Every allocation the transformation made has an address of its own.
				seen := map[uint64]bool{}
				for _, e := range out.Events.All() {
					if e.Action == snapshot.ActionAlloc && e.Addr >= 1<<56 {
						if seen[e.Addr] {
							t.Fatalf("%s: address %#x allocated twice", tr.Name, e.Addr)
						}
						seen[e.Addr] = true
					}
				}
			}
		}
	})
}

// unreleased counts the blocks a trace allocates and never releases (an address allocated again while
// live leaves its first block unreleased).
func unreleased(s *snapshot.Snapshot) int {
	live := map[uint64]bool{}
	n := 0
	for _, e := range s.Events.All() {
		switch e.Action {
		case snapshot.ActionAlloc:
			if live[e.Addr] {
				n++
			}
			live[e.Addr] = true
		case snapshot.ActionFreeRequested:
			delete(live, e.Addr)
		}
	}
	return n + len(live)
}
