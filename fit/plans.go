package fit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// Allow names the changes a plan may make beyond the training loop's own settings: they change what is
// trained (LoRA, QLoRA) or need more than one process (ZeRO, FSDP, offload).
type Allow struct {
	LoRA, QLoRA, Offload, ZeRO bool
}

// ParseAllow reads a comma-separated list of lora, qlora, offload and zero ("" allows none).
func ParseAllow(s string) (Allow, error) {
	var a Allow
	if s == "" {
		return a, nil
	}
	for _, w := range strings.Split(s, ",") {
		switch strings.TrimSpace(w) {
		case "lora":
			a.LoRA = true
		case "qlora":
			a.QLoRA = true
		case "offload":
			a.Offload = true
		case "zero":
			a.ZeRO = true
		default:
			return a, fmt.Errorf("--allow %q: want some of lora, qlora, offload, zero", w)
		}
	}
	return a, nil
}

// PlanOptions tune a search for plans.
type PlanOptions struct {
	Options
	GPU   GPU
	Allow Allow
	// FreeBatch lets the effective batch shrink: a plan's micro-batch may be any divisor of the configured
	// one, without the accumulation that would keep micro-batch x accumulation as configured. Plans are then
	// ranked by time per sample.
	FreeBatch bool
	// Top is how many fitting plans to find (DefaultTop when 0).
	Top int
}

// DefaultTop is how many fitting plans a search finds by default.
const DefaultTop = 8

// Plan is one combination of fixes.
type Plan struct {
	Config  train.Config
	Changes []string // what the plan changes, in words ("bf16 autocast", "micro-batch 4 x accumulate 4")
	// Tried says the plan was simulated; Fits and the peaks are then its run's. Otherwise Skipped says
	// why not, when the search reached it.
	Tried, Fits                 bool
	Skipped                     string
	Because                     *Plan // the plan that fits, or does not, that Skipped speaks of
	PeakAllocated, PeakReserved int64
	Headroom                    int64 // Limit minus peak reserved (negative: over it)
	Cost                        Cost
	Result                      *train.Result
	level                       []int
}

// StepTime is the estimated time of one optimizer step, in seconds.
func (p *Plan) StepTime() float64 { return p.Cost.Total() }

// PerSample is the estimated time per training sample.
func (p *Plan) PerSample() float64 {
	return p.Cost.Total() / float64(p.Config.Batch*max(p.Config.Accum, 1)*p.Config.Parallel.World())
}

// Name says what the plan changes, "as configured" when nothing.
func (p *Plan) Name() string {
	if len(p.Changes) == 0 {
		return "as configured"
	}
	return strings.Join(p.Changes, ", ")
}

// Plans is what a search for plans found.
type Plans struct {
	// Fitting are the plans that fit, cheapest first; Tried every plan simulated, in the order tried;
	// Skipped those never simulated because a plan that fits dominates them, or a plan that differs only in
	// what its run never reached failed (Plan.Skipped says which).
	Fitting, Tried, Skipped []*Plan
	// Considered is the number of valid combinations, Pruned len(Skipped).
	Considered, Pruned int
	Steps              int // optimizer steps simulated
	// Discarded counts the trials simulated ahead of their turn (Options.Workers) whose plans the search
	// then skipped or never reached: work done on spare cores, in neither Tried nor Steps.
	Discarded   int
	Interrupted bool
}

// option is one choice on one axis of the search.
type option struct {
	name  string // "" for the configured choice
	apply func(*train.Config)
	// saves gives, per axis, what the option saves: an option saves at least what another does when
	// every component is at least as large (a partial order: attention-only checkpointing and checkpointing
	// every N-th block are not comparable).
	saves []int
}

type axis []option

// le reports whether a saves no more memory than b on every component.
func le(a, b []int) bool {
	for i := range a {
		if a[i] > b[i] {
			return false
		}
	}
	return true
}

