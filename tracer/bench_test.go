package tracer_test

import (
	"io"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tracer"
)

// The call sites of a training loop, reduced: a handful of places that allocate, each with its own stack.
//
//go:noinline
func siteA(r *tracer.Recorder, addr uint64) { r.Alloc(0, 0, addr, 3145728, 3145728) }

//go:noinline
func siteB(r *tracer.Recorder, addr uint64) { r.Alloc(0, 0, addr, 12582912, 12582912) }

//go:noinline
func siteC(r *tracer.Recorder, addr uint64) { r.Alloc(0, 0, addr, 1024, 1024) }

//go:noinline
func siteD(r *tracer.Recorder, addr uint64) { r.Alloc(0, 0, addr, 50331648, 50331648) }

//go:noinline
func layer(r *tracer.Recorder, i int, addr uint64) {
	switch i % 4 {
	case 0:
		siteA(r, addr)
	case 1:
		siteB(r, addr)
	case 2:
		siteC(r, addr)
	default:
		siteD(r, addr)
	}
}

// recordLoop records b.N alloc/free pairs from the call sites above, tagged like a forward pass.
func recordLoop(b *testing.B, r *tracer.Recorder) {
	r.BeginIteration(0)
	r.SetPhase(snapshot.PhaseForward)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		addr := 0x7f0000000000 + uint64(i%64)<<21
		r.TagNextAlloc(snapshot.CategoryActivation, "f32[8,1024,768] fc.out")
		layer(r, i, addr)
		r.FreeRequested(0, 0, addr, 3145728, 3145728)
	}
	b.StopTimer()
	b.ReportMetric(float64(2*b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkRecordNoSink measures the Recorder alone (stack capture, interning, tags), with a sink that stores
// nothing.
func BenchmarkRecordNoSink(b *testing.B) {
	recordLoop(b, tracer.New(discardSink{}))
}

// BenchmarkRecord measures recording with Go stacks into a real snapshot writer: the figure the recorder is
// held to (5M events/s).
func BenchmarkRecord(b *testing.B) {
	w, err := snapshot.NewWriter(io.Discard, snapshot.Meta{Tool: "oomdbg", Source: "oomdbg", TimeUnit: "ns"})
	if err != nil {
		b.Fatal(err)
	}
	recordLoop(b, tracer.New(w))
}
