package leaks

import (
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// HeldGroup is a group of blocks (one allocating stack, module scope and category) that training allocated
// and that outlive their iteration without growing: alive at the end of the last measured iteration,
// allocated in it or an earlier one. A module's attribute, logits kept until the next forward, gradients
// zero_grad never clears.
type HeldGroup struct {
	Scope    string // "(no scope)" when the blocks have none
	Category snapshot.Category
	// Stack is the allocating stack, innermost first, without the allocator's frames: "function file:line".
	Stack []string
	Bytes int64 // block bytes alive at the last point
	Count int   // blocks alive at the last point
	// Iterations are the iterations the blocks were allocated in.
	Iterations []int32

	// Example is the group's last block allocated, Label its tensor label.
	Example timeline.Allocation
	Label   string
	// RetainedBy says what held Example at the nearest heap dump; nil when no heap dump named it.
	RetainedBy *RetainerPath
}

// Site returns the innermost frame of the allocating stack, "" without a stack.
func (h *HeldGroup) Site() string { return innermost(h.Stack) }

// role is what a block is to training, by its category, or by the phase that allocated it when the category
// is unknown (an imported trace): what the optimizer step keeps is its state, what backward keeps its
// gradients.
type role uint8

const (
	roleOther role = iota
	roleParameter
	roleOptimizerState
	roleGradient
)

func roleOf(b *timeline.Allocation) role {
	switch b.Category {
	case snapshot.CategoryParameter:
		return roleParameter
	case snapshot.CategoryOptimizerState:
		return roleOptimizerState
	case snapshot.CategoryGradient:
		return roleGradient
	case snapshot.CategoryUnknown:
		switch b.Phase {
		case snapshot.PhaseOptimizer:
			return roleOptimizerState
		case snapshot.PhaseBackward:
			return roleGradient
		}
	}
	return roleOther
}

// held groups the blocks of live (the live set at the last point) that training allocated and that are
// neither parameters, optimizer state, gradients zero_grad clears (gradientsHeld false), growing suspects,
// nor left out by the options. Largest first.
func held(s *snapshot.Snapshot, m measurer, c *config, live []timeline.Allocation, suspects map[groupKey]bool, gradientsHeld bool, last Point) []HeldGroup {
	index := map[groupKey]int{}
	var groups []HeldGroup
	var keys []groupKey
	for _, b := range live {
		if b.Iteration < 0 { // setup: the model, its buffers
			continue
		}
		switch roleOf(&b) {
		case roleParameter, roleOptimizerState:
			continue
		case roleGradient:
			if !gradientsHeld {
				continue
			}
		}
		k := groupKey{b.Stack, b.Scope, b.Category}
		if suspects[k] || c.ignored(s, k) {
			continue
		}
		i, ok := index[k]
		if !ok {
			i = len(groups)
			index[k] = i
			groups = append(groups, HeldGroup{Scope: scopeName(s, b.Scope), Category: b.Category})
			keys = append(keys, k)
		}
		h := &groups[i]
		h.Bytes += b.Size
		h.Count++
		if !slices.Contains(h.Iterations, b.Iteration) {
			h.Iterations = append(h.Iterations, b.Iteration)
		}
		h.Example = b // live is in allocation order: the last one wins
	}
	for i := range groups {
		h := &groups[i]
		slices.Sort(h.Iterations)
		h.Stack = userStack(s, keys[i].stack)
		h.Label = s.String(h.Example.Label)
		h.RetainedBy = retainedBy(m, h.Example, last.Seq)
	}
	rankSites(groups, func(h *HeldGroup) site { return site{h.Bytes, h.Scope, h.Category, h.Example.Alloc} })
	return groups
}

// retainedBy returns what held block b at the heap dump nearest to event at, nil when none names it.
func retainedBy(m measurer, b timeline.Allocation, at int) *RetainerPath {
	p, ok := m.retainer(b, at)
	if !ok {
		return nil
	}
	r := &RetainerPath{Root: p.Root(), Dump: p.Dump.Seq, Reason: p.Dump.Reason}
	for _, h := range p.Holders {
		r.Path = append(r.Path, h.Description)
	}
	return r
}