// axes returns the choices a plan of cfg makes: on each axis the configured choice and those that save more.
func axes(cfg train.Config, o PlanOptions) []axis {
	var as []axis
	keep := option{saves: []int{0}, apply: func(*train.Config) {}}
	add := func(a axis) {
		if len(a) > 1 {
			as = append(as, a)
		}
	}
	// Precision: bf16 autocast (fp16 on a card without bf16); a Llama's weights in bf16.
	half, halfName := knob.AMPBF16, "bf16 autocast"
	if !o.GPU.BF16 {
		half, halfName = knob.AMPFP16, "fp16 autocast"
	}
	prec := axis{keep}
	if cfg.AMP == knob.AMPOff && cfg.Weights == train.WeightsF32 {
		prec = append(prec, option{halfName, func(c *train.Config) { c.AMP = half }, []int{1}})
	}
	if cfg.HF() && cfg.Weights == train.WeightsF32 && o.GPU.BF16 {
		prec = append(prec, option{"bf16 weights", func(c *train.Config) { c.AMP, c.Weights = knob.AMPOff, train.WeightsBF16 }, []int{2}})
	}
	add(prec)
	if cfg.Model != "mlp" && cfg.Attention == knob.AttentionNaive {
		add(axis{keep, {"flash attention", func(c *train.Config) { c.Attention = knob.AttentionFlash }, []int{1}}})
	}
	if cfg.Model != "mlp" {
		add(checkpointAxis(cfg))
	}
	add(batchAxis(cfg, o.FreeBatch))
	if cfg.Optimizer == knob.Adam || cfg.Optimizer == knob.AdamW {
		add(axis{keep,
			{"8-bit AdamW", func(c *train.Config) { c.Optimizer, c.OptimizerImpl = knob.AdamW8bit, "" }, []int{1}},
			{"paged 8-bit AdamW", func(c *train.Config) { c.Optimizer, c.OptimizerImpl = knob.PagedAdamW8bit, "" }, []int{2}}})
	}
	if cfg.ZeroGrad == knob.ZeroGradZero {
		add(axis{keep, {"zero_grad(set_to_none=True)", func(c *train.Config) { c.ZeroGrad = knob.ZeroGradNone }, []int{1}}})
	}
	if cfg.HF() && !cfg.QLoRA {
		ad := axis{keep}
		if cfg.LoRA == 0 && o.Allow.LoRA {
			ad = append(ad, option{"LoRA r16 on every projection", func(c *train.Config) { lora(c, false) }, []int{1}})
		}
		if o.Allow.QLoRA {
			ad = append(ad, option{"QLoRA r16 on every projection", func(c *train.Config) { lora(c, true) }, []int{2}})
		}
		add(ad)
	}
	add(shardAxis(cfg, o.Allow))
	return as
}

// lora adapts every projection with rank 16 (alpha 32), as QLoRA's recipe does, keeping an adapter the
// configuration already has.
func lora(c *train.Config, q bool) {
	if c.LoRA == 0 {
		c.LoRA, c.LoRAAlpha, c.LoRATargets = 16, 32, c.EveryProjection()
	}
	c.QLoRA = q
}

func checkpointAxis(cfg train.Config) axis {
	// Components: whole blocks recomputed (0, 1/4, 1/2, all as 0..3), attention recomputed (0/1). Attention
	// alone is comparable with off only: recomputing every block can peak higher than keeping the blocks'
	// activations but the attention's (the recomputed block's activations live at once in backward).
	type ck struct {
		c     knob.Checkpoint
		saves []int
	}
	all := []ck{{knob.CheckpointOff, []int{0, 0}}, {knob.CheckpointAttention, []int{0, 1}},
		{knob.CheckpointEvery(4), []int{1, 0}}, {knob.CheckpointEvery(2), []int{2, 0}}, {knob.CheckpointAll, []int{3, 0}}}
	if cfg.Model != "gpt" {
		all = slices.Delete(all, 1, 2) // attention-only checkpointing is the GPT's
	}
	var cur []int
	for _, k := range all {
		if k.c == cfg.Checkpoint {
			cur = k.saves
		}
	}
	if cur == nil {
		return nil // a configured every:N not among these: keep it
	}
	var a axis
	for _, k := range all {
		if !le(cur, k.saves) {
			continue
		}
		name := ""
		if k.c != cfg.Checkpoint {
			name = "checkpoint " + k.c.String()
		}
		a = append(a, option{name, func(c *train.Config) { c.Checkpoint = k.c }, k.saves})
	}
	return a
}

