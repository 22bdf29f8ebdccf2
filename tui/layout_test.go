package tui

import (
	"fmt"
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
)

// The TUI at 80x24 and smaller: what must always show, what scrolls, and what a terminal too small shows.

// TestKeyHintsAtEverySize: whatever the width, from the smallest the TUI draws in up, the footer ends with
// how to get help and how to quit, and every line fits.
func TestKeyHintsAtEverySize(t *testing.T) {
	for _, sz := range [][2]int{{minWidth, minHeight}, {61, 17}, {72, 20}, {80, 24}, {100, 30}, {160, 48}} {
		m := newTestModel(t, fixture(t, "tiny-oom"), sz[0], sz[1])
		for _, pane := range []string{"1", "5", "4"} {
			press(m, pane)
			lines := strings.Split(screen(m), "\n")
			if last := lines[len(lines)-1]; !strings.HasSuffix(strings.TrimSpace(last), "? help • q quit") {
				t.Errorf("%dx%d, pane %s: the footer %q does not end with how to get help and quit", sz[0], sz[1], pane, last)
			}
			for i, l := range lines {
				if ansi.StringWidth(l) > sz[0] {
					t.Errorf("%dx%d, pane %s: line %d is %d cells wide", sz[0], sz[1], pane, i, ansi.StringWidth(l))
				}
			}
		}
	}
}

// TestTooSmallSaysSoAndQuits: below the smallest size, the screen says the terminal is too small, what it
// needs and that q quits; keys other than q do nothing, q quits, and a resize back draws the TUI again.
func TestTooSmallSaysSoAndQuits(t *testing.T) {
	for _, sz := range [][2]int{{40, 12}, {minWidth - 1, minHeight}, {minWidth, minHeight - 1}, {80, 8}} {
		m := newTestModel(t, fixture(t, "tiny-oom"), sz[0], sz[1])
		out := screen(m)
		for _, want := range []string{"terminal too small (need 60x16)", "q quits"} {
			if !strings.Contains(out, want) {
				t.Errorf("%dx%d: the screen lacks %q:\n%s", sz[0], sz[1], want, out)
			}
		}
		at := m.Cursor()
		press(m, "right", "5", "?")
		if m.Cursor() != at || m.Pane() != "Live" || m.showHelp {
			t.Errorf("%dx%d: keys acted behind the notice: cursor %d, pane %s, help %v", sz[0], sz[1], m.Cursor(), m.Pane(), m.showHelp)
		}
		if _, cmd := m.Update(keyPress("q")); cmd == nil {
			t.Errorf("%dx%d: q does not quit", sz[0], sz[1])
		} else if _, ok := cmd().(tea.QuitMsg); !ok {
			t.Errorf("%dx%d: q does not quit", sz[0], sz[1])
		}
		m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
		if out := screen(m); strings.Contains(out, "too small") || !strings.Contains(out, "q quit") {
			t.Errorf("%dx%d resized to 80x24:\n%s", sz[0], sz[1], out)
		}
	}
}

// TestHelpScrollsToEveryKey: at 80x24 the help says at once how to close it and quit, scrolls with pgdn to
// every key of the key map and the timeline's legend, and keys behind it do nothing.
func TestHelpScrollsToEveryKey(t *testing.T) {
	m := newTestModel(t, fixture(t, "tiny-oom"), 80, 24)
	at := m.Cursor()
	press(m, "?")
	seen := screen(m)
	if title := strings.SplitN(seen, "\n", 2)[0]; !strings.Contains(title, "q quits") || !strings.Contains(title, "esc closes") {
		t.Errorf("the help's first line %q does not say how to close it and quit", title)
	}
	for range 10 {
		press(m, "pgdown")
		seen += screen(m)
	}
	for _, group := range m.keys.FullHelp() {
		for _, b := range group {
			if !strings.Contains(seen, b.Help().Desc) {
				t.Errorf("scrolling the help never shows %q (%s)", b.Help().Desc, b.Help().Key)
			}
		}
	}
	if !strings.Contains(seen, "phase band:") {
		t.Error("scrolling the help never shows the timeline's legend")
	}
	press(m, "right", "5")
	if m.Cursor() != at || m.Pane() != "Live" {
		t.Errorf("keys acted behind the help: cursor %d, pane %s", m.Cursor(), m.Pane())
	}
	press(m, "esc")
	if m.showHelp {
		t.Error("esc does not close the help")
	}
}

