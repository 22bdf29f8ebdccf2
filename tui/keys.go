package tui

import "charm.land/bubbles/v2/key"

// KeyMap is every key the TUI answers to. The habits are memray's, nvitop's and lazygit's: arrows and hjkl
// to move, ? for help, q to quit, / to filter, enter for detail, esc to go back.
type KeyMap struct {
	StepBack, StepForward    key.Binding
	JumpBack, JumpForward    key.Binding // 1% of the events
	PrevPhase, NextPhase     key.Binding
	PrevIter, NextIter       key.Binding
	Peak, OOM                key.Binding
	Start, End               key.Binding
	ZoomIn, ZoomOut, ZoomAll key.Binding
	PanLeft, PanRight        key.Binding
	TimeAxis                 key.Binding // the x-axis by events or by time
	Up, Down                 key.Binding
	PageUp, PageDown         key.Binding
	NextPane, PrevPane       key.Binding
	Live, Categories         key.Binding
	Segments, Leaks          key.Binding
	Fixes, Device            key.Binding
	Ranks                    key.Binding
	Detail, Back             key.Binding
	Filter, Sort             key.Binding
	Group                    key.Binding // the live set's grouping
	Toggle, Rerun            key.Binding
	AllFrames, NextDevice    key.Binding
	Fit                      key.Binding // the fixes pane's plans that fit
	Apply                    key.Binding // the fixes pane's best measured fix
	Repaint                  key.Binding // draw the whole screen again, over what another program wrote on it
	Help, Quit               key.Binding
}

// DefaultKeyMap returns the key map.
func DefaultKeyMap() KeyMap {
	b := func(help string, desc string, keys ...string) key.Binding {
		return key.NewBinding(key.WithKeys(keys...), key.WithHelp(help, desc))
	}
	return KeyMap{
		StepBack:    b("←/h", "event back", "left", "h"),
		StepForward: b("→/l", "event on", "right", "l"),
		JumpBack:    b("H", "1% back", "H", "shift+left"),
		JumpForward: b("L", "1% on", "L", "shift+right"),
		PrevPhase:   b("[", "prev phase", "["),
		NextPhase:   b("]", "next phase", "]"),
		PrevIter:    b("{", "prev iteration", "{"),
		NextIter:    b("}", "next iteration", "}"),
		Peak:        b("p", "peak", "p"),
		OOM:         b("o", "OOM", "o"),
		Start:       b("g/home", "start (g: a list's top)", "g", "home"),
		End:         b("G/end", "end (G: a list's end)", "G", "end"),
		ZoomIn:      b("+", "zoom in", "+", "="),
		ZoomOut:     b("-", "zoom out", "-"),
		ZoomAll:     b("0", "zoom all", "0"),
		PanLeft:     b("<", "pan left", "<"),
		PanRight:    b(">", "pan right", ">"),
		TimeAxis:    b("t", "x-axis: events/time", "t"),
		Up:          b("↑/k", "up", "up", "k"),
		Down:        b("↓/j", "down", "down", "j"),
		PageUp:      b("pgup/ctrl+u", "page up", "pgup", "ctrl+u"),
		PageDown:    b("pgdn/ctrl+d", "page down", "pgdown", "ctrl+d"),
		NextPane:    b("tab", "next pane", "tab"),
		PrevPane:    b("shift+tab", "prev pane", "shift+tab"),
		Live:        b("1", "live set", "1"),
		Categories:  b("2", "categories", "2"),
		Segments:    b("3", "segments", "3"),
		Leaks:       b("4", "leaks", "4"),
		Fixes:       b("5", "fixes", "5"),
		Device:      b("6", "device", "6"),
		Ranks:       b("7", "ranks", "7"),
		Detail:      b("enter", "detail", "enter"),
		Back:        b("esc", "back", "esc"),
		Filter:      b("/", "filter", "/"),
		Sort:        b("s", "sort", "s"),
		Group:       b("b", "group by", "b"),
		Toggle:      b("space", "change", "space"),
		Rerun:       b("r", "re-run", "r"),
		AllFrames:   b("a", "all frames (detail)", "a"),
		NextDevice:  b("d", "next device", "d"),
		Fit:         b("f", "plans that fit", "f"),
		Apply:       b("a", "apply best fix (fixes)", "a"),
		Repaint:     b("ctrl+l", "repaint", "ctrl+l"),
		Help:        b("?", "help", "?"),
		Quit:        b("q", "quit", "q", "ctrl+c"),
	}
}

// ShortHelp is the footer: the keys that matter most.
func (k KeyMap) ShortHelp() []key.Binding {
	return []key.Binding{k.StepForward, k.NextPhase, k.NextIter, k.Peak, k.OOM, k.NextPane, k.Help, k.Quit}
}

// FullHelp is the help overlay, in groups.
func (k KeyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{
		{k.StepBack, k.StepForward, k.JumpBack, k.JumpForward, k.PrevPhase, k.NextPhase, k.PrevIter, k.NextIter},
		{k.Peak, k.OOM, k.Start, k.End, k.ZoomIn, k.ZoomOut, k.ZoomAll, k.PanLeft, k.PanRight, k.TimeAxis},
		{k.NextPane, k.PrevPane, k.Live, k.Categories, k.Segments, k.Leaks, k.Fixes, k.Device, k.Ranks},
		{k.Up, k.Down, k.PageUp, k.PageDown, k.Detail, k.Back, k.Filter, k.Sort, k.Group, k.Toggle, k.Rerun, k.Fit, k.Apply, k.AllFrames, k.NextDevice, k.Repaint, k.Help, k.Quit},
	}
}
