package fit

import (
	"context"
	"errors"
	"fmt"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// MaxSearchBatch is the largest micro-batch the search tries: a workload that fits it is reported as fitting
// at least that much.
const MaxSearchBatch = 1 << 16

// BatchSearch is what a search for the largest micro-batch found.
type BatchSearch struct {
	// MaxBatch is the largest micro-batch that fits, with MaxBatch+1 tried and not fitting (0: not even a
	// batch of one fits). When Capped, MaxSearchBatch fits and nothing larger was tried.
	MaxBatch int
	Capped   bool
	// NoFit is the smallest micro-batch tried that does not fit (0: none failed). When the search ends,
	// NoFit is MaxBatch+1 (or 1, when nothing fits); when it was interrupted, the largest batch that fits
	// lies between the two, and either may still be unknown.
	NoFit int
	// Best is the trial of MaxBatch (nil when it is 0).
	Best *Trial
	// Trials are the runs in the order made; Steps the optimizer steps they simulated, all together.
	Trials []Trial
	Steps  int
	// Interrupted says the context ended the search early: MaxBatch is the largest found to fit so far.
	Interrupted bool
}

// MaxBatch finds the largest micro-batch cfg fits with, its accumulation and everything else as configured:
// from the configured batch it doubles while the batch fits (or halves while it does not), then bisects
// between the largest batch that fit and the smallest that did not. It assumes a larger batch never needs
// less memory; the batch it reports fits and the next one was tried and does not.
//
// When ctx ends, MaxBatch returns what it found so far with Interrupted set and no error.
func MaxBatch(ctx context.Context, cfg train.Config, opts Options) (*BatchSearch, error) {
	s := &BatchSearch{}
	fits := func(b int) (bool, error) {
		c := cfg
		c.Batch = b
		t, err := opts.trial(ctx, c)
		if err != nil {
			return false, err // an interrupted trial judged nothing
		}
		s.Trials = append(s.Trials, t)
		s.Steps += t.Steps
		if t.Fits {
			s.MaxBatch = max(s.MaxBatch, b)
		} else if s.NoFit == 0 || b < s.NoFit {
			s.NoFit = b
		}
		return t.Fits, nil
	}
	err := s.search(cfg.Batch, fits)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		s.Interrupted, err = true, nil
	}
	for i := range s.Trials {
		if t := &s.Trials[i]; t.Fits && t.Config.Batch == s.MaxBatch {
			s.Best = t
		}
	}
	return s, err
}

// search runs the exponential then binary search from start with fits as the oracle.
func (s *BatchSearch) search(start int, fits func(int) (bool, error)) error {
	start = min(max(start, 1), MaxSearchBatch)
	ok, err := fits(start)
	if err != nil {
		return err
	}
	lo, hi := 0, 0               // lo fits (0: nothing known to), hi does not (0: unknown)
	probe := func(b int) error { // tries b and moves lo or hi to it
		ok, err := fits(b)
		if ok {
			lo = b
		} else {
			hi = b
		}
		return err
	}
	if ok {
		lo = start
	} else {
		hi = start
	}
	for ok && hi == 0 {
		if lo == MaxSearchBatch {
			s.Capped = true
			return nil
		}
		if err := probe(min(2*lo, MaxSearchBatch)); err != nil {
			return err
		}
	}
	for !ok && lo == 0 && hi > 1 {
		if err := probe(hi / 2); err != nil {
			return err
		}
	}
	if lo == 0 {
		return nil // a batch of one does not fit
	}
	for hi-lo > 1 {
		if err := probe(lo + (hi-lo)/2); err != nil {
			return err
		}
	}
	return nil
}

// String says what the search found, in one line. An interrupted search says what it knows: a batch that
// fits and one that does not, as far as it got; never that nothing fits when smaller batches were not tried.
func (s *BatchSearch) String() string {
	trials := fmt.Sprintf("%d trials, %d simulated steps", len(s.Trials), s.Steps)
	switch {
	case s.Interrupted && s.MaxBatch > 0 && s.NoFit > 0:
		return fmt.Sprintf("interrupted (%s): micro-batch %d fits and %d does not; the largest that fits lies between", trials, s.MaxBatch, s.NoFit)
	case s.Interrupted && s.MaxBatch > 0:
		return fmt.Sprintf("interrupted (%s): micro-batch %d fits; no larger one was tried", trials, s.MaxBatch)
	case s.Interrupted && s.NoFit > 0:
		return fmt.Sprintf("interrupted (%s): micro-batch %d does not fit; no smaller one was tried", trials, s.NoFit)
	case s.Interrupted:
		return fmt.Sprintf("interrupted before the first trial ended (%s): nothing is known of the largest micro-batch", trials)
	case s.MaxBatch == 0:
		return fmt.Sprintf("no micro-batch fits, not even 1 (%d trials, %d simulated steps)", len(s.Trials), s.Steps)
	case s.Capped:
		return fmt.Sprintf("micro-batch %d fits, the most tried (%d trials, %d simulated steps)", s.MaxBatch, len(s.Trials), s.Steps)
	}
	return fmt.Sprintf("largest micro-batch %d: %d does not fit (%d trials, %d simulated steps)", s.MaxBatch, s.MaxBatch+1, len(s.Trials), s.Steps)
}
