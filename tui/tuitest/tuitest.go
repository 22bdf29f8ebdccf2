// Package tuitest drives the TUI's model as a user would, for tests: every key it answers to, on every pane,
// with the commands the keys start run as the program runs them, and any panic reported with the keys that
// led to it. The TUI's own tests drive it on paged runs; the command line's drive it on the hostile corpus.
package tuitest

import (
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/tui"
)

// Keys returns a key press for every key of every binding of the TUI's key map, in the key map's order,
// quitting left out. It fails t on a binding's key that no key press types: a key the tests could not press
// is a key nobody tested.
func Keys(t testing.TB) []tea.KeyPressMsg {
	t.Helper()
	typed := typable()
	km := tui.DefaultKeyMap()
	quit := km.Quit.Keys()
	var out []tea.KeyPressMsg
	seen := map[string]bool{}
	for _, group := range km.FullHelp() {
		for _, b := range group {
			for _, k := range b.Keys() {
				if seen[k] || slices.Contains(quit, k) {
					continue
				}
				seen[k] = true
				msg, ok := typed[k]
				if !ok {
					t.Fatalf("the key %q of %q cannot be typed", k, b.Help().Desc)
				}
				out = append(out, msg)
			}
		}
	}
	return out
}

// Key returns the key press a user types for k ("enter", "pgdown", "ctrl+d", "x").
func Key(k string) (tea.KeyPressMsg, bool) {
	msg, ok := typable()[k]
	return msg, ok
}

// typable maps every key press a keyboard makes to its name, as tea's KeyPressMsg.String spells it: the
// printable characters, and the named keys alone and with ctrl, alt and shift.
func typable() map[string]tea.KeyPressMsg {
	out := map[string]tea.KeyPressMsg{}
	add := func(msg tea.KeyPressMsg) {
		if _, ok := out[msg.String()]; !ok {
			out[msg.String()] = msg
		}
	}
	for r := rune(' '); r <= '~'; r++ {
		msg := tea.KeyPressMsg{Code: r, Text: string(r)}
		if r == ' ' {
			msg.Code = tea.KeySpace
		}
		add(msg)
	}
	named := []rune{tea.KeyUp, tea.KeyDown, tea.KeyLeft, tea.KeyRight, tea.KeyPgUp, tea.KeyPgDown, tea.KeyHome, tea.KeyEnd,
		tea.KeyEnter, tea.KeyEscape, tea.KeyTab, tea.KeyBackspace, tea.KeyDelete, tea.KeySpace}
	for _, mod := range []tea.KeyMod{0, tea.ModCtrl, tea.ModAlt, tea.ModShift} {
		for _, c := range named {
			add(tea.KeyPressMsg{Code: c, Mod: mod})
		}
		if mod != 0 {
			for r := 'a'; r <= 'z'; r++ {
				add(tea.KeyPressMsg{Code: r, Mod: mod})
			}
		}
	}
	return out
}

// A Driver runs a model as the program does: each command in a goroutine of its own, each message it returns
// through Update, the screen drawn after each. A panic in Update, View or a command fails the test with the
// keys pressed before it.
type Driver struct {
	t       testing.TB
	m       tea.Model
	w, h    int
	msgs    chan result
	pending int
	started time.Time      // when the newest command started
	running map[int]string // the commands running, by id: the keys after which each started
	nextID  int
	pressed []string // the keys pressed so far, for the failure message
	failed  bool
}

// result is what a command returned, or the panic it raised; id is the command's.
type result struct {
	id    int
	msg   tea.Msg
	panic string
}

// NewDriver starts m at w x h: its Init commands, a window size.
func NewDriver(t testing.TB, m tea.Model, w, h int) *Driver {
	d := &Driver{t: t, m: m, w: w, h: h, msgs: make(chan result, 256), running: map[int]string{}}
	d.update(tea.WindowSizeMsg{Width: w, Height: h})
	d.start(d.guard(func() tea.Cmd { return m.Init() })())
	return d
}

// Failed reports whether the model panicked.
func (d *Driver) Failed() bool { return d.failed }

// Press types a key and handles what follows until the model is idle for quiet.
func (d *Driver) Press(msg tea.KeyPressMsg, quiet time.Duration) {
	if d.failed {
		return
	}
	d.pressed = append(d.pressed, msg.String())
	d.update(msg)
	d.Settle(quiet)
}

// Send hands the model a message, as the program would (a paste, a resize), and handles what follows.
func (d *Driver) Send(msg tea.Msg, quiet time.Duration) {
	if d.failed {
		return
	}
	d.pressed = append(d.pressed, fmt.Sprintf("%T", msg))
	d.update(msg)
	d.Settle(quiet)
}

