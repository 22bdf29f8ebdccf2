package tui

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/oomdbg/oomdbg/internal/cputime"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

var (
	bigOnce sync.Once
	big     *snapshot.Snapshot
)

// bigSnapshot is a 10M-event training trace (GPT-2-small shapes, 3,280 iterations).
func bigSnapshot(b *testing.B) *snapshot.Snapshot {
	bigOnce.Do(func() {
		cfg := snapshottest.GPT2Small()
		cfg.Iterations = 3280
		big = snapshottest.Trace(cfg)
	})
	return big
}

// BenchmarkKeypress10M measures what a keypress costs on a 10M-event snapshot: Update (moving the cursor and
// bringing every pane to it) plus View, at 160x48, for each navigation key and pane. The target is 16 ms.
func BenchmarkKeypress10M(b *testing.B) {
	s := bigSnapshot(b)
	m := New(context.Background(), Options{Snapshot: s, Profile: colorprofile.TrueColor})
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 48})
	for _, keys := range [][]string{{"right"}, {"L"}, {"]"}, {"}"}, {"p"}, {"G"}, {"g"}, {"+"}, {"2"}, {"3"}, {"4"}} {
		b.Run(keys[0], func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				k := keys[0]
				if i%2 == 1 && (k == "p" || k == "G" || k == "g" || k == "2" || k == "3" || k == "4") {
					k = "left" // a key that lands where it is does nothing: move between presses
				}
				m.Update(keyPress(k))
				_ = m.View()
			}
		})
	}
}

// benchFiles are the benchmarks' snapshot files, written once per run, in a directory TestMain removes.
var benchFiles struct {
	sync.Mutex
	dir   string
	paths map[int]string
}

// TestMain removes the benchmarks' snapshot files.
func TestMain(m *testing.M) {
	code := m.Run()
	if benchFiles.dir != "" {
		os.RemoveAll(benchFiles.dir)
	}
	os.Exit(code)
}

// benchFile returns a snapshot file of the generated GPT-2-small loop run for the given iterations (3,050
// events each).
func benchFile(b *testing.B, iterations int) string {
	benchFiles.Lock()
	defer benchFiles.Unlock()
	if p, ok := benchFiles.paths[iterations]; ok {
		return p
	}
	if benchFiles.dir == "" {
		dir, err := os.MkdirTemp("", "oomdbg-bench")
		if err != nil {
			b.Fatal(err)
		}
		benchFiles.dir, benchFiles.paths = dir, map[int]string{}
	}
	p := filepath.Join(benchFiles.dir, fmt.Sprintf("%d.oomdbg", iterations))
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	cfg := snapshottest.GPT2Small()
	cfg.Iterations = iterations
	err = snapshottest.Encode(f, cfg)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		b.Fatal(err)
	}
	benchFiles.paths[iterations] = p
	return p
}

// BenchmarkOpen10M measures what a user waits for: the TUI model, driven as Bubble Tea drives it (each
// command in a goroutine, each message through Update and then View, at 160x48), from opening a 10M-event
// snapshot file until it is loaded, indexed, landed on its peak and its leak analysis is done. The target is
// 2 seconds on a 2-core machine; cpu-s/op is the CPU time it takes, which contention on a shared machine
// changes less than the time.
func BenchmarkOpen10M(b *testing.B) {
	path := benchFile(b, 3280)
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	var events, updates int
	b.ReportAllocs()
	cpu := cputime.Process()
	for b.Loop() {
		m := New(context.Background(), Options{File: path, Profile: colorprofile.TrueColor})
		m.Update(tea.WindowSizeMsg{Width: 160, Height: 48})
		updates = drive(m, m.Init(), nil)
		if !m.load.done || m.load.err != nil || m.leaks.res == nil {
			b.Fatalf("not loaded: done %v, err %v, leaks %v", m.load.done, m.load.err, m.leaks.res != nil)
		}
		events = m.ix.len()
	}
	b.ReportMetric(float64(events)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(fi.Size())*float64(b.N)/b.Elapsed().Seconds()/1e6, "file-MB/s")
	b.ReportMetric(float64(updates), "updates")
	b.ReportMetric((cputime.Process()-cpu).Seconds()/float64(b.N), "cpu-s/op")
}

