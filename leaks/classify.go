package leaks

import (
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// suspectFrames is how many frames of a site's stack are kept.
const suspectFrames = 8

// userStack returns a site's allocating stack, innermost first, without the allocator's frames, as
// "function file:line", suspectFrames at most.
func userStack(s *snapshot.Snapshot, stack snapshot.StackID) []string {
	var out []string
	for _, f := range s.UserFrames(stack, suspectFrames) {
		out = append(out, s.FrameString(f))
	}
	return out
}

// scopeName returns the module scope a site's blocks were allocated in, noScope for none.
func scopeName(s *snapshot.Snapshot, scope snapshot.StringID) string {
	if name := s.String(scope); name != "" {
		return name
	}
	return noScope
}

// suspect describes growing group g over n measured iterations; live is the live set at the last point.
func suspect(s *snapshot.Snapshot, m measurer, g *group, n int, firstMeasured int32, last Point, live []timeline.Allocation) *Suspect {
	sp := &Suspect{
		Scope:             scopeName(s, g.key.scope),
		Category:          g.key.category,
		Bytes:             g.bytes,
		Counts:            g.counts,
		BytesPerIteration: (g.bytes[n] - g.bytes[0]) / int64(n),
		CountPerIteration: float64(g.counts[n]-g.counts[0]) / float64(n),
	}
	sp.Stack = userStack(s, g.key.stack)

	// The survivors, and the example: a block that outlived the end of an iteration after its own, so that
	// what holds it is what grows and not a name rebound every iteration (nanoGPT's logits hold the newest
	// iteration's graph too, by a shorter path than the loss kept in a list). That is the last block
	// allocated in a measured iteration before the last; else the last one allocated in a measured
	// iteration; else the last one.
	example, rank := -1, -1
	for i := range live {
		b := &live[i]
		if b.Stack != g.key.stack || b.Scope != g.key.scope || b.Category != g.key.category {
			continue
		}
		if !slices.Contains(sp.Survivors, b.Iteration) {
			sp.Survivors = append(sp.Survivors, b.Iteration)
		}
		r := 0
		if b.Iteration >= firstMeasured {
			r = 1
			if b.Iteration < last.Iteration {
				r = 2
			}
		}
		if r >= rank {
			example, rank = i, r
		}
	}
	slices.Sort(sp.Survivors)
	if example >= 0 {
		sp.Example = live[example]
		sp.Label = s.String(sp.Example.Label)
		sp.RetainedBy = retainedBy(m, sp.Example, last.Seq)
	}
	sp.Kind = classify(sp, g, n)
	return sp
}

// classify says what keeps a growing group's blocks alive.
func classify(sp *Suspect, g *group, n int) Kind {
	// Bytes grow but blocks do not multiply: the same place holds a larger block each time.
	if g.counts[n] <= g.counts[0] {
		return GrowingCache
	}
	if r := sp.RetainedBy; r != nil {
		// Through an autograd node: the graph holds what it saved for backward, and something holds the
		// graph (a loss in a list, an output kept with its grad_fn).
		if slices.ContainsFunc(r.Path, autogradHolder) {
			return RetainedGraph
		}
		if slices.ContainsFunc(r.Path, func(h string) bool { return strings.Contains(strings.ToLower(h), "cache") }) {
			return GrowingCache
		}
		return StashedOutputs
	}
	// No heap dump names the blocks (an imported trace): go by what they hold.
	switch sp.Category {
	case snapshot.CategoryActivation, snapshot.CategoryAutogradDetail:
		return RetainedGraph
	case snapshot.CategoryAMPCache:
		return GrowingCache
	}
	return Unclassified
}

// autogradHolder reports whether a holder is an autograd node or one of its saved slots, e.g.
// "AddmmBackward0[net.2]" or "AddmmBackward0[net.2] saved mat1".
func autogradHolder(desc string) bool {
	return strings.Contains(desc, "Backward") || strings.Contains(desc, " saved ")
}
