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
	ix   *index
	leak *leaks.Result // the re-run's leak analysis
	err  error
}

// The re-run streams in like the main workload, so its progress shows; its messages are its own types.
type (
	fixStreamMsg streamMsg
	fixChunkMsg  chunkMsg
)

// rerun records w into a pipe and starts reading it.
func rerun(ctx context.Context, b Backend, w Workload) tea.Cmd {
	open := recordWorkload(ctx, b, w)
	return func() tea.Msg { return fixStreamMsg(open().(streamMsg)) }
}

// onStream starts reading the re-run, or ends it on an error.
func (p *fixesPane) onStream(msg fixStreamMsg) tea.Cmd {
	if msg.err != nil {
		return func() tea.Msg { return fixResultMsg{err: msg.err} }
	}
	p.stream, p.progress = msg.s, &snapshot.Snapshot{Meta: msg.meta}
	return p.readMore()
}

func (p *fixesPane) readMore() tea.Cmd {
	next := nextChunk(p.stream)
	return func() tea.Msg { return fixChunkMsg(next().(chunkMsg)) }
}

// onChunk adds what the re-run recorded; at its end the re-run is indexed (in a command: it is the heavy
// part) and compared.
func (p *fixesPane) onChunk(msg fixChunkMsg) tea.Cmd {
	if p.progress == nil { // cancelled meanwhile
		return nil
	}
	*p.progress = *msg.snap
	// The workload comes from the file, perhaps someone else's: a re-run is held whole to be compared, so
	// one that outgrows the view's memory budget is stopped.
	if n := int64(p.progress.Events.Len()); n*residentPerEvent > p.budget {
		p.cancel()
		return func() tea.Msg {
			return fixResultMsg{err: fmt.Errorf("stopped at %d events: held whole, the re-run would pass the %s memory budget "+
				"(fewer steps would fit; oomdbg view --max-memory raises it)", n, units.FormatSize(p.budget))}
		}
	}
	switch {
	case msg.err != nil:
		return func() tea.Msg { return fixResultMsg{err: msg.err} }
	case !msg.done:
		return p.readMore()
	}
	s := p.progress
	return func() tea.Msg {
		ix := newIndex(s)
		return fixResultMsg{ix: ix, leak: leaks.Analyze(ix.tl)}
	}
}

func (p *fixesPane) onResult(msg fixResultMsg) {
	p.running, p.progress = nil, nil
	if msg.err != nil {
		p.err = msg.err
		return
	}
	p.afterIx, p.after = msg.ix, summarize(msg.ix)
	p.after.leak = msg.leak
}