// Settle handles the messages of the commands running until none started less than quiet ago is left: what
// takes longer (a re-run, a cursor's blink) arrives while later keys are pressed, as it does for a user who
// types on.
func (d *Driver) Settle(quiet time.Duration) {
	for d.pending > 0 && !d.failed {
		wait := quiet - time.Since(d.started)
		if wait <= 0 {
			return
		}
		select {
		case r := <-d.msgs:
			d.pending--
			d.handle(r)
		case <-time.After(wait):
			return
		}
	}
}

// Finish waits for every command still running, up to the deadline; one still running then is a hang.
func (d *Driver) Finish(deadline time.Duration) {
	timeout := time.After(deadline)
	for d.pending > 0 && !d.failed {
		select {
		case r := <-d.msgs:
			d.pending--
			d.handle(r)
		case <-timeout:
			var which []string
			for _, after := range d.running {
				which = append(which, after)
			}
			d.fail(fmt.Sprintf("%d commands still running %v after the last key, started after the keys %q", d.pending, deadline, which))
			return
		}
	}
}

// Screen returns the screen as drawn now, without its styles.
func (d *Driver) Screen() string {
	var s string
	d.guard(func() tea.Cmd {
		s = ansi.Strip(d.m.View().Content)
		return nil
	})()
	return s
}

func (d *Driver) handle(r result) {
	delete(d.running, r.id)
	switch msg := r.msg.(type) {
	case nil:
		if r.panic != "" {
			d.fail("a command panicked: " + r.panic)
		}
	case tea.BatchMsg:
		for _, c := range msg {
			d.start(c)
		}
	case tea.QuitMsg:
	default:
		d.update(msg)
	}
}

// update hands msg to the model, starts the command it returns and draws the screen, checking its size.
func (d *Driver) update(msg tea.Msg) {
	var next tea.Cmd
	d.guard(func() tea.Cmd {
		_, next = d.m.Update(msg)
		screen := ansi.Strip(d.m.View().Content)
		for i, line := range strings.Split(screen, "\n") {
			if w := ansi.StringWidth(line); w > d.w {
				panic(fmt.Sprintf("line %d is %d cells wide at %d columns: %q", i, w, d.w, line))
			}
		}
		if n := strings.Count(screen, "\n") + 1; n > d.h {
			panic(fmt.Sprintf("the screen has %d lines at %d rows", n, d.h))
		}
		return nil
	})()
	d.start(next)
}

func (d *Driver) start(c tea.Cmd) {
	if c == nil || d.failed {
		return
	}
	d.pending++
	d.started = time.Now()
	d.nextID++
	id := d.nextID
	d.running[id] = strings.Join(d.pressed[max(len(d.pressed)-6, 0):], " ")
	go func() {
		defer func() {
			if r := recover(); r != nil {
				d.msgs <- result{id: id, panic: fmt.Sprintf("%v\n%s", r, debug.Stack())}
			}
		}()
		d.msgs <- result{id: id, msg: c()}
	}()
}

// guard runs f, turning a panic into the test's failure.
func (d *Driver) guard(f func() tea.Cmd) func() tea.Cmd {
	return func() (c tea.Cmd) {
		defer func() {
			if r := recover(); r != nil {
				d.fail(fmt.Sprintf("panic: %v\n%s", r, debug.Stack()))
				c = nil
			}
		}()
		return f()
	}
}

func (d *Driver) fail(why string) {
	if d.failed {
		return
	}
	d.failed = true
	keys := d.pressed
	if len(keys) > 40 {
		keys = keys[len(keys)-40:]
	}
	d.t.Errorf("after the keys %q: %s", keys, why)
}

// EveryKey presses, on every pane, every key the TUI answers to, each from the pane's list, then (depth 2)
// from what enter opens there, then (depth 3) from what enter opens after that key, and esc back: the
// sequences a user who tries every key makes. The panes are those of the key map's pane keys (1-7); keys
// come from Keys. quiet is how long a key's commands may take before the next key is pressed.
func EveryKey(t testing.TB, d *Driver, depth int, quiet time.Duration) {
	t.Helper()
	keys := Keys(t)
	km := tui.DefaultKeyMap()
	enter, _ := Key("enter")
	esc, _ := Key("esc")
	for _, pane := range []string{km.Live.Keys()[0], km.Categories.Keys()[0], km.Segments.Keys()[0], km.Leaks.Keys()[0],
		km.Fixes.Keys()[0], km.Device.Keys()[0], km.Ranks.Keys()[0]} {
		p, _ := Key(pane)
		for _, k := range keys {
			for _, seq := range [][]tea.KeyPressMsg{{p, k}, {p, enter, k}, {p, enter, k, enter, k}}[:depth] {
				for _, msg := range seq {
					d.Press(msg, quiet)
				}
				d.Press(esc, quiet)
				d.Press(esc, quiet)
				if d.failed {
					return
				}
			}
		}
	}
}