// BenchmarkKeypress100M measures a keypress on a 100M-event snapshot file (32,800 iterations), which the TUI
// pages: Update plus View at 160x48, for each navigation key and pane, from a window of pages around the
// cursor. A key that takes the cursor out of the window is answered from the overview, and the pages around
// the cursor are read back in a command, outside the keypress (drive runs it between presses, untimed);
// window-ms is what that takes. cpu-ms/op is the CPU time a key takes, which a shared machine's load changes
// less than the time. The targets are 16 ms a key and 2 GiB of memory (measure the process with
// /usr/bin/time: the heap here is the benchmark's).
func BenchmarkKeypress100M(b *testing.B) {
	path := benchFile(b, 32800)
	m := New(context.Background(), Options{File: path, Profile: colorprofile.TrueColor})
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 48})
	drive(m, m.Init(), nil)
	if !m.load.done || m.ix.ov == nil || m.ix.win == nil {
		b.Fatalf("not loaded and paged: done %v, paged %v, window %v", m.load.done, m.ix.ov != nil, m.ix.win != nil)
	}
	runtime.GC() // what loading left behind is not a keypress's
	for _, keys := range [][]string{{"right"}, {"L"}, {"]"}, {"}"}, {"p"}, {"G"}, {"g"}, {"+"}, {"2"}, {"3"}, {"4"}} {
		b.Run(keys[0], func(b *testing.B) {
			var windows int
			var windowTime, windowCPU time.Duration
			cpu := cputime.Process()
			for i := range b.N {
				k := keys[0]
				if i%2 == 1 && (k == "p" || k == "G" || k == "g" || k == "2" || k == "3" || k == "4") {
					k = "left"
				}
				_, cmd := m.Update(keyPress(k))
				_ = m.View()
				if cmd != nil {
					b.StopTimer()
					start, startCPU := time.Now(), cputime.Process()
					if drive(m, cmd, nil) > 0 {
						windows++
						windowTime += time.Since(start)
					}
					windowCPU += cputime.Process() - startCPU
					b.StartTimer()
				}
			}
			b.ReportMetric(float64((cputime.Process()-cpu-windowCPU).Microseconds())/1e3/float64(b.N), "cpu-ms/op")
			if windows > 0 {
				b.ReportMetric(float64(windowTime.Microseconds())/1e3/float64(windows), "window-ms")
			}
		})
	}
}

// BenchmarkPasteIntoFilter measures a 10,000-character paste into the live set's filter, as a terminal
// without bracketed paste delivers it: one key press each, each followed by Update and View at 80x24, on the
// live set at the OOM of the default workload's size (a few hundred blocks). The target is well under a
// second: the TUI answers keys while the paste arrives. cpu-s/op is the CPU time a paste takes, which a shared
// machine's load changes less than the time.
func BenchmarkPasteIntoFilter(b *testing.B) {
	m := newTestModel(b, fixture(b, "tiny-oom"), 80, 24)
	press(m, "esc") // the live set under the OOM panel
	paste := make([]tea.KeyPressMsg, 10_000)
	for i := range paste {
		r := rune('a' + i%26)
		paste[i] = tea.KeyPressMsg{Code: r, Text: string(r)}
	}
	cpu := cputime.Process()
	for b.Loop() {
		press(m, "/")
		for _, k := range paste {
			m.Update(k)
			_ = m.View()
		}
		press(m, "esc")
	}
	b.ReportMetric((cputime.Process()-cpu).Seconds()/float64(b.N), "cpu-s/op")
}
