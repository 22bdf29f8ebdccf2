package tui

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

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

var (
	bigFileOnce sync.Once
	bigFilePath string
	bigFileErr  error
)

// TestMain removes the benchmarks' snapshot file.
func TestMain(m *testing.M) {
	code := m.Run()
	if bigFilePath != "" {
		os.RemoveAll(filepath.Dir(bigFilePath))
	}
	os.Exit(code)
}

// bigFile is bigSnapshot's trace written as a snapshot file, once per run of the benchmarks.
func bigFile(b *testing.B) string {
	bigFileOnce.Do(func() {
		dir, err := os.MkdirTemp("", "oomdbg-bench")
		if err != nil {
			bigFileErr = err
			return
		}
		bigFilePath = filepath.Join(dir, "10m.oomdbg")
		f, err := os.Create(bigFilePath)
		if err != nil {
			bigFileErr = err
			return
		}
		cfg := snapshottest.GPT2Small()
		cfg.Iterations = 3280
		if err := snapshottest.Encode(f, cfg); err != nil {
			bigFileErr = err
		}
		if err := f.Close(); err != nil && bigFileErr == nil {
			bigFileErr = err
		}
	})
	if bigFileErr != nil {
		b.Fatal(bigFileErr)
	}
	return bigFilePath
}

// BenchmarkOpen10M measures what a user waits for: the TUI model, driven as Bubble Tea drives it (each
// command in a goroutine, each message through Update and then View, at 160x48), from opening a 10M-event
// snapshot file until it is loaded, indexed, landed on its peak and its leak analysis is done. The target is
// 2 seconds on a 2-core machine.
func BenchmarkOpen10M(b *testing.B) {
	path := bigFile(b)
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	var events, updates int
	b.ReportAllocs()
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
}
