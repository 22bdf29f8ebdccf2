package tui

import (
	"context"
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

// bigSnapshot is a 10M-event training trace (GPT-2-small shapes, 4,350 iterations).
func bigSnapshot(b *testing.B) *snapshot.Snapshot {
	bigOnce.Do(func() {
		cfg := snapshottest.GPT2Small()
		cfg.Iterations = 4350
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
