package timeline_test

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// The Timeline benchmarks run on the generated GPT-2-small training loop: benchConfig's 124,000 events for
// building, and 10 million events (3,280 iterations, about 110 MB of events in memory) for building and for
// the queries a debugger makes at that size. The large trace ends with an oom event, so the OOM query has
// one to explain.

var (
	bigOnce     sync.Once
	bigSnapshot *snapshot.Snapshot
	bigTimeline *timeline.Timeline
)

func bigTrace(b *testing.B) (*snapshot.Snapshot, *timeline.Timeline) {
	b.Helper()
	bigOnce.Do(func() {
		cfg := snapshottest.GPT2Small()
		cfg.Iterations = 3280
		s := snapshottest.Trace(cfg)
		last := s.Events.At(s.Events.Len() - 1)
		s.Events.Append(&snapshot.Event{Time: last.Time + 1, Action: snapshot.ActionOOM,
			Size: 1 << 30, BlockSize: 1 << 30, Phase: last.Phase, Iteration: last.Iteration})
		bigSnapshot, bigTimeline = s, timeline.New(s)
	})
	return bigSnapshot, bigTimeline
}

func benchmarkBuild(b *testing.B, s *snapshot.Snapshot) {
	b.ReportAllocs()
	for b.Loop() {
		timeline.New(s)
	}
	b.ReportMetric(float64(s.Events.Len())*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkTimeline(b *testing.B) {
	benchmarkBuild(b, snapshottest.Trace(benchConfig()))
}

func BenchmarkTimeline10M(b *testing.B) {
	s, _ := bigTrace(b)
	benchmarkBuild(b, s)
}

// BenchmarkPeakQuery is what opening a snapshot at its peak costs: the peak, the blocks alive there and
// their breakdown by category, scope and stack.
func BenchmarkPeakQuery(b *testing.B) {
	s, tl := bigTrace(b)
	var live []timeline.Allocation
	for b.Loop() {
		p := tl.Peak(timeline.Allocated)
		live = tl.LiveAt(p.Seq, live[:0])
		for _, d := range []timeline.Dimension{timeline.ByCategory, timeline.ByScope, timeline.ByStack} {
			for _, g := range timeline.GroupBlocks(live, d)[:1] {
				_ = timeline.GroupName(s, d, g.Key)
			}
		}
	}
	b.ReportMetric(float64(len(live)), "blocks")
}

// BenchmarkOOMQuery explains the OOM: the blocks alive at it, by category, scope and stack, and the phase
// it happened in.
func BenchmarkOOMQuery(b *testing.B) {
	_, tl := bigTrace(b)
	var live []timeline.Allocation
	for b.Loop() {
		oom := tl.OOMs()[0]
		live = tl.LiveAt(oom, live[:0])
		for _, d := range []timeline.Dimension{timeline.ByCategory, timeline.ByScope, timeline.ByStack} {
			timeline.GroupBlocks(live, d)
		}
		_ = tl.Phases()[tl.PhaseAt(oom)]
	}
	b.ReportMetric(float64(len(live)), "blocks")
}

// BenchmarkLiveAt is the live set at random events, as a person stepping through the timeline sees it.
func BenchmarkLiveAt(b *testing.B) {
	_, tl := bigTrace(b)
	rng := rand.New(rand.NewPCG(1, 2))
	var live []timeline.Allocation
	for b.Loop() {
		live = tl.LiveAt(rng.IntN(tl.Len()), live[:0])
	}
}

// BenchmarkColumns draws the whole timeline 200 columns wide.
func BenchmarkColumns(b *testing.B) {
	_, tl := bigTrace(b)
	cols := make([]timeline.Extent, 200)
	for b.Loop() {
		tl.Columns(timeline.Allocated, 0, tl.Len(), cols)
		tl.Columns(timeline.Reserved, 0, tl.Len(), cols)
	}
}

// BenchmarkSegmentsAt is the allocator's segments pane at a random event.
func BenchmarkSegmentsAt(b *testing.B) {
	_, tl := bigTrace(b)
	rng := rand.New(rand.NewPCG(3, 4))
	for b.Loop() {
		tl.SegmentsAt(rng.IntN(tl.Len()))
	}
}

// BenchmarkRetainerPath is who retains a parameter at the heap dump nearest to a random event.
func BenchmarkRetainerPath(b *testing.B) {
	_, tl := bigTrace(b)
	rng := rand.New(rand.NewPCG(5, 6))
	param := tl.Allocation(0, 0)
	for b.Loop() {
		if _, ok := tl.RetainerPath(param, rng.IntN(tl.Len())); !ok {
			b.Fatal("no retainer for the first parameter")
		}
	}
}

// benchConfig is the trace the smaller benchmarks use: GPT-2 small, 40 iterations, about 124,000 events.
func benchConfig() snapshottest.Config {
	cfg := snapshottest.GPT2Small()
	cfg.Iterations = 40
	return cfg
}
