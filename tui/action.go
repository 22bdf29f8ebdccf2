package tui

import (
	"fmt"

	tea "charm.land/bubbletea/v2"
)

// An action is what a pane asks of the root model in answer to a key or a result: a pane changes only itself
// and returns the rest, which the root applies (Model.apply), as crush's dialogs return an Action from
// HandleMsg. So a pane can be built and driven alone in a test, and what it asks of the screen is a value to
// compare.
type action struct {
	cmd tea.Cmd // work to run in the background
	// status is a message for the status bar ("" leaves it as it is), shown as an error with isErr.
	status string
	isErr  bool
	show   *shownBlock // a block to show in the live set
}

// shownBlock asks for a block in the live set: the cursor on event at, where the block is alive, the Live
// pane, the block allocated at event alloc selected, and a status line naming it as what's example block.
type shownBlock struct {
	at, alloc int
	what      string // whose example it is: "the suspect's"
}

// say is the action that shows a status message.
func say(status string) action { return action{status: status} }

// apply does what a pane asked, and returns the command it asked to run.
func (m *Model) apply(a action) tea.Cmd {
	if b := a.show; b != nil {
		m.moveTo(b.at)
		m.pane = paneLive
		// A paged run may hold the event only once the pages around it are read back: the block is
		// selected then (livePane.setData).
		m.live.selectAlloc(b.alloc, !m.ix.covers(b.at))
		when := "in " + where(m.ix.spanAt(b.at))
		if it := m.ix.spanAt(b.at).iteration; it >= 0 {
			when = fmt.Sprintf("at the end of iteration %d", it)
		}
		m.setStatus(fmt.Sprintf("%s example block, allocated at event %d, alive here %s", b.what, b.alloc, when), false)
	}
	if a.status != "" {
		m.setStatus(a.status, a.isErr)
	}
	return a.cmd
}
