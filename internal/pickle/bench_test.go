package pickle

import (
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
