package torch

import (
	"bytes"
	"testing"

	"github.com/oomdbg/oomdbg/internal/pickle"
	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
)

// benchmarkImport measures Import (decode and build the snapshot) on a real snapshot, in bytes of pickle per
// second, to set against CPython's pickle.load of the same file (internal/pickle/testdata/cpython_bench.py),
// which only decodes. It also reports the size of the snapshot written in oomdbg's format against the pickle's.
func benchmarkImport(b *testing.B, name string) {
	data := torchtest.ReadFixture(b, name)
	s, err := Import(data)
	if err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeNative(&buf, s); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := Import(data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(buf.Len())/float64(len(data)), "native/pickle")
	b.ReportMetric(float64(buf.Len())/float64(max(s.Events.Len(), 1)), "native-B/event")
}

// benchmarkImportReader measures ImportReader on a real snapshot held in memory: the stream path ImportFile
// and the commands take, decoding through the decoder's buffer.
func benchmarkImportReader(b *testing.B, name string) {
	data := torchtest.ReadFixture(b, name)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ImportReader(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkImportReaderF1(b *testing.B) { benchmarkImportReader(b, torchtest.F1) }
func BenchmarkImportReaderF2(b *testing.B) { benchmarkImportReader(b, torchtest.F2) }
func BenchmarkImportReaderF3(b *testing.B) { benchmarkImportReader(b, torchtest.F3) }
func BenchmarkImportReaderF4(b *testing.B) { benchmarkImportReader(b, torchtest.F4) }
func BenchmarkImportReaderF7(b *testing.B) { benchmarkImportReader(b, torchtest.F7) }

// benchmarkModel measures building the snapshot from a decoded pickle, the part of Import after the decode.
func benchmarkModel(b *testing.B, name string) {
	data := torchtest.ReadFixture(b, name)
	doc, err := pickle.DecodeDoc(data)
	if err != nil {
		b.Fatal(err)
	}
	c := config{}
	c.lim = c.lim.withDefaults()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := importDoc(doc, Origin{Format: "pickle"}, c, int64(len(data))); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkModelF1(b *testing.B)  { benchmarkModel(b, torchtest.F1) }
func BenchmarkModelF2(b *testing.B)  { benchmarkModel(b, torchtest.F2) }
func BenchmarkModelF3(b *testing.B)  { benchmarkModel(b, torchtest.F3) }
func BenchmarkModelF4(b *testing.B)  { benchmarkModel(b, torchtest.F4) }
func BenchmarkModelF7(b *testing.B)  { benchmarkModel(b, torchtest.F7) }
func BenchmarkModelF12(b *testing.B) { benchmarkModel(b, torchtest.F12) }

func BenchmarkImportF1(b *testing.B)  { benchmarkImport(b, torchtest.F1) }
func BenchmarkImportF2(b *testing.B)  { benchmarkImport(b, torchtest.F2) }
func BenchmarkImportF3(b *testing.B)  { benchmarkImport(b, torchtest.F3) }
func BenchmarkImportF4(b *testing.B)  { benchmarkImport(b, torchtest.F4) }
func BenchmarkImportF7(b *testing.B)  { benchmarkImport(b, torchtest.F7) }
func BenchmarkImportF12(b *testing.B) { benchmarkImport(b, torchtest.F12) }

// writeNative writes s in oomdbg's file format, interning its tables in ID order so that the IDs stay.
func writeNative(buf *bytes.Buffer, s *snapshot.Snapshot) error {
	w, err := snapshot.NewWriter(buf, s.Meta)
	if err != nil {
		return err
	}
	for _, str := range s.Strings[1:] {
		w.InternString(str)
	}
	for _, f := range s.Frames[1:] {
		w.InternFrame(s.Strings[f.Function], s.Strings[f.File], int(f.Line))
	}
	for _, st := range s.Stacks[1:] {
		w.InternStack(st)
	}
	for i := range s.Events.Len() {
		e := s.Events.At(i)
		if err := w.Write(&e); err != nil {
			return err
		}
	}
	return w.Close(s.Footer)
}
