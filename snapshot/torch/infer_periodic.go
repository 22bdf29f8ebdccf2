package torch

import (
	"slices"

	"github.com/oomdbg/oomdbg/internal/periodic"
	"github.com/oomdbg/oomdbg/snapshot"
)

// periodicRepeats is how many times the allocations must repeat before they are read as iterations: two
// would take any loop that runs twice (a model's identical layers in one forward) for training.
const periodicRepeats = 3

// allocToken is what makes two allocations the same step of a loop: the size, from the same stack.
type allocToken struct {
	size  int64
	stack snapshot.StackID
}

// periodic finds iterations in a trace where no frames or regions name a phase (a snapshot recorded
// without stacks): a training loop allocates the same sizes from the same stacks every iteration. The
// period is the shortest one of the longest stretch of the trace that repeats at least periodicRepeats
// times, found from the trace's end, since the first iteration differs (gradients and optimizer state are
// created) and a trace may stop mid-iteration (an OOM). A repetition is training only where memory rises
// and falls within it by more than it grows from one to the next (a forward pass that keeps its
// activations grows by what it allocated). Each iteration begins at the allocation of the period that the
// fewest short-lived blocks live across (a block that lives less than a period: activations, gradients
// freed by zero_grad, temporaries), ties going to the lowest memory, then to the most frees just before it
// (an iteration ends freeing: the step's temporaries, zero_grad's gradients): between an optimizer step
// and the next batch.
func (t *trace) periodic() []Boundary {
	// Sized once (every block the trace allocates is in t.lives): grown by appending, the two would take
	// their size twice over while they are copied.
	seqs := make([]int, 0, len(t.lives))
	toks := make([]allocToken, 0, len(t.lives))
	for i := range t.len() {
		if e := t.at(i); t.allocation(e) {
			seqs = append(seqs, i)
			toks = append(toks, allocToken{e.Size, e.Stack})
		}
	}
	n := len(toks)
	if n < 2*periodicRepeats {
		return nil
	}
	// The stretch read from the end.
	span, period := periodic.Prefix(n, func(i int) allocToken { return toks[n-1-i] }, periodicRepeats)
	if period == 0 {
		return nil
	}
	first := n - span // the first token of the repeating stretch

	// Allocated bytes before each token, and the token at which each block of the stretch is freed.
	before := make([]int64, span)
	frees := make([]int, span)   // frees just before each token
	freedAt := make([]int, span) // in tokens from first; span when never
	open := map[uint64]int{}     // addr (with device) -> token
	var alloc int64
	k := 0 // tokens seen
	for i := range t.len() {
		e := t.at(i)
		if t.reconstructed(e) {
			continue
		}
		key := uint64(e.Addr) ^ uint64(uint16(e.Device))<<48
		switch {
		case t.allocation(e):
			if k >= first {
				before[k-first], freedAt[k-first] = alloc, span
				open[key] = k - first
			}
			alloc += e.Size
			k++
		case e.Action == snapshot.ActionFreeRequested:
			alloc -= e.Size
			if k >= first && k < n {
				frees[k-first]++
			}
			if j, ok := open[key]; ok {
				freedAt[j] = k - first
				delete(open, key)
			}
		}
	}
	// Within one period of the stretch (its second, clear of the boundary with what came before), rise and
	// fall against growth.
	lo, hi := before[period], before[period]
	for j := period; j < 2*period; j++ {
		lo, hi = min(lo, before[j]), max(hi, before[j])
	}
	if growth := before[2*period] - before[period]; hi-lo <= 2*max(growth, -growth) {
		return nil
	}
	// The cut: fewest short-lived blocks across it, then lowest memory, over that period.
	best, bestCross := -1, 0
	for r := period; r < 2*period; r++ {
		cross := 0
		for j := r - period + 1; j < r; j++ { // blocks allocated less than a period before r
			if f := freedAt[j]; f > r && f-j < period { // freed after token r
				cross++
			}
		}
		if best < 0 || cross < bestCross || cross == bestCross && (before[r] < before[best] || before[r] == before[best] && frees[r] > frees[best]) {
			best, bestCross = r, cross
		}
	}
	// Iterations begin at the cut, through the stretch; the first iteration, longer than the rest (it
	// creates gradients and optimizer state), begins at the cut's allocation before the stretch, if one
	// and the same allocations after it are found at most two periods back.
	cut := first + best%period
	m := min(16, period) // the allocations that must follow it as they follow the cut
	for j := cut - period; j >= 0 && j >= cut-2*period; j-- {
		if slices.Equal(toks[j:j+m], toks[cut:cut+m]) {
			cut = j
			break
		}
	}
	var b []Boundary
	for j := cut; j < n; {
		b = append(b, Boundary{Seq: seqs[j], Iteration: int32(len(b))})
		if j < first+best%period {
			j = first + best%period
		} else {
			j += period
		}
	}
	return b
}
