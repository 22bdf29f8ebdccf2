package tui

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/oomdbg/oomdbg/snapshot"
)

// stream is a snapshot arriving chunk by chunk: from a workload recording into a pipe, or from a file that
// may still be growing.
type stream struct {
	r     *snapshot.Reader
	snap  *snapshot.Snapshot // what was read so far; the model gets Views of it
	close func()
}

// streamMsg says a stream has opened (or failed to).
type streamMsg struct {
	s    *stream
	meta snapshot.Meta
	err  error
}

// chunkMsg carries a View of what the stream has read so far; done when the stream ended.
type chunkMsg struct {
	snap *snapshot.Snapshot
	done bool
	err  error
}

// recordWorkload starts run recording w into a pipe and opens the pipe's other end.
func recordWorkload(ctx context.Context, run Runner, w Workload) tea.Cmd {
	return func() tea.Msg {
		if run == nil {
			return streamMsg{err: fmt.Errorf("recording %s: no workload runner", w.Name)}
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(run.Record(ctx, w, pw)) }()
		r, err := snapshot.NewReader(pr)
		if err != nil {
			pr.CloseWithError(err)
			return streamMsg{err: fmt.Errorf("recording %s: %w", w.Name, err)}
		}
		return streamMsg{s: &stream{r: r, snap: &snapshot.Snapshot{}, close: func() { pr.Close() }}, meta: r.Meta()}
	}
}

// openFile opens the snapshot file of opts (or reads opts.Input); with opts.Follow, it keeps reading as the
// file grows until its end chunk.
func openFile(ctx context.Context, opts Options) tea.Cmd {
	return func() tea.Msg {
		path := opts.File
		in, closeIn := opts.Input, func() {}
		if in == nil {
			f, err := os.Open(path)
			if err != nil {
				return streamMsg{err: err}
			}
			in, closeIn = f, func() { f.Close() }
		}
		ropts := []snapshot.ReaderOption{snapshot.WithLimits(opts.Limits)}
		if opts.Follow {
			ropts = append(ropts, snapshot.WithFollow(ctx, 200*time.Millisecond))
		}
		r, err := snapshot.NewReader(in, ropts...)
		if err != nil {
			closeIn()
			return streamMsg{err: fmt.Errorf("%s: %w", path, err)}
		}
		return streamMsg{s: &stream{r: r, snap: &snapshot.Snapshot{}, close: closeIn}, meta: r.Meta()}
	}
}

// nextChunk reads the stream's next chunk.
func nextChunk(s *stream) tea.Cmd {
	return func() tea.Msg {
		err := s.r.ReadInto(s.snap)
		if err == nil {
			return chunkMsg{snap: s.snap.View()}
		}
		s.close()
		msg := chunkMsg{snap: s.snap.View(), done: true}
		if !errors.Is(err, io.EOF) {
			msg.err = err
		}
		return msg
	}
}

// loadState is how far loading has come.
type loadState struct {
	label string // what is loading
	done  bool
	err   error
}
