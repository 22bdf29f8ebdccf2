// Package layouts searches the model-parallel layouts of a training job: every DP x TP x PP x CP split of its
// GPUs, pipeline schedule, micro-batch count, activation recompute and distributed optimizer that
// workloads/dist/layout can estimate, kept when the worst rank fits by the headroom rule, and ranked by a
// modelled step time (time.go). docs/distributed.md ("Searching the layouts of a job") states the model.
package layouts

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/workloads/dist/layout"
)

// DefaultTop is how many plans a search reports without Job.Top.
const DefaultTop = 10

// microBatchSizes are the sequences per micro-batch tried when Job.MicroBatch is 0.
var microBatchSizes = []int{1, 2, 4, 8}

// Job is what a search is asked: a model on a number of GPUs, a global batch, and a card.
type Job struct {
	Name  string       // the model's name, for the report
	Model layout.Model // its shape; Model.MicroBatch is set by each plan
	GPUs  int          // the world size
	Nodes int          // nodes the GPUs are spread evenly over; TP stays within one
	// GlobalBatch is the sequences of one optimizer step over all data-parallel replicas; MicroBatch the
	// sequences of one micro-batch (0: try 1, 2, 4 and 8).
	GlobalBatch, MicroBatch int
	GPU                     fit.GPU // the card: its peaks give the step time
	// Usable is the memory the allocator can use on each GPU (the card's less the CUDA context), and
	// Margin the share of it the headroom rule keeps free.
	Usable int64
	Margin float64
	Top    int // how many fitting plans to report (0: DefaultTop)
	// TP, PP and CP pin the search to layouts of those sizes (0: every size), so that a layout someone
	// has in mind can be judged; DP is the GPUs they leave.
	TP, PP, CP int
}

// InputError is a job that cannot be searched; Error is one line that says what to change.
type InputError struct{ Reason string }

func (e *InputError) Error() string { return e.Reason }

// GPUsPerNode is the GPUs of one node.
func (j Job) GPUsPerNode() int { return j.GPUs / j.Nodes }

// Check reports, as an *InputError, the first reason j cannot be searched.
func (j Job) Check() error {
	fail := func(format string, args ...any) error { return &InputError{Reason: fmt.Sprintf(format, args...)} }
	switch {
	case j.GPUs < 1 || j.GPUs > 1<<16:
		return fail("--gpus %d: want 1 to 65536", j.GPUs)
	case j.Nodes < 1 || j.Nodes > j.GPUs:
		return fail("--nodes %d: want 1 to the %d GPUs", j.Nodes, j.GPUs)
	case j.GPUs%j.Nodes != 0:
		return fail("%d GPUs do not spread evenly over %d nodes; give a multiple of the nodes", j.GPUs, j.Nodes)
	case j.GlobalBatch < 1 || j.GlobalBatch > 1<<24:
		return fail("--batch %d: want a global batch of 1 to %d sequences", j.GlobalBatch, 1<<24)
	case j.TP < 0 || j.PP < 0 || j.CP < 0:
		return fail("--tp %d, --pp %d, --cp %d: want a size, or 0 to search every size", j.TP, j.PP, j.CP)
	case j.TP > 0 && j.GPUsPerNode()%j.TP != 0:
		return fail("--tp %d does not divide the %d GPUs of a node (TP stays within one)", j.TP, j.GPUsPerNode())
	case max(j.TP, 1)*max(j.PP, 1)*max(j.CP, 1) > j.GPUs || j.GPUs%(max(j.TP, 1)*max(j.PP, 1)*max(j.CP, 1)) != 0:
		return fail("--tp %d x --pp %d x --cp %d does not divide the %d GPUs", max(j.TP, 1), max(j.PP, 1), max(j.CP, 1), j.GPUs)
	case j.MicroBatch < 0 || j.MicroBatch > j.GlobalBatch:
		return fail("--micro-batch %d: want 1 to the global batch (%d), or 0 to try 1, 2, 4 and 8", j.MicroBatch, j.GlobalBatch)
	case j.Usable <= 0:
		return fail("no memory is left to the allocator; give a larger --gpu-mem")
	case !(j.Margin >= 0 && j.Margin < 1):
		return fail("margin %v: want a share in [0, 1)", j.Margin)
	}
	m := j.Model
	m.MicroBatch = 1
	// layout counts in int64: the attention scores of one micro-batch, (2d + 1) a s^2 b bytes, are the
	// largest figure, and must not overflow for the largest micro-batch tried.
	b := float64(max(j.MicroBatch, microBatchSizes[len(microBatchSizes)-1]))
	if s := float64(m.Seq); 5*float64(m.Heads)*s*s*b > 1<<62 {
		return fail("%d tokens a sequence, %d heads and micro-batches of %.0f are too large to estimate; give a shorter --seq or --micro-batch", m.Seq, m.Heads, b)
	}
	if err := (layout.Layout{GPUs: 1, DP: 1, TP: 1, PP: 1, CP: 1, MicroBatches: 1}).Validate(m); err != nil {
		return &InputError{Reason: err.(*layout.LayoutError).Reason}
	}
	return nil
}

// divisors returns the divisors of n, ascending.
func divisors(n int) []int {
	var d []int
	for i := 1; i <= n; i++ {
		if n%i == 0 {
			d = append(d, i)
		}
	}
	return d
}

// Candidate is one layout to judge and the model it trains (its micro-batch set).
type Candidate struct {
	Model  layout.Model
	Layout layout.Layout
}

