package tui

import (
	"strings"
	"testing"
)

// TestDetailScrollsThroughEverything: the detail of a block deep in a retained graph is longer than the pane;
// paging through it shows its lifetime, every holder to the root and every frame of its stack.
func TestDetailScrollsThroughEverything(t *testing.T) {
	m := newTestModel(t, fixture(t, "tiny-oom"), 80, 24)
	press(m, "esc", "enter")
	b := m.live.shown[m.live.selected]
	path := m.ix.retainerPath(b, m.Cursor())
	frames := m.snap.Stack(b.Stack)
	if len(path) < 10 || len(frames) < 3 {
		t.Fatalf("the block has %d holders and %d frames: the test needs a long detail", len(path), len(frames))
	}
	want := []string{"lifetime", "allocated at event", path[len(path)-1], frameLine(m.snap, frames[len(frames)-1])}
	for _, h := range path {
		want = append(want, "← "+h)
	}
	seen := map[string]bool{}
	for range 20 {
		out := screen(m)
		for _, w := range want {
			if strings.Contains(out, w) {
				seen[w] = true
			}
		}
		press(m, "ctrl+d")
	}
	for _, w := range want {
		if !seen[w] {
			t.Errorf("paging through the detail never shows %q", w)
		}
	}
	if !m.live.detail {
		t.Error("ctrl+d left the detail")
	}
}