// batchAxis is the micro-batch: each divisor of the effective batch up to the configured micro-batch, with
// the accumulation that keeps the effective batch (or, with free set, the configured accumulation).
func batchAxis(cfg train.Config, free bool) axis {
	eff := cfg.Batch * max(cfg.Accum, 1)
	var a axis
	for m := cfg.Batch; m >= 1; m-- {
		if (free && cfg.Batch%m != 0) || (!free && eff%m != 0) {
			continue
		}
		accum := eff / m
		if free {
			accum = cfg.Accum
		}
		if len(a) > 0 && accum > train.MaxAccum {
			break
		}
		name := ""
		if m != cfg.Batch {
			name = fmt.Sprintf("micro-batch %d x accumulate %d", m, accum)
		}
		a = append(a, option{name, func(c *train.Config) { c.Batch, c.Accum = m, accum }, []int{len(a)}})
	}
	return a
}

// shardAxis is the data-parallel strategy and its offload, where allowed. Components: the ZeRO stage
// (DeepSpeed), FSDP's full sharding, the offload.
func shardAxis(cfg train.Config, allow Allow) axis {
	p := cfg.Parallel
	if p.Strategy != dist.Single && p.Strategy != dist.DDP || !(allow.ZeRO || allow.Offload) {
		return nil
	}
	type sh struct {
		s     dist.Strategy
		o     dist.Offload
		saves []int
	}
	var cands []sh
	if allow.ZeRO && p.World() > 1 {
		cands = append(cands, sh{dist.ZeRO1, 0, []int{1, 0, 0}}, sh{dist.ZeRO2, 0, []int{2, 0, 0}},
			sh{dist.ZeRO3, 0, []int{3, 0, 0}}, sh{dist.FSDPFull, 0, []int{0, 1, 0}})
	}
	if allow.Offload {
		cands = append(cands, sh{dist.ZeRO2, dist.OffloadOptimizer, []int{2, 0, 1}},
			sh{dist.ZeRO3, dist.OffloadOptimizer, []int{3, 0, 1}}, sh{dist.ZeRO3, dist.OffloadOptimizerParams, []int{3, 0, 2}})
	}
	a := axis{{saves: []int{0, 0, 0}, apply: func(*train.Config) {}}}
	for _, k := range cands {
		name := k.s.String()
		if k.o != dist.OffloadNone {
			name += ", offload " + k.o.String()
		}
		a = append(a, option{name, func(c *train.Config) {
			c.Parallel.GPUs, c.Parallel.Strategy, c.Parallel.Offload = p.World(), k.s, k.o
		}, k.saves})
	}
	return a
}

// SkippedDominated is why a plan was skipped: a plan estimated to cost no more fits, and this one saves at
// least as much memory on every axis.
const SkippedDominated = "saves at least as much as a cheaper plan that fits"

// SkippedFailsAlike is why a plan was skipped: a plan that differs from it only in the optimizer and
// zero_grad failed before its first optimizer step, so this one fails the same way.
const SkippedFailsAlike = "differs only in the optimizer or zero_grad from a plan that failed before its first optimizer step"

