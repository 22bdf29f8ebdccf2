package fit

import (
	"context"
	"sync"
)

// ahead simulates plans ahead of the search's turn on spare cores: while the search waits for one plan's
// trial, the next plans it may need are simulated too. Results are taken in the search's order, so the
// search decides exactly as it would one trial at a time.
type ahead struct {
	opts     Options
	plans    []*Plan
	ctx      context.Context
	cancel   context.CancelFunc
	workers  int
	running  int
	started  []*aheadTrial
	finished chan *aheadTrial
	wg       sync.WaitGroup
	// alike gives the plans whose trials fail alike when one fails early ("": none); until the search has
	// taken one's trial, the others wait for their turn, as its failure would skip them.
	alike   func(*Plan) string
	pending map[string]int
}

type aheadTrial struct {
	alike    string
	t        Trial
	err      error
	ready    bool
	consumed bool
}

func newAhead(ctx context.Context, o Options, plans []*Plan, alike func(*Plan) string) *ahead {
	a := &ahead{opts: o, plans: plans, workers: o.workers(), started: make([]*aheadTrial, len(plans)),
		finished: make(chan *aheadTrial, len(plans)), alike: alike, pending: map[string]int{}}
	a.ctx, a.cancel = context.WithCancel(ctx)
	return a
}

// start simulates plan i in a goroutine of its own.
func (a *ahead) start(i int) {
	at, cfg := &aheadTrial{alike: a.alike(a.plans[i])}, a.plans[i].Config
	a.started[i] = at
	a.running++
	if at.alike != "" {
		a.pending[at.alike]++
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		at.t, at.err = a.opts.simulate(a.ctx, cfg)
		a.finished <- at
	}()
}

// fill starts plans from i on, in order, skipping those done says the search will not simulate, until
// every worker is busy.
func (a *ahead) fill(i int, done func(*Plan) bool) {
	for j := i; j < len(a.plans) && a.running < a.workers; j++ {
		if a.started[j] == nil && !done(a.plans[j]) {
			if k := a.alike(a.plans[j]); k != "" && a.pending[k] > 0 {
				continue
			}
			a.start(j)
		}
	}
}

// take returns plan i's trial, starting it (and the plans after it, on the workers left) if need be.
func (a *ahead) take(i int, done func(*Plan) bool) (Trial, error) {
	if a.started[i] == nil {
		a.start(i)
	}
	a.fill(i+1, done)
	at := a.started[i]
	for !at.ready {
		f := <-a.finished
		f.ready = true
		a.running--
		if !at.ready { // once i is done, the search's next turn knows more of what it will skip
			a.fill(i+1, done)
		}
	}
	at.consumed = true
	if at.alike != "" { // until the search takes a trial, its failure is not known to skip others
		a.pending[at.alike]--
	}
	return at.t, at.err
}

// stop cancels the trials still running, waits for them and returns how many trials were started and not
// taken.
func (a *ahead) stop() int {
	a.cancel()
	a.wg.Wait()
	n := 0
	for _, at := range a.started {
		if at != nil && !at.consumed {
			n++
		}
	}
	return n
}
