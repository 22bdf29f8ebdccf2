package nvml

import (
	"context"
	"time"
)

// DefaultInterval is the polling interval of a [Sampler] given none: fine enough to see each phase of a
// training step, coarse enough to cost nothing measurable.
const DefaultInterval = 100 * time.Millisecond

// SampleFunc receives one reading of a device's memory: used and total bytes (see [Session.Sample]) read at
// time t.
type SampleFunc func(device int, used, total uint64, t time.Time)

// Source is what a [Sampler] reads. *[Session] implements it.
type Source interface {
	Sample(index int) (used, total uint64, err error)
}

// Sampler polls one device's memory at a fixed interval in its own goroutine and hands every reading to a
// [SampleFunc]. It stops when its context is cancelled, when [Sampler.Stop] is called, or at the first failed
// reading, which [Sampler.Err] then returns.
type Sampler struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // written by the goroutine before done closes, so reading it after <-done needs no lock
}

// StartSampler starts polling device of src every interval (DefaultInterval if interval <= 0). The first
// reading is taken at once. fn is called from the sampler's goroutine, one reading at a time; a slow fn delays
// the next reading, and the ticks it misses collapse into one instead of queueing up.
func StartSampler(ctx context.Context, src Source, device int, interval time.Duration, fn SampleFunc) *Sampler {
	if fn == nil {
		panic("nvml: StartSampler with a nil SampleFunc")
	}
	if interval <= 0 {
		interval = DefaultInterval
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Sampler{cancel: cancel, done: make(chan struct{})}
	go s.run(ctx, src, device, interval, fn)
	return s
}

func (s *Sampler) run(ctx context.Context, src Source, device int, interval time.Duration, fn SampleFunc) {
	defer close(s.done)
	defer s.cancel() // release the context's resources once sampling ends on its own
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		t := time.Now()
		used, total, err := src.Sample(device)
		if err != nil {
			s.err = err
			return
		}
		// A cancel that raced with the reading wins: nothing is delivered after Stop returns.
		if ctx.Err() != nil {
			return
		}
		fn(device, used, total, t)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// Stop stops the sampler and waits for its goroutine to finish; no reading is delivered after it returns.
// It is safe to call more than once and from several goroutines.
func (s *Sampler) Stop() {
	s.cancel()
	<-s.done
}

// Done is closed when the sampler has stopped, for whatever reason.
func (s *Sampler) Done() <-chan struct{} { return s.done }

// Err returns the reading error that stopped the sampler, or nil if it was stopped or is still running.
func (s *Sampler) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

var _ Source = (*Session)(nil)
