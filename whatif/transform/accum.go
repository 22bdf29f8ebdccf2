package transform

import (
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Accumulate is gradient accumulation over k micro-batches (2 <= k <= 64) with the same effective batch: the
// batch scales by 1/k (BatchScale), and each iteration's data loading, forward and backward run k times
// before its optimizer step. The first micro-step's backward allocates the gradients that do not exist yet;
// the later ones add theirs in place (PyTorch's AccumulateGrad), so a gradient they would have made is
// released as soon as it is added, and a copy made into .grad is not made. What one micro-step keeps for the
// next (nanoGPT's loop holds the logits until the next forward returns) is released where the recording
// released the previous iteration's.
func Accumulate(k int) Transform {
	name := fmt.Sprintf("accumulate %d", k)
	return Transform{Name: name, repeats: k, apply: func(t *trace) (*trace, string, error) {
		if err := CheckAccumulate(k); err != nil {
			return nil, "", err
		}
		scaledT, scaleLine, err := BatchScale(1 / float64(k)).apply(t)
		if err != nil {
			return nil, "", err
		}
		out, line, err := repeatMicroSteps(scaledT, k, name)
		if err != nil {
			return nil, "", err
		}
		return out, line + "; " + scaleLine, nil
	}}
}

// CheckAccumulate says whether gradients can be accumulated over k micro-batches: 2 to 64.
func CheckAccumulate(k int) error {
	if k < 2 || k > 64 {
		return fmt.Errorf("accumulate %d: the number of micro-batches must be between 2 and 64", k)
	}
	return nil
}

// region is the part of one iteration that gradient accumulation repeats: [start, end) of the events,
// from its data (or forward) phase to its optimizer phase. complete is false when the trace ends before the
// optimizer phase.
type region struct {
	start, end int
	iteration  int32
	complete   bool
}

// microRegions finds every iteration's data-forward-backward region.
func (t *trace) microRegions() []region {
	var rs []region
	open := -1
	var it int32
	for i := range t.events {
		e := &t.events[i]
		if e.Action != snapshot.ActionPhase {
			continue
		}
		switch e.Phase {
		case snapshot.PhaseData, snapshot.PhaseForward:
			if open < 0 && e.Iteration >= 0 {
				open, it = i, e.Iteration
			}
		case snapshot.PhaseOptimizer:
			if open >= 0 {
				rs = append(rs, region{start: open, end: i, iteration: it, complete: true})
				open = -1
			}
		case snapshot.PhaseEval, snapshot.PhaseZeroGrad, snapshot.PhaseSetup:
			open = -1 // a loop without an optimizer step: nothing to accumulate
		}
	}
	if open >= 0 {
		rs = append(rs, region{start: open, end: len(t.events), iteration: it})
	}
	return rs
}

func repeatMicroSteps(t *trace, k int, name string) (*trace, string, error) {
	rs := t.microRegions()
	if len(rs) == 0 {
		return nil, "", &MissingTagsError{name, "data, forward, backward and optimizer phase"}
	}
	bs := t.index()
	at := func(i int) int { // the region index i falls in, or -1
		j := sort.Search(len(rs), func(j int) bool { return rs[j].end > i })
		if j < len(rs) && i >= rs[j].start {
			return j
		}
		return -1
	}
	// A block a region leaves alive and the next iteration's region frees is carried to the next micro-step:
	// each copy but the last has its block released by the next copy, at the point the next region released
	// it. The last iteration has no next region: its carried blocks are those allocated where an earlier
	// region allocated one (iterations repeat the same code).
	carriedFree := make([]map[int][]uint64, len(rs)) // region -> offset in region -> blocks
	carry := func(ri int, addr uint64, off int) {
		if carriedFree[ri] == nil {
			carriedFree[ri] = map[int][]uint64{}
		}
		carriedFree[ri][off] = append(carriedFree[ri][off], addr)
	}
	pattern := map[int]int{}  // offset of a carried block's alloc in its region -> offset of its free in the next
	var unmatched []uint64    // blocks alive at the end of the last complete region
	for i := range t.events { // the blocks in the order they were allocated, so that the output is the same every time
		addr := t.events[i].Addr
		b := bs[addr]
		if t.events[i].Action != snapshot.ActionAlloc || b == nil || b.alloc != i {
			continue
		}
		ra := at(b.alloc)
		if ra < 0 || b.gradAt >= 0 {
			continue
		}
		rf := -1
		if b.free >= 0 {
			rf = at(b.free)
		}
		switch {
		case rf > ra && rs[rf].iteration == rs[ra].iteration+1:
			carry(ra, addr, b.free-rs[rf].start)
			pattern[b.alloc-rs[ra].start] = b.free - rs[rf].start
		case rf < 0 && (b.free < 0 || b.free >= rs[ra].end) && ra == len(rs)-1:
			unmatched = append(unmatched, addr)
		}
	}
	for _, addr := range unmatched {
		ri := len(rs) - 1
		if off, ok := pattern[bs[addr].alloc-rs[ri].start]; ok {
			carry(ri, addr, off)
		}
	}

	out := t.derive(len(t.events) * k)
	cur := map[uint64]uint64{} // address in t -> address of its newest copy
	addr := func(a uint64) uint64 {
		if c, ok := cur[a]; ok {
			return c
		}
		return a
	}
	var accumulated, notMade, incomplete int
	i := 0
	for ri, r := range rs {
		for ; i < r.start; i++ {
			out.emitMapped(t.events[i], addr)
		}
		copies := k
		if !r.complete {
			copies, incomplete = 1, incomplete+1
		}
		prevCopy := map[uint64]uint64{}
		n := r.end - r.start
		for c := 0; c < copies; c++ {
			thisCopy := map[uint64]uint64{}
			skipped := map[uint64]bool{}
			release := func(at snapshot.Event, offsets func(int) bool) {
				for _, off := range slices.Sorted(maps.Keys(carriedFree[ri])) { // in order: the same output every time
					if !offsets(off) {
						continue
					}
					for _, a := range carriedFree[ri][off] {
						if p, ok := prevCopy[a]; ok {
							f := freeEvents(at, p, bs[a].size, t.events[bs[a].alloc].BlockSize)
							out.events = append(out.events, f[0], f[1])
						}
					}
				}
			}
			for j := r.start; j < r.end; j++ {
				e := t.events[j]
				if c > 0 && len(carriedFree[ri][j-r.start]) > 0 {
					off := j - r.start
					release(e, func(o int) bool { return o == off })
				}
				b := bs[e.Addr]
				inRegion := b != nil && b.alloc >= r.start && b.alloc < r.end
				switch e.Action {
				case snapshot.ActionAlloc:
					if c > 0 && b != nil && b.gradAt == j {
						skipped[e.Addr] = true // the copy into .grad: the later micro-steps add in place
						notMade++
						continue
					}
					if c > 0 {
						thisCopy[e.Addr] = out.fresh()
						e.Addr = thisCopy[e.Addr]
					}
					out.events = append(out.events, e)
					continue
				case snapshot.ActionCategory:
					if c > 0 && inRegion && b.gradAt == j {
						// Added in place to the gradient: released at once.
						if a, ok := thisCopy[e.Addr]; ok {
							f := freeEvents(e, a, b.size, t.events[b.alloc].BlockSize)
							out.events = append(out.events, f[0], f[1])
							skipped[e.Addr] = true
							accumulated++
						}
						continue
					}
				case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
					if c > 0 && !inRegion && b != nil {
						continue // a block from before the region: the first micro-step released it
					}
				}
				if c > 0 && inRegion {
					if skipped[e.Addr] {
						continue
					}
					if a, ok := thisCopy[e.Addr]; ok {
						e.Addr = a
					}
				} else if !inRegion {
					e.Addr = addr(e.Addr)
				}
				out.events = append(out.events, e)
			}
			if c > 0 { // what a shorter region did not reach is released at its end
				release(t.events[r.end-1], func(o int) bool { return o >= n })
			}
			for a, fresh := range thisCopy {
				if !skipped[a] {
					cur[a] = fresh
				}
			}
			prevCopy = map[uint64]uint64{}
			for j := r.start; j < r.end; j++ {
				if e := &t.events[j]; e.Action == snapshot.ActionAlloc {
					if a, ok := thisCopy[e.Addr]; ok {
						prevCopy[e.Addr] = a
					} else if c == 0 {
						prevCopy[e.Addr] = e.Addr
					}
				}
			}
		}
		i = r.end
	}
	for ; i < len(t.events); i++ {
		out.emitMapped(t.events[i], addr)
	}
	line := fmt.Sprintf("%s: data, forward and backward run %d times per optimizer step in %d iterations; "+
		"%d gradients the later micro-steps made were added in place and released, %d copies into .grad not made",
		name, k, len(rs)-incomplete, accumulated, notMade)
	if incomplete > 0 {
		line += fmt.Sprintf("; the recording ends inside iteration %d's first micro-step: its other %d micro-steps "+
			"and what follows were never recorded", rs[len(rs)-1].iteration, k-1)
	}
	return out, line, nil
}

// emitMapped appends e with its address mapped.
func (t *trace) emitMapped(e snapshot.Event, addr func(uint64) uint64) {
	switch e.Action {
	case snapshot.ActionAlloc:
	case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted, snapshot.ActionCategory:
		e.Addr = addr(e.Addr)
	}
	t.events = append(t.events, e)
}
