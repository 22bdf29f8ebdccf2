package pickle

import (
	"bytes"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
)

func benchmarkFixture(b *testing.B, name string) {
	data := torchtest.ReadFixture(b, name)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeDoc(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeF1(b *testing.B) { benchmarkFixture(b, torchtest.F1) }
func BenchmarkDecodeF2(b *testing.B) { benchmarkFixture(b, torchtest.F2) }
func BenchmarkDecodeF3(b *testing.B) { benchmarkFixture(b, torchtest.F3) }
func BenchmarkDecodeF4(b *testing.B) { benchmarkFixture(b, torchtest.F4) }
func BenchmarkDecodeF7(b *testing.B) { benchmarkFixture(b, torchtest.F7) }

// benchmarkStream measures DecodeDocReader on a real snapshot held in memory: the decode through the
// stream's buffer.
func benchmarkStream(b *testing.B, name string) {
	data := torchtest.ReadFixture(b, name)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeDocReader(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeReaderF1(b *testing.B) { benchmarkStream(b, torchtest.F1) }
func BenchmarkDecodeReaderF2(b *testing.B) { benchmarkStream(b, torchtest.F2) }
func BenchmarkDecodeReaderF3(b *testing.B) { benchmarkStream(b, torchtest.F3) }
func BenchmarkDecodeReaderF4(b *testing.B) { benchmarkStream(b, torchtest.F4) }
func BenchmarkDecodeReaderF7(b *testing.B) { benchmarkStream(b, torchtest.F7) }
