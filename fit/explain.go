package fit

import (
	"context"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// Finder is what a batch-size finder of the kind people use today settles on for a workload, judged by
// the same rule as fit, with its trials counted as it would run them on a GPU.
type Finder struct {
	Name   string
	Batch  int // the batch it settles on (0: none)
	Trials int // configurations it tries
	Steps  int // training steps those trials take on a GPU
}

// Saving is what one fix saves of the memory a step needs (peak allocated with unlimited memory).
type Saving struct {
	Fix        string
	Needs      int64 // peak allocated with the fix
	Base       int64 // peak allocated as configured
	SavedShare float64
}

// Explanation compares fit with other finders and measures what the common fixes save.
type Explanation struct {
	Halving, Doubling Finder
	Savings           []Saving
}

// HalvingStart is where accelerate's find_executable_batch_size is started in the comparison.
const HalvingStart = 64

// LightningStepsPerTrial is Lightning's BatchSizeFinder default steps_per_trial.
const LightningStepsPerTrial = 3

// Explain runs the comparisons for cfg: halving from HalvingStart on every OOM (accelerate's
// find_executable_batch_size, one step a trial as it fails on the first), doubling from 2 then bisecting
// (Lightning's BatchSizeFinder in binsearch mode, LightningStepsPerTrial steps a trial), and the share of
// the needed memory bf16 autocast, checkpointing every block and a quarter of the micro-batch with four
// times the accumulation save.
func Explain(ctx context.Context, cfg train.Config, o Options) (*Explanation, error) {
	memo := map[int]bool{}
	var err error
	fits := func(b int) bool {
		if v, ok := memo[b]; ok || err != nil {
			return v
		}
		c := cfg
		c.Batch = b
		var t Trial
		t, err = o.trial(ctx, c)
		memo[b] = t.Fits
		return t.Fits
	}
	e := &Explanation{Halving: Finder{Name: "halving from 64 on OOM (accelerate find_executable_batch_size)"},
		Doubling: Finder{Name: "doubling from 2, then bisecting (Lightning BatchSizeFinder, binsearch)"}}
	for b := HalvingStart; b >= 1; b /= 2 {
		e.Halving.Trials++
		if fits(b) {
			e.Halving.Batch = b
			break
		}
	}
	e.Halving.Steps = e.Halving.Trials // each OOM ends its trial in the first step; the one that fits goes on
	var s BatchSearch
	serr := s.search(2, func(b int) (bool, error) {
		e.Doubling.Trials++
		ok := fits(b)
		if ok {
			e.Doubling.Batch = max(e.Doubling.Batch, b)
		}
		return ok, err
	})
	if serr != nil {
		return nil, serr
	}
	if err != nil {
		return nil, err
	}
	e.Doubling.Steps = e.Doubling.Trials * LightningStepsPerTrial

	fixes := []struct {
		name  string
		apply func(*train.Config)
	}{
		{"bf16 autocast", func(c *train.Config) { c.AMP = knob.AMPBF16 }},
		{"checkpoint every block", func(c *train.Config) { c.Checkpoint = knob.CheckpointAll }},
		{"micro-batch / 4, accumulate x 4", func(c *train.Config) { c.Batch, c.Accum = max(c.Batch/4, 1), c.Accum*4 }},
	}
	need := func(c train.Config) (int64, error) {
		c.GPUMemory = 16 << 40 // all it wants, as train.Sweep's "needs"
		c.Steps, c.Bug = Steps(c), ""
		res, err := o.sim().Simulate(ctx, c, 0)
		if err != nil {
			return 0, err
		}
		return res.PeakAllocated, nil
	}
	base, err := need(cfg)
	if err != nil {
		return nil, err
	}
	for _, f := range fixes {
		c := cfg
		f.apply(&c)
		if c.Validate() != nil || (f.name == "bf16 autocast" && (cfg.AMP != knob.AMPOff || cfg.Weights != train.WeightsF32)) ||
			(f.name == "checkpoint every block" && (cfg.Model == "mlp" || cfg.Checkpoint == knob.CheckpointAll)) {
			continue
		}
		n, err := need(c)
		if err != nil {
			return nil, err
		}
		e.Savings = append(e.Savings, Saving{Fix: f.name, Needs: n, Base: base, SavedShare: 1 - float64(n)/float64(base)})
	}
	return e, nil
}