// beforeOptimizer returns what decides a single-GPU run until its first optimizer step, when the run
// would fail before it, as text: everything but the optimizer and zero_grad, which the loop first uses
// then (the optimizers allocate their state in their first step). Under a data-parallel strategy the
// optimizer is made and sharded at setup: "" (no such plans).
func beforeOptimizer(c train.Config) string {
	if c.Parallel.Parallel() {
		return ""
	}
	c.Optimizer, c.OptimizerImpl, c.ZeroGrad = "", "", 0
	return fmt.Sprintf("%+v", c)
}

// failedBeforeOptimizer reports whether a run ended by an OOM, or by reserved memory over the limit,
// before its first optimizer step: in the first iteration's data, forward or backward.
func failedBeforeOptimizer(res *train.Result) bool {
	if (res.OOM == nil && !res.OverLimit) || len(res.Phases) == 0 {
		return false
	}
	last := res.Phases[len(res.Phases)-1]
	switch last.Phase {
	case snapshot.PhaseData, snapshot.PhaseForward, snapshot.PhaseBackward:
		return last.Iteration == 0
	}
	return false
}

// FindPlans finds the cheapest plans that fit: it enumerates every combination of the axes, orders them by
// Estimate (the step time that needs no run), and simulates them cheapest first, skipping each plan that
// saves at least as much memory as a plan already found to fit, on every axis: it is estimated to cost at
// least as much (it comes later in the order) and is dominated.
//
// It does not skip a plan that saves no more than one that did not fit: the caching allocator's reserved
// memory is not monotone in what a fix saves (flash attention with attention checkpointing can reserve
// more than naive attention with it, while allocating less), so such a plan may fit.
//
// It also skips a plan that differs only in the optimizer and zero_grad from a single-GPU plan that
// failed before its first optimizer step: until then the two runs are the same.
//
// It stops when it has o.Top plans that fit and the next plan's estimate is more than the Top-th's cost,
// or when every plan is tried or skipped. The plans found are ranked by their cost with what their runs
// moved (Measure): step time, or time per sample when the effective batch is free.
func FindPlans(ctx context.Context, cfg train.Config, o PlanOptions) (*Plans, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Bug = "" // plans are of the fixed loop, as trials run it
	top := o.Top
	if top <= 0 {
		top = DefaultTop
	}
	plans := enumerate(cfg, axes(cfg, o), o.GPU)
	// Cheapest first; among equals, the plan that changes less, then the larger micro-batch.
	sort.SliceStable(plans, func(i, j int) bool {
		a, b := plans[i], plans[j]
		if ra, rb := o.rank(a), o.rank(b); ra != rb {
			return ra < rb
		}
		if len(a.Changes) != len(b.Changes) {
			return len(a.Changes) < len(b.Changes)
		}
		return a.Config.Batch > b.Config.Batch
	})
	s := &planSearch{o: o, top: top, res: &Plans{Considered: len(plans)}, failed: map[string]*Plan{}}
	ahead := newAhead(ctx, o.Options, plans, func(p *Plan) string { return beforeOptimizer(p.Config) })
	defer func() { s.res.Discarded = ahead.stop() }()
	for i, p := range plans {
		if s.pastTop(p) {
			break
		}
		if s.skip(p) {
			continue
		}
		if ctx.Err() != nil { // trials run ahead may have ended before it did: take none of them
			s.res.Interrupted = true
			break
		}
		t, err := ahead.take(i, s.done)
		if t.Result != nil {
			o.progress(t)
		}
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				s.res.Interrupted = true
				break
			}
			return nil, err
		}
		s.record(p, t)
	}
	if len(s.res.Fitting) > top {
		s.res.Fitting = s.res.Fitting[:top]
	}
	return s.res, nil
}

