package torch

import (
	"slices"
	"sort"

	"github.com/oomdbg/oomdbg/snapshot"
)

// CategoryRule is what decided a block's category. The rules are tried in the order of the constants; the
// first that applies decides (docs/pytorch-snapshots.md, "Categories").
type CategoryRule uint8

const (
	// CategoryNoRule: nothing decides; the block stays unknown.
	CategoryNoRule CategoryRule = iota
	// CategoryFromFile: the file records the memory profiler's categories (its entries carry "category"):
	// every block keeps what its entry says.
	CategoryFromFile
	// CategoryAutocastFrames: autocast's cached cast of a weight is on the stack (amp_cache).
	CategoryAutocastFrames
	// CategoryOptimizerInitFrames: the optimizer creating its state (_init_group) is on the stack.
	CategoryOptimizerInitFrames
	// CategoryAccumulateGradFrames: AccumulateGrad, which writes a parameter's .grad, is on the stack.
	CategoryAccumulateGradFrames
	// CategoryWeightFrames: the model's weights being made or moved (Module._apply behind .to and .cuda,
	// nn.Parameter, nn.init, a module's constructor, state-dict and checkpoint loading) is on the stack.
	CategoryWeightFrames
	// CategoryBeforeTraining: allocated before the first iteration and still alive when it begins.
	CategoryBeforeTraining
	// CategoryBatch: allocated at the start of an iteration, before its forward: the batch.
	CategoryBatch
	// CategoryOptimizerLives: allocated in the optimizer's step and alive after it.
	CategoryOptimizerLives
	// CategoryOptimizerTemp: allocated in the optimizer's step and freed within it.
	CategoryOptimizerTemp
	// CategoryBackwardLives: allocated in backward and alive after it: a gradient.
	CategoryBackwardLives
	// CategoryBackwardTemp: allocated in backward and freed within it: an intermediate gradient.
	CategoryBackwardTemp
	// CategoryFreedInBackward: allocated in forward (or a checkpoint's recompute) and freed in backward:
	// saved for it.
	CategoryFreedInBackward
	// CategoryForwardTemp: allocated in forward and freed within it.
	CategoryForwardTemp
	// CategoryForwardLives: allocated in forward and alive after its backward (or never freed): an
	// activation kept, by a retained graph or a stashed output.
	CategoryForwardLives
	// CategoryRecorded: oomdbg record tagged the block (a parameter, gradient, optimizer state or the
	// batch, from the job's modules and optimizers); tried first.
	CategoryRecorded
	// CategoryNotRecorded: oomdbg record tags every block of the category the other rules give, and did
	// not tag this one: it is unknown.
	CategoryNotRecorded
	// CategoryBeforeTrace: alive before the trace began (the history was turned on after the model was
	// loaded, or a ring buffer dropped its start) and alive at its end: the model's weights and buffers.
	CategoryBeforeTrace
	// CategoryBeforeTraceFreedInBackward: alive before the trace began and freed in backward: saved for it.
	CategoryBeforeTraceFreedInBackward
	// CategoryBeforeTraceFreedInZeroGrad: alive before the trace began and freed by zero_grad: a gradient.
	CategoryBeforeTraceFreedInZeroGrad
	// CategoryCutForwardSaved: allocated in the forward of the iteration the trace's OOM cut short and
	// alive at the OOM, as most other blocks of its stack there are (or it is the only one): saved for
	// backward.
	CategoryCutForwardSaved
	// CategoryCutForwardTemp: allocated in the forward of the iteration the OOM cut short and alive at the
	// OOM, where most other blocks of its stack there were freed within the forward: a temporary.
	CategoryCutForwardTemp
	// CategoryCutBackwardKept: allocated in the backward the OOM cut short, alive at the OOM, as most other
	// blocks of its stack in that backward are: a gradient.
	CategoryCutBackwardKept
	// CategoryCutBackwardFreed: allocated in the backward the OOM cut short, alive at the OOM, where most
	// other blocks of its stack were freed within the backward: an intermediate gradient.
	CategoryCutBackwardFreed
	// CategoryCutGradient: allocated in the backward the OOM cut short, alive at the OOM, the only block of
	// its stack there, the size of a parameter: its gradient.
	CategoryCutGradient
	// CategoryCutBackwardTemp: allocated in the backward the OOM cut short, alive at the OOM, the only
	// block of its stack there, the size of no parameter: an intermediate gradient.
	CategoryCutBackwardTemp
	// CategoryCutOptimizerTemp: allocated in the optimizer step the OOM cut short, alive at the OOM, without
	// the state's init (_init_group) on its stack: one of the step's temporaries.
	CategoryCutOptimizerTemp
)

