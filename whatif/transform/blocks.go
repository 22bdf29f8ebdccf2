package transform

import (
	"slices"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/internal/periodic"
	"github.com/oomdbg/oomdbg/snapshot"
)

// blocks finds the repeated blocks of a trace's scopes: the prefix with the most distinct indices, and each
// scope's block index (-1: none).
func (t *trace) blocks() (prefix string, count int, of map[snapshot.StringID]int) {
	indices := map[string]map[int]bool{}
	seen := map[snapshot.StringID]bool{}
	for i := range t.events {
		e := &t.events[i]
		if e.Action != snapshot.ActionAlloc || e.Scope == 0 || seen[e.Scope] || int(e.Scope) >= len(t.strings) {
			continue
		}
		seen[e.Scope] = true
		parts := strings.Split(modulePath(t.strings[e.Scope]), ".")
		for k := 1; k < len(parts); k++ {
			if n, err := strconv.Atoi(parts[k]); err == nil && n >= 0 && parts[k] == strconv.Itoa(n) {
				p := strings.Join(parts[:k], ".")
				if indices[p] == nil {
					indices[p] = map[int]bool{}
				}
				indices[p][n] = true
			}
		}
	}
	for p, ns := range indices {
		if len(ns) > count || (len(ns) == count && len(p) < len(prefix)) {
			prefix, count = p, len(ns)
		}
	}
	of = map[snapshot.StringID]int{}
	if count < 2 {
		return "", 0, of
	}
	for id := range seen {
		rest, ok := strings.CutPrefix(modulePath(t.strings[id]), prefix+".")
		if !ok {
			continue
		}
		idx, _, _ := strings.Cut(rest, ".")
		if n, err := strconv.Atoi(idx); err == nil && idx == strconv.Itoa(n) {
			of[id] = n
		}
	}
	return prefix, count, of
}

// modulePath is the module path a scope names: its text up to the first colon or space, since a PyTorch
// snapshot's user_metadata, which becomes the scope, often follows the module with a label
// ("transformer.h.0.attn: f32[8,256,768] qkv").
func modulePath(scope string) string {
	if i := strings.IndexAny(scope, ": "); i >= 0 {
		return scope[:i]
	}
	return scope
}

// span is where one block's events lie in one forward or backward pass: [first, last].
type span struct{ first, last int }

// passBlocks finds, in the pass of phase p beginning at event start, each block's span, and the index of the
// event ending the pass.
func (t *trace) passBlocks(start int, blockOf func(snapshot.StringID) (int, bool)) (map[int]span, int) {
	spans := map[int]span{}
	i := start + 1
	for ; i < len(t.events); i++ {
		e := &t.events[i]
		if e.Action == snapshot.ActionPhase || e.Action == snapshot.ActionIteration {
			break
		}
		if n, ok := blockOf(e.Scope); ok {
			s, seen := spans[n]
			if !seen {
				s.first = i
			}
			s.last = i
			spans[n] = s
		}
	}
	return spans, i
}

// The search for repeated blocks is bounded, since it takes the pass's allocations times the starts it
// tries: a pass of at most maxBlockSearch allocations (a GPT-2 block makes about 25: over 300 blocks), whose
// blocks begin within its first maxBlockStart (after the embedding and whatever precedes the first block).
const (
	maxBlockSearch = 8192
	maxBlockStart  = 256
)