// enumerate returns every combination of one option of each axis that makes a valid configuration from
// cfg, as a plan with its estimated cost on gpu.
func enumerate(cfg train.Config, as []axis, gpu GPU) []*Plan {
	var plans []*Plan
	idx := make([]int, len(as))
	for {
		c := cfg
		var changes []string
		var level []int
		for i, a := range as {
			opt := a[idx[i]]
			opt.apply(&c)
			if opt.name != "" {
				changes = append(changes, opt.name)
			}
			level = append(level, opt.saves...)
		}
		if c.Validate() == nil {
			plans = append(plans, &Plan{Config: c, Changes: changes, level: level, Cost: Estimate(c, gpu)})
		}
		i := len(as) - 1
		for ; i >= 0; i-- {
			if idx[i]++; idx[i] < len(as[i]) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return plans
		}
	}
}

// rank is what plans are ordered by: the time per step, or per sample when the batch may shrink.
func (o PlanOptions) rank(p *Plan) float64 {
	if o.FreeBatch {
		return p.PerSample()
	}
	return p.StepTime()
}

// planSearch is FindPlans' search through the plans in estimate order: what it found, and what it learned
// that lets it skip plans without simulating them.
type planSearch struct {
	o      PlanOptions
	top    int
	res    *Plans
	fit    []*Plan          // the plans found to fit, in the order found
	failed map[string]*Plan // by beforeOptimizer, the plans that failed before their optimizer
}

// pastTop reports whether the search stops before p: Top plans fit, each cheaper than p.
func (s *planSearch) pastTop(p *Plan) bool {
	return len(s.res.Fitting) >= s.top && s.o.rank(p) > s.o.rank(s.res.Fitting[s.top-1])
}

// failedAlike returns the plan that failed before its optimizer as p would, nil for none.
func (s *planSearch) failedAlike(p *Plan) *Plan {
	if k := beforeOptimizer(p.Config); k != "" {
		return s.failed[k]
	}
	return nil
}

// skip reports whether p is skipped without a trial, and records why: a plan that fits saves no more than
// p in every respect (p is dominated), or a plan like p failed before its optimizer.
func (s *planSearch) skip(p *Plan) bool {
	if i := slices.IndexFunc(s.fit, func(f *Plan) bool { return le(f.level, p.level) }); i >= 0 {
		p.Skipped, p.Because = SkippedDominated, s.fit[i]
	} else if f := s.failedAlike(p); f != nil {
		p.Skipped, p.Because = SkippedFailsAlike, f
	}
	if p.Skipped == "" {
		return false
	}
	s.res.Skipped = append(s.res.Skipped, p)
	s.res.Pruned++
	return true
}

// done says the search will not simulate p: it stops before p, or p is dominated. Both only grow more true
// as plans are found to fit (the Top-th fitting plan's cost only falls; plans not tried come in estimate
// order), so a plan done now is done for good.
func (s *planSearch) done(p *Plan) bool {
	if s.pastTop(p) {
		return true
	}
	return slices.ContainsFunc(s.fit, func(f *Plan) bool { return le(f.level, p.level) }) || s.failedAlike(p) != nil
}

// record takes p's trial t into the search: its peaks and measured cost, and whether it fits.
func (s *planSearch) record(p *Plan, t Trial) {
	s.res.Steps += t.Steps
	p.Tried, p.Fits, p.Result = true, t.Fits, t.Result
	p.PeakAllocated, p.PeakReserved = t.Result.PeakAllocated, t.Result.PeakReserved
	p.Headroom = Limit(p.Config, s.o.margin()) - p.PeakReserved
	p.Cost = Measure(p.Cost, t.Result, s.o.GPU)
	s.res.Tried = append(s.res.Tried, p)
	if !p.Fits {
		if k := beforeOptimizer(p.Config); k != "" && failedBeforeOptimizer(t.Result) {
			s.failed[k] = p
		}
		return
	}
	s.fit = append(s.fit, p)
	s.res.Fitting = append(s.res.Fitting, p)
	sort.SliceStable(s.res.Fitting, func(i, j int) bool { return s.o.rank(s.res.Fitting[i]) < s.o.rank(s.res.Fitting[j]) })
}