// TestFixesPaneScrollsToTheComparison: at 80x24, after a applies the best fix, the pane shows the comparison
// whole, the category rows that explain the drop included; pgup and pgdn move the page.
func TestFixesPaneScrollsToTheComparison(t *testing.T) {
	m := newTestModel(t, fixture(t, "tiny-oom"), 80, 24)
	pressRun(m, "5", "a")
	if m.fixes.after == nil {
		t.Fatalf("a re-ran nothing: %v", m.fixes.err)
	}
	out := screen(m)
	for _, want := range []string{"before", "peak allocated", "  activation", "  gradient", "lines "} {
		if !strings.Contains(out, want) {
			t.Errorf("after a, the pane lacks %q:\n%s", want, out)
		}
	}
	press(m, "pgup")
	if up := screen(m); up == out || !strings.Contains(up, "best (fits") {
		t.Errorf("pgup does not bring the ranked fixes back:\n%s", up)
	}
	press(m, "pgdown", "pgdown")
	if down := screen(m); !strings.Contains(down, "leak bug") {
		t.Errorf("pgdn does not reach the settings:\n%s", down)
	}
}

// TestFilteredGroupsCountWhatTheFilterKeeps: grouped, a filter's head counts the blocks and bytes it keeps
// of those alive, and each group's share is of what it keeps.
func TestFilteredGroupsCountWhatTheFilterKeeps(t *testing.T) {
	m := newTestModel(t, fixture(t, "tiny-oom"), 100, 30)
	press(m, "esc", "/", "g", "e", "l", "u", "enter", "b")
	all, kept := len(m.live.rows), len(m.live.shown)
	if kept == 0 || kept >= all {
		t.Fatalf("the filter keeps %d of %d blocks", kept, all)
	}
	var bytes int64
	for _, b := range m.live.shown {
		bytes += b.Size
	}
	out := screen(m)
	if want := fmt.Sprintf("%d of %d blocks, ", kept, all); !strings.Contains(out, want) {
		t.Errorf("the grouped head does not count what the filter keeps (%q):\n%s", want, out)
	}
	var shares int64
	for _, g := range m.live.groups {
		shares += g.bytes
	}
	if shares != bytes || !strings.Contains(out, percent(m.live.groups[0].bytes, bytes)) {
		t.Errorf("groups sum to %d of the %d bytes kept; the first's share is not of them:\n%s", shares, bytes, out)
	}
}

// TestPasteIntoTheFilter pastes 10,000 characters into the / filter, as a terminal with bracketed paste
// delivers them (one message) and as one without delivers them (a key each): the filter takes its first 200,
// the live set shows what they match (nothing), and a key past the filter's length changes nothing on the
// screen, so the screen is not drawn again for it (BenchmarkPasteIntoFilter measures what a paste costs).
func TestPasteIntoTheFilter(t *testing.T) {
	text := strings.Repeat("gelu", 2500)
	for _, bracketed := range []bool{true, false} {
		m := newTestModel(t, fixture(t, "tiny-oom"), 80, 24)
		press(m, "esc", "/")
		if bracketed {
			m.Update(tea.PasteMsg{Content: text})
		} else {
			for _, r := range text {
				m.Update(tea.KeyPressMsg{Code: r, Text: string(r)})
			}
		}
		if got := m.live.filter.Value(); got != text[:200] {
			t.Errorf("bracketed %v: the filter holds %d characters, want the first 200", bracketed, len(got))
		}
		if out := screen(m); len(m.live.shown) != 0 || !strings.Contains(out, "no live block matches") {
			t.Errorf("bracketed %v: %d blocks match a filter of 200 characters:\n%s", bracketed, len(m.live.shown), out)
		}
		m.View()
		before := m.frame.at
		m.Update(tea.KeyPressMsg{Code: 'x', Text: "x"})
		m.View()
		if m.frame.at != before || m.live.filter.Value() != text[:200] {
			t.Errorf("bracketed %v: a key past the filter's length drew the screen again", bracketed)
		}
		press(m, "enter")
		if m.live.filtering() || m.live.filter.Value() != text[:200] {
			t.Errorf("bracketed %v: enter after the paste: filtering %v", bracketed, m.live.filtering())
		}
	}
}
