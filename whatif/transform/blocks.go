package transform

import (
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