// repeatedBlocks finds the repeated blocks of the pass that begins at marker start where no scope names
// them: the longest stretch of the pass's allocations, by size and stack, that repeats one period at least
// twice (periodic.Prefix from each of the first allocations on). Of the longest, a forward pass takes the
// earliest and a backward pass (last) the latest: what precedes the first block's forward (the embedding)
// does not repeat it, but what follows the last block's forward, a final norm, may look like a block's first
// op, and it leads the backward pass, where the earliest stretch would give each block's backward the
// next block's last op. Each repetition is a block: its span runs from its first allocation to the event
// before the next repetition's (or the pass's next allocation). It returns the blocks in order, the pass's
// end and the period. A backward pass asked for want blocks (0: any) that finds one fewer, with allocations
// after the repeated stretch, takes those for the last block's backward, which is the first block's: a
// first block whose input needs no gradient (the embeddings of a frozen model under LoRA) computes none,
// so its backward is shorter than the others' and does not repeat them.
func (t *trace) repeatedBlocks(start int, last bool, want int) ([]span, int, int) {
	var seqs []int
	var toks []allocKey
	i := start + 1
	for ; i < len(t.events); i++ {
		e := &t.events[i]
		if e.Action == snapshot.ActionPhase || e.Action == snapshot.ActionIteration {
			break
		}
		if e.Action == snapshot.ActionAlloc && (t.pre == 0 || e.Label != t.pre) {
			seqs = append(seqs, i)
			toks = append(toks, allocKey{e.Size, e.Stack})
		}
	}
	end, n := i, len(toks)
	if n > maxBlockSearch {
		return nil, end, 0
	}
	from, full, period := 0, 0, 0
	for s := 0; (n-s > full || last && n-s == full && full > 0) && s < maxBlockStart; s++ {
		l, p := periodic.Prefix(n-s, func(i int) allocKey { return toks[s+i] }, 2)
		if p > 0 && (l/p*p > full || last && l/p*p == full) {
			from, full, period = s, l/p*p, p
		}
	}
	if period == 0 {
		return nil, end, 0
	}
	var blocks []span
	for k := from; k < from+full; k += period {
		last := end - 1
		if k+period < n {
			last = seqs[k+period] - 1
		}
		blocks = append(blocks, span{seqs[k], last})
	}
	if rest := from + full; last && full/period == want-1 && rest < n {
		blocks = append(blocks, span{seqs[rest], end - 1})
	}
	return blocks, end, period
}

// alignBackward moves the boundaries of a backward pass's repeated blocks, found by repeatedBlocks from the
// pass's marker start, to where the blocks' own releases put them. The repetition fixes a block's length,
// not where it begins: the first block's backward whose start looks like the blocks' (a frozen model's
// first block, whose input needs no gradient, runs its later ops only) lets the latest repeating stretch
// begin part way into each block, so that each span ends with the next block's first ops, and a
// recompute placed at a span's start comes after the ops it was for. Each block's backward releases what
// its forward saved for it (released[j]: the sorted indices of those releases, for the pass's block j): of
// the shifts by less than a period, in allocations, that keep the spans in the pass, the one whose spans
// hold most of their own releases wins, and of those the earliest, which begins a block's backward right
// after the block before it last released what it saved. Without releases to go by, the spans are kept.
func (t *trace) alignBackward(start int, blocks []span, released [][]int) []span {
	if len(blocks) < 2 || len(released) != len(blocks) {
		return blocks
	}
	total := 0
	for _, r := range released {
		total += len(r)
	}
	if total == 0 {
		return blocks
	}
	var seqs []int // the pass's allocations, as repeatedBlocks counts them
	end := start + 1
	for ; end < len(t.events); end++ {
		e := &t.events[end]
		if e.Action == snapshot.ActionPhase || e.Action == snapshot.ActionIteration {
			break
		}
		if e.Action == snapshot.ActionAlloc && (t.pre == 0 || e.Label != t.pre) {
			seqs = append(seqs, end)
		}
	}
	// The blocks' first allocations and the allocation after the last block (len(seqs): the pass's end,
	// which stays where it is).
	bounds := make([]int, len(blocks)+1)
	for j, b := range blocks {
		i, ok := slices.BinarySearch(seqs, b.first)
		if !ok {
			return blocks
		}
		bounds[j] = i
	}
	last := blocks[len(blocks)-1].last
	bounds[len(blocks)], _ = slices.BinarySearch(seqs, last+1)
	keepEnd := last >= end-1
	period := bounds[1] - bounds[0]
	at := func(b, d int) int { // the event index of shifted bound b
		if b == len(blocks) && keepEnd {
			return end
		}
		if i := bounds[b] + d; i < len(seqs) {
			return seqs[i]
		}
		return end
	}
	best, bestScore := 0, -1
	for d := -(period - 1); d < period; d++ {
		if bounds[0]+d < 0 || !keepEnd && bounds[len(blocks)]+d > len(seqs) || bounds[len(blocks)-1]+d >= len(seqs) {
			continue
		}
		score := 0
		for j, r := range released {
			lo, _ := slices.BinarySearch(r, at(j, d))
			hi, _ := slices.BinarySearch(r, at(j+1, d))
			score += hi - lo
		}
		if score > bestScore {
			best, bestScore = d, score
		}
	}
	if best == 0 {
		return blocks
	}
	out := make([]span, len(blocks))
	for j := range blocks {
		out[j] = span{at(j, best), at(j+1, best) - 1}
	}
	return out
}
