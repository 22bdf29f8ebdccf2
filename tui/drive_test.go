package tui

import (
	tea "charm.land/bubbletea/v2"
)

// drive runs cmd and the commands the model returns as a Bubble Tea program does: each command in a
// goroutine of its own, each message through Update and then View, until no command is left or until
// stop, if given, returns true for a message just handled. It returns the number of messages handled.
func drive(m *Model, cmd tea.Cmd, stop func(tea.Msg) bool) int {
	msgs := make(chan tea.Msg, 64)
	pending := 0
	start := func(c tea.Cmd) {
		if c == nil {
			return
		}
		pending++
		go func() { msgs <- c() }()
	}
	start(cmd)
	handled := 0
	for pending > 0 {
		msg := <-msgs
		pending--
		switch msg := msg.(type) {
		case nil:
			continue
		case tea.BatchMsg:
			for _, c := range msg {
				start(c)
			}
			continue
		case tea.QuitMsg:
			return handled
		}
		_, next := m.Update(msg)
		_ = m.View()
		handled++
		start(next)
		if stop != nil && stop(msg) {
			go func(n int) { // let the commands still running finish
				for range n {
					<-msgs
				}
			}(pending)
			return handled
		}
	}
	return handled
}
