package tui

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"charm.land/bubbles/v2/key"
	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// livePane is the table of blocks alive at the cursor: size, category, module scope, tensor, and when it was
// allocated. Rows new since the previous stop are marked +. enter opens the selected block's stack and
// retainer path; / filters by any column's text; s changes the sort.
type livePane struct {
	ix       *index
	at       int
	rows     []timeline.Allocation
	shown    []timeline.Allocation // rows after the filter, sorted
	added    map[int]bool
	freed    int // blocks freed since the previous stop
	freedB   int64
	selected int
	offset   int
	sortBy   int
	filter   textinput.Model // focused while the filter is typed

	groupBy   groupBy     // the grouping shown (b cycles it)
	groups    []liveGroup // the shown blocks grouped
	groupSel  int         // the selected group
	openGroup string      // the group whose blocks are listed; "" for the groups

	detail     bool // showing the selected block's stack and retainers
	scroll     int  // the detail's first line shown
	allFrames  bool // the detail shows compiled frames too, not only the program's
	toCompiled bool // the detail scrolls to the compiled frames once drawn
	// frameText is each stack's frames as the filter matches them, lower-cased, made once per stack.
	frameText map[snapshot.StackID]string
	// wanted says a block is to be selected once the live set at the cursor comes: the one allocated at
	// event want.
	want   int
	wanted bool
	// text is each row's searchable text (searchText), by its alloc event; filtered is the filter the rows
	// shown were filtered by, lower-cased.
	text     map[int]string
	filtered string
}

// newFilterInput is the / filter's text input: no prompt (the pane says "filter:"), a steady cursor, no
// colours of its own.
func newFilterInput() textinput.Model {
	in := textinput.New()
	in.Prompt = ""
	in.CharLimit = 200
	plain := lipgloss.NewStyle()
	state := textinput.StyleState{Placeholder: plain, Suggestion: plain, Prompt: plain, Text: plain}
	in.SetStyles(textinput.Styles{Focused: state, Blurred: state, Cursor: textinput.CursorStyle{Shape: tea.CursorBar}})
	return in
}

// filtering reports whether the filter is being typed.
func (p *livePane) filtering() bool { return p.filter.Focused() }

var sortNames = []string{"size", "newest", "category", "scope"}

func (p *livePane) setData(ix *index, at int, live, before []timeline.Allocation) {
	if ix != p.ix {
		p.frameText = nil // another file or device: other stacks
	}
	p.ix, p.at, p.rows = ix, at, live
	p.text = nil
	p.added = map[int]bool{}
	p.freed, p.freedB = 0, 0
	if before != nil {
		was := map[int]bool{}
		for _, b := range before {
			was[b.Alloc] = true
		}
		now := map[int]bool{}
		for _, b := range live {
			now[b.Alloc] = true
			if !was[b.Alloc] {
				p.added[b.Alloc] = true
			}
		}
		for _, b := range before {
			if !now[b.Alloc] {
				p.freed++
				p.freedB += b.Size
			}
		}
	}
	p.apply()
	if p.wanted && ix.covers(at) {
		p.selectAlloc(p.want, false)
	}
}

// apply filters and sorts the rows, keeping the selection in range.
func (p *livePane) apply() {
	p.shown = p.shown[:0]
	f := strings.ToLower(p.filter.Value())
	for _, b := range p.rows {
		if (f == "" || strings.Contains(p.searchText(b), f)) && p.inOpenGroup(b) {
			p.shown = append(p.shown, b)
		}
	}
	p.filtered = f
	p.arrange()
}

// narrow filters the rows shown by a filter that contains the one they were filtered by: what it keeps is
// among them, in their order. Typing a filter costs a pass over what the last key left, not over the live
// set, so that a paste arriving as thousands of keys is answered as it arrives.
func (p *livePane) narrow() {
	f := strings.ToLower(p.filter.Value())
	if f == p.filtered {
		return
	}
	if !strings.Contains(f, p.filtered) {
		p.apply()
		return
	}
	kept := p.shown[:0]
	for _, b := range p.shown {
		if strings.Contains(p.searchText(b), f) {
			kept = append(kept, b)
		}
	}
	p.shown, p.filtered = kept, f
	p.arrange()
}

// searchText is a row's searchable text, lower-cased, made once per row at the cursor.
func (p *livePane) searchText(b timeline.Allocation) string {
	if t, ok := p.text[b.Alloc]; ok {
		return t
	}
	if p.text == nil {
		p.text = map[int]string{}
	}
	t := strings.ToLower(p.describe(b))
	p.text[b.Alloc] = t
	return t
}

