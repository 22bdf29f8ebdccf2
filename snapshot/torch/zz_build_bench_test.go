package torch

import (
	"testing"

	"github.com/oomdbg/oomdbg/internal/pickle"
)

func benchmarkBuild(b *testing.B, name string) {
	data := readFixture(b, name)
	doc, err := pickle.DecodeDoc(data)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		c := config{}
		c.lim = c.lim.withDefaults()
		im := &importer{doc: doc, lim: c.lim, tab: newTables(false), rules: defaultRules(), inputLen: len(data)}
		im.origin.Format = "pickle"
		if err := im.read(doc.Root()); err != nil {
			b.Fatal(err)
		}
		if _, err := im.build(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBuildF1(b *testing.B) { benchmarkBuild(b, fixtureF1) }
func BenchmarkBuildF3(b *testing.B) { benchmarkBuild(b, fixtureF3) }
func BenchmarkBuildF2(b *testing.B) { benchmarkBuild(b, fixtureF2) }
func BenchmarkBuildF4(b *testing.B) { benchmarkBuild(b, fixtureF4) }
func BenchmarkBuildF7(b *testing.B) { benchmarkBuild(b, fixtureF7) }

func benchmarkRead(b *testing.B, name string) {
	data := readFixture(b, name)
	doc, err := pickle.DecodeDoc(data)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		c := config{}
		c.lim = c.lim.withDefaults()
		im := &importer{doc: doc, lim: c.lim, tab: newTables(false), rules: defaultRules(), inputLen: len(data)}
		im.origin.Format = "pickle"
		if err := im.read(doc.Root()); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadF1(b *testing.B) { benchmarkRead(b, fixtureF1) }
func BenchmarkReadF3(b *testing.B) { benchmarkRead(b, fixtureF3) }
func BenchmarkReadF2(b *testing.B) { benchmarkRead(b, fixtureF2) }
func BenchmarkReadF4(b *testing.B) { benchmarkRead(b, fixtureF4) }
func BenchmarkReadF7(b *testing.B) { benchmarkRead(b, fixtureF7) }
