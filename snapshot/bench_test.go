package snapshot_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

// benchConfig is the trace the benchmarks use: GPT-2 small, 40 iterations, about 124,000 events.
func benchConfig() snapshottest.Config {
	cfg := snapshottest.GPT2Small()
	cfg.Iterations = 40
	return cfg
}

// countingWriter counts bytes and keeps none.
type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

// writeTrace writes a generated trace through a Writer: tables interned in ID order, as the recorder would
// intern them on first use, then the events.
func writeTrace(w io.Writer, s *snapshot.Snapshot, events []snapshot.Event, opts ...snapshot.WriterOption) error {
	sw, err := snapshot.NewWriter(w, s.Meta, opts...)
	if err != nil {
		return err
	}
	for _, str := range s.Strings[1:] {
		sw.InternString(str)
	}
	for _, f := range s.Frames[1:] {
		sw.InternFrame(s.String(f.Function), s.String(f.File), int(f.Line))
	}
	for _, st := range s.Stacks[1:] {
		sw.InternStack(st)
	}
	for i := range events {
		if err := sw.Write(&events[i]); err != nil {
			return err
		}
	}
	return sw.Close(s.Footer)
}

func BenchmarkWrite(b *testing.B) {
	s := snapshottest.Trace(benchConfig())
	orig := s.Events.Slice(0, s.Events.Len())
	events := make([]snapshot.Event, len(orig))
	var w countingWriter
	b.ReportAllocs()
	for b.Loop() {
		copy(events, orig)
		w.n = 0
		if err := writeTrace(&w, s, events); err != nil {
			b.Fatal(err)
		}
	}
	n := float64(s.Events.Len())
	b.ReportMetric(n*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(w.n)/n, "bytes/event")
}

// encoded returns the benchmark trace as a file.
func encoded(b *testing.B) []byte {
	var buf bytes.Buffer
	if err := snapshottest.Encode(&buf, benchConfig()); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

func BenchmarkRead(b *testing.B) {
	data := encoded(b)
	var n int
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		r, err := snapshot.NewReader(bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		var dst snapshot.Events
		for {
			err = r.ReadChunk(&dst)
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		n = dst.Len()
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkNext(b *testing.B) {
	data := encoded(b)
	var n int
	b.ReportAllocs()
	for b.Loop() {
		r, err := snapshot.NewReader(bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		n = 0
		for {
			if _, err := r.Next(); err == io.EOF {
				break
			} else if err != nil {
				b.Fatal(err)
			}
			n++
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkReadAll reads a whole snapshot into memory, and reports what its events cost there.
func BenchmarkReadAll(b *testing.B) {
	data := encoded(b)
	var n int
	var resident int64
	b.ReportAllocs()
	for b.Loop() {
		s, err := snapshot.Read(bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		n = s.Events.Len()
		resident = s.Events.Bytes()
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(resident)/float64(n), "resident-B/event")
}