var categoryRuleReasons = [...]string{
	CategoryNoRule:               "nothing decides",
	CategoryFromFile:             "recorded in the file",
	CategoryAutocastFrames:       "autocast's cached cast is on the stack",
	CategoryOptimizerInitFrames:  "the optimizer's state init (_init_group) is on the stack",
	CategoryAccumulateGradFrames: "AccumulateGrad is on the stack",
	CategoryWeightFrames:         "weights made or moved (Module._apply, nn.Parameter, loading) on the stack",
	CategoryBeforeTraining:       "allocated before the first iteration, alive when it began",
	CategoryBatch:                "allocated at the start of an iteration, before its forward",
	CategoryOptimizerLives:       "allocated in the optimizer step, alive after it",
	CategoryOptimizerTemp:        "allocated and freed in the optimizer step",
	CategoryBackwardLives:        "allocated in backward, alive after it",
	CategoryBackwardTemp:         "allocated and freed in backward",
	CategoryFreedInBackward:      "allocated in forward, freed in backward",
	CategoryForwardTemp:          "allocated and freed in forward",
	CategoryForwardLives:         "allocated in forward, alive after its backward",
	CategoryRecorded:             "recorded by oomdbg record",
	CategoryNotRecorded:          "not among the blocks oomdbg record tagged with that category",

	CategoryBeforeTrace:                "alive before the trace began and at its end: weights and buffers",
	CategoryBeforeTraceFreedInBackward: "alive before the trace began, freed in backward",
	CategoryBeforeTraceFreedInZeroGrad: "alive before the trace began, freed by zero_grad",
	CategoryCutForwardSaved:            "allocated in the forward the OOM cut short, alive at the OOM as its stack's other blocks are",
	CategoryCutForwardTemp:             "allocated in the forward the OOM cut short; its stack's other blocks were freed within the forward",
	CategoryCutBackwardKept:            "allocated in the backward the OOM cut short, alive at the OOM as its stack's other blocks are",
	CategoryCutBackwardFreed:           "allocated in the backward the OOM cut short; its stack's other blocks were freed within it",
	CategoryCutGradient:                "allocated in the backward the OOM cut short, alive at the OOM, a parameter's size",
	CategoryCutBackwardTemp:            "allocated in the backward the OOM cut short, alive at the OOM, no parameter's size",
	CategoryCutOptimizerTemp:           "allocated in the optimizer step the OOM cut short, not the state's init",
}

// String says why, e.g. "allocated in forward, freed in backward".
func (r CategoryRule) String() string {
	if int(r) < len(categoryRuleReasons) {
		return categoryRuleReasons[r]
	}
	return "an unknown rule"
}

// categoryOf is the category each rule gives.
var categoryOf = [...]snapshot.Category{
	CategoryNoRule:               snapshot.CategoryUnknown,
	CategoryAutocastFrames:       snapshot.CategoryAMPCache,
	CategoryOptimizerInitFrames:  snapshot.CategoryOptimizerState,
	CategoryAccumulateGradFrames: snapshot.CategoryGradient,
	CategoryWeightFrames:         snapshot.CategoryParameter,
	CategoryBeforeTraining:       snapshot.CategoryParameter,
	CategoryBatch:                snapshot.CategoryInput,
	CategoryOptimizerLives:       snapshot.CategoryOptimizerState,
	CategoryOptimizerTemp:        snapshot.CategoryTemporary,
	CategoryBackwardLives:        snapshot.CategoryGradient,
	CategoryBackwardTemp:         snapshot.CategoryAutogradDetail,
	CategoryFreedInBackward:      snapshot.CategoryActivation,
	CategoryForwardTemp:          snapshot.CategoryTemporary,
	CategoryForwardLives:         snapshot.CategoryActivation,
	CategoryRecorded:             snapshot.CategoryUnknown, // the block's own
	CategoryNotRecorded:          snapshot.CategoryUnknown,

	CategoryBeforeTrace:                snapshot.CategoryParameter,
	CategoryBeforeTraceFreedInBackward: snapshot.CategoryActivation,
	CategoryBeforeTraceFreedInZeroGrad: snapshot.CategoryGradient,
	CategoryCutForwardSaved:            snapshot.CategoryActivation,
	CategoryCutForwardTemp:             snapshot.CategoryTemporary,
	CategoryCutBackwardKept:            snapshot.CategoryGradient,
	CategoryCutBackwardFreed:           snapshot.CategoryAutogradDetail,
	CategoryCutGradient:                snapshot.CategoryGradient,
	CategoryCutBackwardTemp:            snapshot.CategoryAutogradDetail,
	CategoryCutOptimizerTemp:           snapshot.CategoryTemporary,
}

// lifetime is one block's allocation and the request to free it.
type lifetime struct {
	alloc int
	free  int // its free_requested, -1 while alive
}

