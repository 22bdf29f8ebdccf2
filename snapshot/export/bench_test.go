package export

import (
	"bytes"
	"io"
	"strconv"
	"sync"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// The large snapshot: the generated GPT-2-small training loop, 330 iterations, about a million events.

var (
	bigOnce     sync.Once
	bigSnap     *snapshot.Snapshot
	bigTimeline *timeline.Timeline
)

func bigSnapshot(tb testing.TB) (*snapshot.Snapshot, *timeline.Timeline) {
	tb.Helper()
	bigOnce.Do(func() {
		cfg := snapshottest.GPT2Small()
		cfg.Iterations = 330
		bigSnap = snapshottest.Trace(cfg)
		bigTimeline = timeline.New(bigSnap)
	})
	return bigSnap, bigTimeline
}

// formatWriters write each format from a Timeline, as the benchmarks and the size checks use them.
var formatWriters = map[Format]func(io.Writer, *timeline.Timeline) error{
	FormatTorch:     Torch,
	FormatTorchJSON: TorchJSON,
	FormatPprof: func(w io.Writer, tl *timeline.Timeline) error {
		return Pprof(w, tl, tl.Peak(timeline.Allocated).Seq)
	},
	FormatPerfetto: func(w io.Writer, tl *timeline.Timeline) error { return Perfetto(w, tl, -1) },
	FormatSVG:      func(w io.Writer, tl *timeline.Timeline) error { return SVG(w, tl, PlotOptions{Mark: -1}) },
	FormatPNG:      func(w io.Writer, tl *timeline.Timeline) error { return PNG(w, tl, PlotOptions{Mark: -1}) },
}

// TestLargeSnapshot exports a million-event snapshot and checks the files stay a sensible size: the trace
// within its counter budget (and still showing the peak), the pickle small thanks to shared stacks, the plots
// independent of the events.
func TestLargeSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("a million events: not in -short")
	}
	s, tl := bigSnapshot(t)
	n := s.Events.Len()
	if n < 900_000 {
		t.Fatalf("the large snapshot has %d events", n)
	}
	peak := tl.Peak(timeline.Allocated).Bytes
	for _, budget := range []int{maxCounterEvents, 100_000} {
		var trace bytes.Buffer
		if _, err := perfetto(&trace, tl, traceOptions{mark: -1, budget: budget}); err != nil {
			t.Fatal(err)
		}
		counters := bytes.Count(trace.Bytes(), []byte(`{"ph":"C"`))
		t.Logf("%d events, a budget of %d: a trace of %d MB with %d counter events", n, budget, trace.Len()>>20, counters)
		if counters > budget*101/100 {
			t.Errorf("%d counter events, budget %d", counters, budget)
		}
		if trace.Len() > 96<<20 {
			t.Errorf("the trace of %d events is %d MB", n, trace.Len()>>20)
		}
		if !bytes.Contains(trace.Bytes(), []byte(`"name":"allocated","ts":`)) || !bytes.Contains(trace.Bytes(), []byte(`{"bytes":`+strconv.FormatInt(peak, 10)+`}`)) {
			t.Errorf("a budget of %d lost the peak of the allocated counter", budget)
		}
	}
	limits := map[Format]int64{
		FormatTorch: 60 * int64(n), // bytes an event
		FormatSVG:   1 << 20,
		FormatPNG:   1 << 20,
		FormatPprof: 1 << 20,
	}
	for f, limit := range limits {
		var c counter
		if err := formatWriters[f](&c, tl); err != nil {
			t.Fatal(err)
		}
		if c.n > limit {
			t.Errorf("%s of %d events: %d bytes, want at most %d", f, n, c.n, limit)
		}
	}
}

// BenchmarkExport writes each format of the million-event snapshot from its Timeline; it reports events/s
// and, through SetBytes, the MB/s of output.
func BenchmarkExport(b *testing.B) {
	s, tl := bigSnapshot(b)
	for _, f := range Formats {
		b.Run(string(f), func(b *testing.B) {
			write := formatWriters[f]
			var c counter
			if err := write(&c, tl); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(c.n)
			b.ReportAllocs()
			for b.Loop() {
				if err := write(io.Discard, tl); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(s.Events.Len())*float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
