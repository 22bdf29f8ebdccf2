package snapshot

import (
	"context"
	"io"
	"time"
)

// WithFollow makes the Reader tail a file that is still being written, like tail -f: at the end of the input
// it polls every interval (default 100ms) until more bytes arrive, the end chunk is read, or ctx is done, in
// which case Next returns ctx's error. A chunk the writer has only half written is waited for, not reported
// as truncation.
//
// Pipes need no follow: a read from a pipe already waits for the writer, and the writer's exit ends it.
func WithFollow(ctx context.Context, interval time.Duration) ReaderOption {
	return func(c *readerConfig) {
		c.ctx = ctx
		c.interval = interval
	}
}

// follower is an io.Reader that turns end-of-file into waiting.
type follower struct {
	ctx      context.Context
	r        io.Reader
	interval time.Duration
	timer    *time.Timer
}

func newFollower(ctx context.Context, r io.Reader, interval time.Duration) *follower {
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	return &follower{ctx: ctx, r: r, interval: interval}
}

func (f *follower) Read(p []byte) (int, error) {
	for {
		n, err := f.r.Read(p)
		if n > 0 || len(p) == 0 {
			return n, nil
		}
		if err != nil && err != io.EOF {
			return 0, err
		}
		if err := f.wait(); err != nil {
			return 0, err
		}
	}
}

// wait sleeps one interval, or until ctx is done.
func (f *follower) wait() error {
	if f.timer == nil {
		f.timer = time.NewTimer(f.interval)
	} else {
		f.timer.Reset(f.interval)
	}
	select {
	case <-f.ctx.Done():
		f.timer.Stop()
		return f.ctx.Err()
	case <-f.timer.C:
		return nil
	}
}