// blocks gives every allocation its category and module.
func (t *trace) blocks(bounds []Boundary) []BlockTag {
	c := t.newCategorizer(bounds)
	rules := make([]CategoryRule, len(t.lives))
	for j, l := range t.lives {
		e := t.at(l.alloc)
		rules[j] = c.rule(e, t.facts(e), l)
	}
	c.cutRules(rules)
	out := make([]BlockTag, len(t.lives))
	for j, l := range t.lives {
		e := t.at(l.alloc)
		r := rules[j]
		if rec := t.origin.Recorded; rec != nil && r != CategoryFromFile {
			switch {
			case e.Category != snapshot.CategoryUnknown:
				r = CategoryRecorded
			case slices.Contains(rec.Categories, categoryOf[r].String()):
				r = CategoryNotRecorded
			}
		}
		cat := categoryOf[r]
		if r == CategoryFromFile || r == CategoryRecorded {
			cat = e.Category
		}
		out[j] = BlockTag{Seq: l.alloc, Category: cat, Rule: r, Scope: Scope{Module: t.facts(e).module, Layer: noLayer}}
	}
	return out
}

// categorizer decides the blocks' categories from the iterations the trace holds.
type categorizer struct {
	t      *trace
	bounds []Boundary
	// firstTraining is each iteration's first training allocation: what comes before it in the iteration
	// is the batch.
	firstTraining []int
	// end is where what the trace shows of the blocks' lives ends: the out-of-memory error it ends in
	// (frees after it are the exception unwinding, not the program's), else the trace's end.
	end int
	// cut is the index in bounds of the iteration the OOM at end cut short, -1 when none did; cutPhase is
	// the phase it was in.
	cut      int
	cutPhase snapshot.Phase
}

func (t *trace) newCategorizer(bounds []Boundary) *categorizer {
	c := &categorizer{t: t, bounds: bounds, firstTraining: make([]int, len(bounds)), end: t.len(), cut: -1}
	for k, b := range bounds {
		end := t.len()
		if k+1 < len(bounds) {
			end = bounds[k+1].Seq
		}
		c.firstTraining[k] = end
		for i := b.Seq; i < end; i++ {
			if t.training(t.at(i)) {
				c.firstTraining[k] = i
				break
			}
		}
	}
	c.findCut()
	return c
}

// iterAt returns the index in bounds of the iteration holding seq, -1 before the first.
func (c *categorizer) iterAt(seq int) int {
	return sort.Search(len(c.bounds), func(k int) bool { return c.bounds[k].Seq > seq }) - 1
}

// rule decides one block's category: from the file, then from frames that name what the block is, then
// from the phase it was allocated in and the phase it was freed in.
func (c *categorizer) rule(e *snapshot.Event, sf stackFacts, l lifetime) CategoryRule {
	t, bounds := c.t, c.bounds
	switch {
	case t.origin.CategoriesRecorded:
		return CategoryFromFile // the profiler's categories, unknown included, are the file's word
	case sf.has(factAMPCast):
		return CategoryAutocastFrames
	case sf.has(factOptimizerInit):
		return CategoryOptimizerInitFrames
	case sf.has(factGradWrite):
		return CategoryAccumulateGradFrames
	case sf.has(factParam):
		return CategoryWeightFrames
	case len(bounds) == 0:
		// Not training (no iterations): forward, backward and step do not say what a block holds.
		return CategoryNoRule
	case t.reconstructed(e):
		return c.beforeTrace(l)
	case c.cutShort(e, l):
		return CategoryNoRule // cutRules decides, from what the other blocks' rules say
	}
	if c.alive(l) {
		l.free = -1 // freed after the OOM the trace ends in, by the exception unwinding the step
	}
	it := c.iterAt(l.alloc)
	if it < 0 {
		if l.free < 0 || l.free >= bounds[0].Seq {
			return CategoryBeforeTraining
		}
		return CategoryNoRule
	}
	// The free's phase, when it is in the same iteration.
	var freePhase snapshot.Phase
	same := l.free >= 0 && c.iterAt(l.free) == it
	if same {
		freePhase = t.at(l.free).Phase
	}
	switch e.Phase {
	case snapshot.PhaseOptimizer, snapshot.PhaseZeroGrad:
		if same && (freePhase == snapshot.PhaseOptimizer || freePhase == snapshot.PhaseZeroGrad) {
			return CategoryOptimizerTemp
		}
		return CategoryOptimizerLives
	case snapshot.PhaseBackward:
		if same && (freePhase == snapshot.PhaseBackward || freePhase == snapshot.PhaseRecompute) {
			return CategoryBackwardTemp
		}
		return CategoryBackwardLives
	case snapshot.PhaseForward, snapshot.PhaseRecompute:
		switch {
		case l.free >= 0 && t.at(l.free).Phase == snapshot.PhaseBackward || same && freePhase == snapshot.PhaseRecompute:
			return CategoryFreedInBackward
		case same && freePhase == snapshot.PhaseForward:
			return CategoryForwardTemp
		}
		return CategoryForwardLives
	case snapshot.PhaseNone, snapshot.PhaseData:
		if it >= 0 && l.alloc < c.firstTraining[it] {
			return CategoryBatch
		}
	}
	return CategoryNoRule
}
