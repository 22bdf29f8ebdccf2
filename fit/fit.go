// Package fit is oomdbg's planner: it finds the largest micro-batch a workload trains with on a card, and
// the cheapest combinations of memory fixes that make it fit, by simulating steps on the meta device with
// the caching allocator's rules instead of trying them on a GPU.
//
// A configuration fits when a simulated run of it finishes without an out-of-memory error and its peak
// reserved memory stays under the card's memory less the CUDA context and a safety margin (Limit). The
// margin leaves room for what the simulation does not see: other batches' shapes, the fragmentation of a
// long run, a library's workspace.
package fit

import (
	"context"
	"runtime"

	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// DefaultMargin is the share of the allocator's memory (the card's less the CUDA context) a configuration
// must leave unreserved to fit: 5%, the rule every verdict of oomdbg's follows (internal/headroom).
const DefaultMargin = headroom.DefaultMargin

// Usable returns the memory the allocator can use on cfg's card: GPU memory less the context reserve.
func Usable(cfg train.Config) int64 { return int64(cfg.GPUMemory) - int64(cfg.ContextReserve) }

// Limit returns the most a configuration may reserve to fit: (GPU memory - context reserve) x (1 - margin).
func Limit(cfg train.Config, margin float64) int64 { return headroom.Limit(Usable(cfg), margin) }

// A Simulator runs a configuration for a few steps and says what it did. Meta is the one oomdbg uses; the
// interface is how tests and the TUI drive the planner. A plan search calls Simulate from several
// goroutines at once (Options.Workers).
type Simulator interface {
	// Simulate runs cfg. It may stop once the run's reserved memory passed limit (0: no limit), where the
	// run is known not to fit, saying so in Result.OverLimit.
	Simulate(ctx context.Context, cfg train.Config, limit int64) (*train.Result, error)
}

// Meta simulates on the meta device: shapes and the allocator's rules, no arithmetic, milliseconds a step.
type Meta struct{}

// Simulate runs cfg on the meta device, recording nothing, until its reserved memory passes limit; a step's
// micro-batches that repeat a cycle of allocator states are counted rather than run (train.Simulate), so a
// trial's time does not grow with the accumulation.
func (Meta) Simulate(ctx context.Context, cfg train.Config, limit int64) (*train.Result, error) {
	cfg.Device = device.Meta
	if limit > 0 {
		return train.Simulate(ctx, cfg, limit)
	}
	res, _, err := train.Run(ctx, cfg, nil)
	return res, err
}

// Steps returns the steps a trial of cfg simulates: two when every batch has the same shape (the second
// carries the optimizer state and the gradients the first left), the configured steps when lengths vary
// (fragmentation builds up over batches of different shapes).
func Steps(cfg train.Config) int {
	if cfg.SeqDist.Fixed() {
		return 2
	}
	return max(cfg.Steps, 2)
}

// Trial is one simulated configuration.
type Trial struct {
	Config train.Config
	Result *train.Result
	Fits   bool
	// Steps is the optimizer steps simulated: the completed ones and the one an OOM, or reserved memory
	// over the limit, cut short (Result.OverLimit: the peaks are those reached by then).
	Steps int
}

// Options tune a search.
type Options struct {
	// Margin is the share of the allocator's memory left unreserved (DefaultMargin when 0; negative for none).
	Margin float64
	// Sim runs the trials (Meta when nil).
	Sim Simulator
	// Progress, when set, hears of every trial as it ends, in the order the search takes them, from the
	// goroutine that called the search.
	Progress func(Trial)
	// Workers is how many trials a plan search simulates at once (when 0, one fewer than GOMAXPROCS, at
	// least one: a simulation allocates fast, and the collector needs a core beside it). The search and
	// what it finds are the same for any number: the trials that run ahead of their turn are taken in
	// order, and those of plans the search ends up skipping are dropped.
	Workers int
}

func (o Options) margin() float64 {
	switch {
	case o.Margin == 0:
		return DefaultMargin
	case o.Margin < 0:
		return 0
	}
	return o.Margin
}

func (o Options) workers() int {
	if o.Workers > 0 {
		return o.Workers
	}
	// On two cores, two workers took 45% more CPU than one for at most a fifth less time, and more time
	// on gpt2-medium: the second core was the collector's.
	return max(runtime.GOMAXPROCS(0)-1, 1)
}

func (o Options) sim() Simulator {
	if o.Sim == nil {
		return Meta{}
	}
	return o.Sim
}

// trial simulates cfg (its steps set by Steps, without leak bugs), judges whether it fits and tells
// Progress.
func (o Options) trial(ctx context.Context, cfg train.Config) (Trial, error) {
	t, err := o.simulate(ctx, cfg)
	if err == nil || t.Result != nil {
		o.progress(t)
	}
	return t, err
}

// simulate is trial without Progress: safe to call from several goroutines. A trial whose reserved
// memory passes the limit stops at the next phase boundary: it does not fit, whatever the rest would do.
func (o Options) simulate(ctx context.Context, cfg train.Config) (Trial, error) {
	cfg.Steps, cfg.Bug = Steps(cfg), ""
	limit := Limit(cfg, o.margin())
	res, err := o.sim().Simulate(ctx, cfg, max(limit, 1))
	if err != nil {
		return Trial{Config: cfg}, err
	}
	t := Trial{Config: cfg, Result: res, Steps: res.Steps}
	if res.OOM != nil || res.OverLimit {
		t.Steps++
	}
	t.Fits = headroom.Judge(res.PeakReserved, res.OOM != nil, Usable(cfg), o.margin()).Fits() && !res.OverLimit && !res.Interrupted
	if res.Interrupted {
		return t, ctx.Err()
	}
	return t, nil
}

func (o Options) progress(t Trial) {
	if o.Progress != nil {
		o.Progress(t)
	}
}
