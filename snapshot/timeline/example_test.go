package timeline_test

import (
	"fmt"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// A timeline of a generated training loop: its peak, the phase it is in, what was alive then, and the whole
// run drawn eight columns wide, each column the highest allocated bytes under it.
func ExampleTimeline() {
	s := snapshottest.Trace(snapshottest.Tiny())
	tl := timeline.New(s)

	peak := tl.Peak(timeline.Allocated)
	span := tl.Phases()[tl.PhaseAt(peak.Seq)]
	fmt.Printf("%d events; peak of %d KiB after event %d, iteration %d, %s\n", tl.Len(), peak.Bytes>>10, peak.Seq, span.Iteration, span.Phase)

	live := tl.LiveAt(peak.Seq, nil)
	for _, g := range timeline.GroupBlocks(live, timeline.ByCategory)[:3] {
		fmt.Printf("  %-16s %5d KiB in %d blocks\n", timeline.GroupName(s, timeline.ByCategory, g.Key), g.Bytes>>10, g.Count)
	}

	for _, col := range tl.Columns(timeline.Allocated, 0, tl.Len(), make([]timeline.Extent, 8)) {
		fmt.Print(col.Max>>10, " ")
	}
	fmt.Println("KiB")
	// Output:
	// 1887 events; peak of 2335 KiB after event 484, iteration 0, optimizer
	//   optimizer_state    934 KiB in 56 blocks
	//   parameter          467 KiB in 28 blocks
	//   gradient           467 KiB in 28 blocks
	// 1282 2137 2335 2216 2335 2172 2216 2335 KiB
}

// What changed between two stops of a person stepping through the run: the forward phase of the first
// iteration.
func ExampleTimeline_Changes() {
	s := snapshottest.Trace(snapshottest.Tiny())
	tl := timeline.New(s)
	for _, p := range tl.Phases() {
		if p.Iteration == 0 && p.Phase == snapshot.PhaseForward {
			c := tl.Changes(p.Start-1, p.End-1) // from before its first event to after its last
			fmt.Printf("forward: %d blocks allocated and still alive, %d freed, %d come and gone\n", len(c.Allocated), len(c.Freed), c.Transient)
		}
	}
	// Output:
	// forward: 41 blocks allocated and still alive, 0 freed, 20 come and gone
}
