package pickle

import "testing"

func benchmarkFixture(b *testing.B, name string) {
	data := readFixture(b, name)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeDoc(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeF1(b *testing.B) { benchmarkFixture(b, fixtureF1) }
func BenchmarkDecodeF2(b *testing.B) { benchmarkFixture(b, fixtureF2) }
func BenchmarkDecodeF3(b *testing.B) { benchmarkFixture(b, fixtureF3) }
func BenchmarkDecodeF4(b *testing.B) { benchmarkFixture(b, fixtureF4) }
func BenchmarkDecodeF7(b *testing.B) { benchmarkFixture(b, fixtureF7) }