// arrange groups and sorts the rows shown, keeping the selection in range.
func (p *livePane) arrange() {
	p.groups = nil
	if p.grouped() {
		p.groups = groupLive(p.ix.snap, p.shown, p.groupBy)
	}
	switch sortNames[p.sortBy] {
	case "newest":
		slices.SortStableFunc(p.shown, func(a, b timeline.Allocation) int { return cmp.Compare(b.Alloc, a.Alloc) })
	case "category":
		slices.SortStableFunc(p.shown, func(a, b timeline.Allocation) int { return cmp.Compare(a.Category, b.Category) })
	case "scope":
		slices.SortStableFunc(p.shown, func(a, b timeline.Allocation) int {
			return cmp.Compare(p.ix.snap.String(a.Scope), p.ix.snap.String(b.Scope))
		})
	}
	p.selected = min(p.selected, max(len(p.shown)-1, 0))
}

// describe is a row's searchable text: its columns and its stack's frames.
func (p *livePane) describe(b timeline.Allocation) string {
	s := p.ix.snap
	return b.Category.String() + " " + s.String(b.Scope) + " " + s.String(b.Label) + " " + b.Phase.String() + " " + p.frames(b.Stack)
}

// frames returns the text of a stack's frames, "function file:line" each.
func (p *livePane) frames(id snapshot.StackID) string {
	if id == 0 {
		return ""
	}
	if p.frameText == nil {
		p.frameText = map[snapshot.StackID]string{}
	}
	if t, ok := p.frameText[id]; ok {
		return t
	}
	var b strings.Builder
	for _, f := range p.ix.snap.Stack(id) {
		b.WriteString(p.ix.snap.FrameString(f))
		b.WriteByte(' ')
	}
	t := strings.ToLower(b.String())
	p.frameText[id] = t
	return t
}

// selectAlloc selects the row of the block allocated at event alloc, clearing the filter if it hides it;
// later, when the live set at the cursor is still to come (a paged run reading its pages back).
func (p *livePane) selectAlloc(alloc int, later bool) {
	p.detail = false
	p.want, p.wanted = alloc, later
	if later {
		return
	}
	for pass := 0; pass < 2; pass++ {
		for i, b := range p.shown {
			if b.Alloc == alloc {
				p.selected = i
				return
			}
		}
		p.filter.Reset()
		p.apply()
	}
}

// onKey answers a key in a pane h lines high.
func (p *livePane) onKey(msg tea.KeyPressMsg, k KeyMap, h int) action {
	switch {
	case p.detail && key.Matches(msg, k.Back, k.Detail):
		p.detail = false
	case p.detail && key.Matches(msg, k.AllFrames):
		p.allFrames = !p.allFrames
		p.toCompiled = p.allFrames // bring the frames a asked for into view
	case p.detail:
		p.scrollDetail(msg, k, h)
	case key.Matches(msg, k.Group):
		return say(p.cycleGroup())
	case p.grouped() && key.Matches(msg, k.Up, k.Down, k.PageUp, k.PageDown):
		p.groupSel, _ = listMove(msg, k, p.groupSel, len(p.groups), h-2)
	case p.grouped() && key.Matches(msg, k.Detail):
		if p.groupSel < len(p.groups) {
			p.openGroup, p.selected = p.groups[p.groupSel].name, 0
			p.apply()
		}
	case p.openGroup != "" && key.Matches(msg, k.Back) && p.filter.Value() == "":
		p.openGroup = ""
		p.apply()
	case key.Matches(msg, k.Up, k.Down, k.PageUp, k.PageDown):
		p.selected, _ = listMove(msg, k, p.selected, len(p.shown), h-2)
	case key.Matches(msg, k.Detail):
		p.detail, p.scroll = len(p.shown) > 0, 0
	case key.Matches(msg, k.Sort):
		p.sortBy = (p.sortBy + 1) % len(sortNames)
		p.apply()
		return say("live set sorted by " + sortNames[p.sortBy])
	case key.Matches(msg, k.Filter):
		return action{cmd: p.filter.Focus()}
	case key.Matches(msg, k.Back):
		if p.filter.Value() != "" {
			p.filter.Reset()
			p.apply()
		}
	}
	return action{}
}

// onFilterKey edits the filter while typing it: enter keeps it, esc clears it. A paste (tea.PasteMsg) is
// typed at once. It reports whether the key changed the filter (its text, its cursor, its focus): keys past
// its length change nothing.
func (p *livePane) onFilterKey(msg tea.Msg) (tea.Cmd, bool) {
	value, pos := p.filter.Value(), p.filter.Position()
	var cmd tea.Cmd
	switch k, _ := msg.(tea.KeyPressMsg); k.String() {
	case "enter":
		p.filter.Blur()
	case "esc":
		p.filter.Reset()
		p.filter.Blur()
	default:
		p.filter, cmd = p.filter.Update(msg)
	}
	p.narrow()
	return cmd, !p.filter.Focused() || p.filter.Value() != value || p.filter.Position() != pos
}

