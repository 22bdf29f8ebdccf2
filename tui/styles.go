package tui

import (
	"image/color"
	"strings"

	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Styles is every style the TUI draws with. Without colour (NO_COLOR, a dumb terminal, a pipe) the styles
// keep only what survives monochrome: bold, reverse and the characters themselves.
type Styles struct {
	Title, Status, Muted, Bold, Error, Warn, Good lipgloss.Style
	Tab, ActiveTab, Selected, Header              lipgloss.Style
	Allocated, Reserved, Capacity, Cursor, After  lipgloss.Style
	Phase                                         [snapshot.NumPhases]lipgloss.Style
	Category                                      [snapshot.NumCategories]lipgloss.Style
	Border                                        lipgloss.Style
}

// DefaultStyles returns the styles for the colour profile p.
func DefaultStyles(p colorprofile.Profile) Styles {
	plain := lipgloss.NewStyle()
	s := Styles{
		Title: plain.Bold(true), Status: plain, Muted: plain.Faint(true), Bold: plain.Bold(true),
		Error: plain.Bold(true), Warn: plain.Bold(true), Good: plain,
		Tab: plain, ActiveTab: plain.Reverse(true).Bold(true), Selected: plain.Reverse(true), Header: plain.Bold(true).Underline(true),
		Allocated: plain, Reserved: plain.Faint(true), Capacity: plain.Bold(true), Cursor: plain.Reverse(true), After: plain.Bold(true),
		Border: plain,
	}
	for i := range s.Phase {
		s.Phase[i] = plain
	}
	for i := range s.Category {
		s.Category[i] = plain
	}
	if p <= colorprofile.Ascii {
		return s
	}
	c := func(ansi256 string) color.Color { return lipgloss.Color(ansi256) }
	s.Title = s.Title.Foreground(c("15")).Background(c("24"))
	s.Muted = plain.Foreground(c("245"))
	s.Error = s.Error.Foreground(c("196"))
	s.Warn = s.Warn.Foreground(c("214"))
	s.Good = s.Good.Foreground(c("70"))
	s.ActiveTab = s.ActiveTab.Foreground(c("15")).Background(c("24")).Reverse(false)
	s.Allocated = plain.Foreground(c("39"))
	s.Reserved = plain.Foreground(c("240"))
	s.Capacity = plain.Foreground(c("196")).Bold(true)
	s.After = plain.Foreground(c("16")).Background(c("214")).Bold(true) // a cell of its own colour: it shows over the bars
	s.Border = plain.Foreground(c("240"))
	phase := map[snapshot.Phase]string{
		snapshot.PhaseSetup: "245", snapshot.PhaseData: "250", snapshot.PhaseForward: "33", snapshot.PhaseBackward: "166",
		snapshot.PhaseRecompute: "172", snapshot.PhaseOptimizer: "135", snapshot.PhaseZeroGrad: "244", snapshot.PhaseEval: "71",
		snapshot.PhaseLoad: "94",
	}
	for p, col := range phase {
		s.Phase[p] = plain.Foreground(c("15")).Background(c(col))
	}
	// PyTorch's memory-profiler colours, as close as 256 colours get.
	cat := map[snapshot.Category]string{
		snapshot.CategoryParameter: "28", snapshot.CategoryGradient: "20", snapshot.CategoryOptimizerState: "178",
		snapshot.CategoryActivation: "160", snapshot.CategoryTemporary: "141", snapshot.CategoryInput: "250",
		snapshot.CategoryAutogradDetail: "69", snapshot.CategoryAMPCache: "37", snapshot.CategoryUnknown: "244",
	}
	for k, col := range cat {
		s.Category[k] = plain.Foreground(c(col))
	}
	return s
}

// phaseLetter is the one-character name of a phase on the band under the timeline.
var phaseLetter = [snapshot.NumPhases]byte{'.', 's', 'd', 'F', 'B', 'R', 'O', 'z', 'e', 'L'}

// styleID names a style for runs of cells: drawing a run of equal cells is one Render, not one per cell.
type styleID int

const (
	stylePlain styleID = iota
	styleMuted
	styleAllocated
	styleReserved
	styleCapacity
	styleAfter
	stylePhase  // + the phase
	numStyleIDs = stylePhase + styleID(snapshot.NumPhases)
)

// byID returns the style an ID names.
func (s *Styles) byID(id styleID) lipgloss.Style {
	switch id {
	case styleMuted:
		return s.Muted
	case styleAllocated:
		return s.Allocated
	case styleReserved:
		return s.Reserved
	case styleCapacity:
		return s.Capacity
	case styleAfter:
		return s.After
	}
	if id >= stylePhase && id < numStyleIDs {
		return s.Phase[id-stylePhase]
	}
	return s.Status
}

// runs collects cells and renders each run of cells with the same style at once.
type runs struct {
	cells []rune
	ids   []styleID
	cur   []bool
}

func (r *runs) add(ch rune, id styleID, cursor bool) {
	r.cells, r.ids, r.cur = append(r.cells, ch), append(r.ids, id), append(r.cur, cursor)
}

func (r *runs) render(b *strings.Builder, style func(styleID) lipgloss.Style) {
	for i := 0; i < len(r.cells); {
		j := i + 1
		for j < len(r.cells) && r.ids[j] == r.ids[i] && r.cur[j] == r.cur[i] {
			j++
		}
		st := style(r.ids[i])
		if r.cur[i] {
			st = st.Reverse(true)
		}
		b.WriteString(st.Render(string(r.cells[i:j])))
		i = j
	}
}