// Enumerate lists every layout of j that layout.Validate accepts: TP dividing the GPUs of a node (its
// collectives run on every layer and need the node's link), PP, CP and DP the rest, sequence parallelism
// whenever TP > 1 (Megatron's recommendation; it holds less and moves the same bytes); under PP > 1 the 1F1B
// schedule and interleaved:V for every V >= 2 that divides the layers of a stage (when PP divides the
// micro-batches, as Megatron requires); every micro-batch size
// that divides a replica's share of the global batch, M = GlobalBatch / (DP x b) micro-batches; each
// recompute; the distributed optimizer on and off (only off when DP x CP is 1: it shards over no one). The
// job's TP, PP and CP, where set, keep only the layouts of those sizes.
func Enumerate(j Job) []Candidate {
	var out []Candidate
	sizes := microBatchSizes
	if j.MicroBatch > 0 {
		sizes = []int{j.MicroBatch}
	}
	pinned := func(pin, n int) bool { return pin == 0 || pin == n }
	for _, tp := range divisors(j.GPUsPerNode()) {
		if !pinned(j.TP, tp) {
			continue
		}
		for _, pp := range divisors(j.GPUs / tp) {
			if !pinned(j.PP, pp) {
				continue
			}
			for _, cp := range divisors(j.GPUs / tp / pp) {
				if !pinned(j.CP, cp) {
					continue
				}
				dp := j.GPUs / tp / pp / cp
				base := layout.Layout{GPUs: j.GPUs, DP: dp, TP: tp, PP: pp, CP: cp, SequenceParallel: tp > 1, MicroBatches: 1}
				m := j.Model
				m.MicroBatch = 1
				if base.Validate(m) != nil {
					continue
				}
				schedules := []layout.Schedule{{Kind: layout.OneFOneB}}
				if pp > 1 {
					perStage := int(j.Model.Layers) / pp
					for v := 2; v <= perStage; v++ {
						if perStage%v == 0 {
							schedules = append(schedules, layout.Schedule{Kind: layout.Interleaved, Virtual: v})
						}
					}
				}
				optimizers := []bool{false, true}
				if dp*cp == 1 {
					optimizers = optimizers[:1]
				}
				for _, b := range sizes {
					if j.GlobalBatch%(dp*b) != 0 {
						continue
					}
					m.MicroBatch = int64(b)
					for _, s := range schedules {
						// Megatron's interleaved schedule runs micro-batches in groups of PP (schedules.py,
						// forward_backward_pipelining_with_interleaving: "number of microbatches is not
						// divisible by pipeline-model-parallel-size when using interleaved schedule").
						if s.Kind == layout.Interleaved && (j.GlobalBatch/(dp*b))%pp != 0 {
							continue
						}
						for _, r := range []layout.Recompute{layout.RecomputeNone, layout.RecomputeSelective, layout.RecomputeFull} {
							for _, do := range optimizers {
								l := base
								l.Schedule, l.Recompute, l.DistributedOptimizer = s, r, do
								l.MicroBatches = j.GlobalBatch / (dp * b)
								if l.Validate(m) == nil {
									out = append(out, Candidate{Model: m, Layout: l})
								}
							}
						}
					}
				}
			}
		}
	}
	return out
}

// Plan is one layout judged: its worst rank's memory against the headroom rule, and its step time.
type Plan struct {
	Layout layout.Layout
	// MicroBatch is the sequences of one micro-batch.
	MicroBatch int
	// Worst is the pipeline stage whose rank holds the most, and Verdict its total judged by the rule.
	Worst   layout.Stage
	Verdict headroom.Verdict
	Time    StepTime
}

// Fits reports whether the plan's worst rank fits by the headroom rule.
func (p Plan) Fits() bool { return p.Verdict.Fits() }

// Evaluate judges c for j: layout.Estimate's stages, the one with the largest total judged by the headroom
// rule, and the step time.
func Evaluate(j Job, c Candidate) (Plan, error) {
	stages, err := layout.Estimate(c.Model, c.Layout)
	if err != nil {
		return Plan{}, err
	}
	worst := stages[0]
	for _, s := range stages[1:] {
		if s.Total() > worst.Total() {
			worst = s
		}
	}
	return Plan{
		Layout:     c.Layout,
		MicroBatch: int(c.Model.MicroBatch),
		Worst:      worst,
		Verdict:    headroom.Judge(int64(worst.Total()), false, j.Usable, j.Margin),
		Time:       Time(j, c),
	}, nil
}

// Report is a search's result: the fastest plans that fit, and what was searched.
type Report struct {
	Job      Job
	Searched int    // layouts enumerated
	Fitting  int    // of those, the ones whose worst rank fits
	Plans    []Plan // the fastest Top fitting plans, by step time
	// Smallest is the plan whose worst rank holds the least, when none fits: what came closest.
	Smallest *Plan
}

// Search enumerates j's layouts, keeps those that fit and returns the Top fastest.
func Search(j Job) (*Report, error) {
	if err := j.Check(); err != nil {
		return nil, err
	}
	top := j.Top
	if top <= 0 {
		top = DefaultTop
	}
	r := &Report{Job: j}
	var fitting []Plan
	for _, c := range Enumerate(j) {
		p, err := Evaluate(j, c)
		if err != nil {
			return nil, err // Enumerate keeps only layouts Validate accepts
		}
		r.Searched++
		if !p.Fits() {
			if r.Smallest == nil || p.Worst.Total() < r.Smallest.Worst.Total() {
				r.Smallest = &p
			}
			continue
		}
		fitting = append(fitting, p)
	}
	r.Fitting = len(fitting)
	if r.Fitting > 0 {
		r.Smallest = nil
	}
	slices.SortStableFunc(fitting, func(a, b Plan) int {
		return cmp.Or(cmp.Compare(a.Time.Total(), b.Time.Total()), cmp.Compare(a.Worst.Total(), b.Worst.Total()))
	})
	r.Plans = fitting[:min(top, len(fitting))]
	return r, nil
}
