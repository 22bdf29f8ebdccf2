package tui

import (
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
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

// TestLiveSetGroups: b groups the live set by site, scope, op and category; each grouping adds up to the
// live set, the categories to what the timeline counts by category, and enter opens a group's blocks.
func TestLiveSetGroups(t *testing.T) {
	m := newTestModel(t, fixture(t, "tiny-oom"), 160, 48)
	press(m, "esc")
	live := m.ix.tl.LiveAt(m.Cursor(), nil)
	var total int64
	for _, b := range live {
		total += b.Size
	}
	byCat := timeline.CategoryBytes(live)
	for _, want := range []groupBy{groupSite, groupScope, groupOp, groupCategory} {
		press(m, "b")
		if m.live.groupBy != want || !m.live.grouped() {
			t.Fatalf("b shows grouping %v, want %v", m.live.groupBy, want)
		}
		var sum int64
		n := 0
		for _, g := range m.live.groups {
			sum += g.bytes
			n += g.count
			if want == groupCategory {
				c, _ := snapshot.ParseCategory(g.name)
				if g.bytes != byCat[c] {
					t.Errorf("category %s: %d bytes, the timeline counts %d", g.name, g.bytes, byCat[c])
				}
			}
		}
		if sum != total || n != len(live) {
			t.Errorf("by %s: %d bytes in %d blocks, the live set is %d in %d", groupNames[want], sum, n, total, len(live))
		}
	}
	press(m, "b", "b") // back to none, then site
	first := m.live.groups[0]
	press(m, "enter")
	if len(m.live.shown) != first.count {
		t.Fatalf("enter on %q lists %d blocks, the group has %d", first.name, len(m.live.shown), first.count)
	}
	for _, b := range m.live.shown {
		if groupName(m.snap, b, groupSite) != first.name {
			t.Errorf("block %d of another site in %q", b.Alloc, first.name)
		}
	}
	press(m, "esc")
	if !m.live.grouped() {
		t.Error("esc does not go back to the groups")
	}
}