// view renders the table, or the selected block's detail, in w x h.
func (p *livePane) view(s Styles, w, h int) string {
	if p.ix == nil {
		return ""
	}
	if p.detail && p.selected < len(p.shown) {
		return p.detailView(s, w, h)
	}
	var total int64
	for _, b := range p.rows {
		total = sum(total, b.Size)
	}
	if p.grouped() {
		return p.groupsView(s, w, h, total)
	}
	head := fmt.Sprintf("%d blocks, %s live", len(p.rows), units.FormatSize(total))
	if p.filter.Value() != "" { // what the filter keeps, of all
		var kept int64
		for _, b := range p.shown {
			kept = sum(kept, b.Size)
		}
		head = fmt.Sprintf("%d of %d blocks, %s of %s live", len(p.shown), len(p.rows), units.FormatSize(kept), units.FormatSize(total))
	}
	if p.freed > 0 || len(p.added) > 0 {
		head += fmt.Sprintf(" · since last stop +%d new, -%d freed (%s)", len(p.added), p.freed, units.FormatSize(p.freedB))
	}
	switch {
	case p.filtering():
		head += " · filter: " + p.filter.View()
	case p.filter.Value() != "":
		head += " · filter: " + p.filter.Value()
	}
	if p.openGroup != "" {
		head += fmt.Sprintf(" · %s %s: %d blocks (esc: the groups)", groupNames[p.groupBy], p.openGroup, len(p.shown))
	}
	head += " · sort: " + sortNames[p.sortBy]
	lines := []string{s.Muted.Render(ansi.Truncate(head, w, "…"))}
	wide := w >= 110 // room for when each block was allocated
	cols := fmt.Sprintf("  %10s  %-15s %-*s  %s", "size", "category", scopeWidth(w), "scope", "tensor")
	if wide {
		cols = fmt.Sprintf("  %10s  %-15s %-10s %4s  %-*s  %s", "size", "category", "phase", "iter", scopeWidth(w), "scope", "tensor")
	}
	lines = append(lines, s.Header.Render(ansi.Truncate(cols, w, "")))
	rows := h - 2
	if p.selected < p.offset {
		p.offset = p.selected
	}
	if p.selected >= p.offset+rows {
		p.offset = p.selected - rows + 1
	}
	for i := p.offset; i < len(p.shown) && i < p.offset+rows; i++ {
		b := p.shown[i]
		e := &b
		mark := " "
		if p.added[b.Alloc] {
			mark = "+"
		}
		scope := p.ix.snap.String(e.Scope)
		if scope == "" {
			scope = "-"
		}
		what := p.what(b)
		line := fmt.Sprintf("%s %10s  %-15s %-*s  %s", mark, units.FormatSize(b.Size), b.Category,
			scopeWidth(w), ansi.Truncate(scope, scopeWidth(w), "…"), what)
		if wide {
			line = fmt.Sprintf("%s %10s  %-15s %-10s %4s  %-*s  %s", mark, units.FormatSize(b.Size), b.Category, e.Phase, iterationColumn(e.Iteration),
				scopeWidth(w), ansi.Truncate(scope, scopeWidth(w), "…"), what)
		}
		line = ansi.Truncate(line, w, "…")
		if i == p.selected {
			line = s.Selected.Render(padRight(line, w))
		} else {
			line = s.Category[b.Category].Render(line)
		}
		lines = append(lines, line)
	}
	switch {
	case len(p.rows) == 0:
		lines = append(lines, s.Muted.Render("  no block is alive here"))
	case len(p.shown) == 0:
		lines = append(lines, s.Muted.Render(ansi.Truncate(fmt.Sprintf("  no live block matches %q (esc clears the filter)", p.filter.Value()), w, "…")))
	}
	return strings.Join(lines, "\n")
}

// what says what a block holds: its tensor label, or, for snapshots without labels (PyTorch's), the code
// that allocated it.
func (p *livePane) what(b timeline.Allocation) string {
	snap := p.ix.snap
	l := snap.String(b.Label)
	// A block rebuilt as alive before the trace began still names where it was allocated when its frames do.
	if l != "" && l != snapshot.PreExistingLabel {
		return l
	}
	if f := snap.Site(b.Stack); f != 0 {
		return "at " + snap.FrameString(f)
	}
	return l
}

// title names a block in its detail: what, and for a block rebuilt from the final state, that it was
// allocated before the trace.
func (p *livePane) title(b timeline.Allocation) string {
	what, label := p.what(b), p.ix.snap.String(b.Label)
	if label == snapshot.PreExistingLabel && what != label {
		return what + " · allocated before the trace"
	}
	return what
}

// iterationColumn is a block's iteration in the live set's column: "-" outside any (setup, or a trace without
// iterations), as where says "outside any iteration" rather than a number that is none.
func iterationColumn(it int32) string {
	if it < 0 {
		return "-"
	}
	return fmt.Sprint(it)
}

func scopeWidth(w int) int { return min(max(w/4, 12), 40) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shortFile keeps the last two elements of a path.
func shortFile(f string) string {
	parts := strings.Split(f, "/")
	if len(parts) > 2 {
		return strings.Join(parts[len(parts)-2:], "/")
	}
	return f
}

func padRight(s string, w int) string {
	if n := ansi.StringWidth(s); n < w {
		return s + strings.Repeat(" ", w-n)
	}
	return s
}
