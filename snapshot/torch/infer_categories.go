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
}

// lifetime is one block's allocation and the request to free it.
type lifetime struct {
	alloc int
	free  int // its free_requested, -1 while alive
}

// blocks gives every allocation its category and module.
func (t *trace) blocks(bounds []Boundary) []BlockTag {
	lives := t.lives
	// Each iteration's first training allocation: what comes before it in the iteration is the batch.
	firstTraining := make([]int, len(bounds))
	for k, b := range bounds {
		end := t.len()
		if k+1 < len(bounds) {
			end = bounds[k+1].Seq
		}
		firstTraining[k] = end
		for i := b.Seq; i < end; i++ {
			if t.training(t.at(i)) {
				firstTraining[k] = i
				break
			}
		}
	}
	iterAt := func(seq int) int { // index in bounds of the iteration holding seq, -1 before the first
		return sort.Search(len(bounds), func(k int) bool { return bounds[k].Seq > seq }) - 1
	}
	out := make([]BlockTag, len(lives))
	for j, l := range lives {
		e := t.at(l.alloc)
		sf := t.facts(e)
		r := t.rule(e, sf, l, bounds, firstTraining, iterAt)
		if rec := t.origin.Recorded; rec != nil && r != CategoryFromFile {
			switch {
			case e.Category != snapshot.CategoryUnknown:
				r = CategoryRecorded
			case slices.Contains(rec.Categories, categoryOf[r].String()):
				r = CategoryNotRecorded
			}
		}
		c := categoryOf[r]
		if r == CategoryFromFile || r == CategoryRecorded {
			c = e.Category
		}
		out[j] = BlockTag{Seq: l.alloc, Category: c, Rule: r, Module: sf.module}
	}
	return out
}

// rule decides one block's category: from the file, then from frames that name what the block is, then
// from the phase it was allocated in and the phase it was freed in.
func (t *trace) rule(e *snapshot.Event, sf stackFacts, l lifetime, bounds []Boundary, firstTraining []int, iterAt func(int) int) CategoryRule {
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
	}
	if t.reconstructed(e) || len(bounds) == 0 {
		// When it was allocated, and in what phase, is not known; or the trace is not training (no
		// iterations), where forward, backward and step do not say what a block holds.
		return CategoryNoRule
	}
	it := iterAt(l.alloc)
	if it < 0 {
		if l.free < 0 || l.free >= bounds[0].Seq {
			return CategoryBeforeTraining
		}
		return CategoryNoRule
	}
	// The free's phase, when it is in the same iteration.
	var freePhase snapshot.Phase
	same := l.free >= 0 && iterAt(l.free) == it
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
		if it >= 0 && l.alloc < firstTraining[it] {
			return CategoryBatch
		}
	}
	return CategoryNoRule
}
