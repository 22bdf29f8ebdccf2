package tui

import (
	"context"
	"fmt"

	tea "charm.land/bubbletea/v2"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
)

// fixResultMsg is a finished re-run.
type fixResultMsg struct {
	run  int
	ix   *index
	leak *leaks.Result // the re-run's leak analysis
	err  error
}

// The re-run streams in like the main workload, so its progress shows; its messages are its own types, each
// with the number of the re-run it belongs to: a re-run cancelled and started again leaves messages on the
// way that are not the new one's.
type (
	fixStreamMsg struct {
		streamMsg
		run int
	}
	fixChunkMsg struct {
		chunkMsg
		run int
	}
)

// rerun records w into a pipe and starts reading it, as the pane's next re-run.
func (p *fixesPane) rerun(ctx context.Context, w Workload) tea.Cmd {
	p.run++
	open, run := recordWorkload(ctx, p.backend, w), p.run
	return func() tea.Msg { return fixStreamMsg{open().(streamMsg), run} }
}

// onStream starts reading the re-run, or ends it on an error.
func (p *fixesPane) onStream(msg fixStreamMsg) tea.Cmd {
	switch {
	case msg.run != p.run: // an earlier re-run's, cancelled
		if msg.s != nil {
			msg.s.close()
		}
		return nil
	case msg.err != nil:
		return func() tea.Msg { return fixResultMsg{run: msg.run, err: msg.err} }
	}
	p.stream, p.progress = msg.s, &snapshot.Snapshot{Meta: msg.meta}
	return p.readMore()
}

func (p *fixesPane) readMore() tea.Cmd {
	next, run := nextChunk(p.stream), p.run
	return func() tea.Msg { return fixChunkMsg{next().(chunkMsg), run} }
}

// onChunk adds what the re-run recorded; at its end the re-run is indexed (in a command: it is the heavy
// part) and compared.
func (p *fixesPane) onChunk(msg fixChunkMsg) tea.Cmd {
	if msg.run != p.run { // an earlier re-run's, cancelled
		return nil
	}
	*p.progress = *msg.snap
	// The workload comes from the file, perhaps someone else's: a re-run is held whole to be compared, so
	// one that outgrows the view's memory budget is stopped.
	if n := int64(p.progress.Events.Len()); n*residentPerEvent > p.budget {
		p.running() // the recording stops; the result, an error, is still this re-run's
		return func() tea.Msg {
			return fixResultMsg{run: msg.run, err: fmt.Errorf("stopped at %d events: held whole, the re-run would pass the %s memory budget "+
				"(fewer steps would fit; oomdbg view --max-memory raises it)", n, units.FormatSize(p.budget))}
		}
	}
	switch {
	case msg.err != nil:
		return func() tea.Msg { return fixResultMsg{run: msg.run, err: msg.err} }
	case !msg.done:
		return p.readMore()
	}
	s, run := p.progress, msg.run
	return func() tea.Msg {
		ix := newIndex(s)
		return fixResultMsg{run: run, ix: ix, leak: leaks.Analyze(ix.tl)}
	}
}

// onResult takes a re-run's end; it reports whether it was the re-run the pane waits for.
func (p *fixesPane) onResult(msg fixResultMsg) bool {
	if msg.run != p.run {
		return false
	}
	p.running, p.progress = nil, nil
	if msg.err != nil {
		p.err = msg.err
		return true
	}
	p.afterIx, p.after = msg.ix, summarize(msg.ix)
	p.after.leak = msg.leak
	return true
}
