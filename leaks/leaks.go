// Package leaks finds device memory that a training loop keeps from one iteration to the next, says what
// keeps it, and checks snapshots in tests.
//
// A leak is sustained growth of allocated memory measured at the same point of every iteration (its end)
// after a warm-up, explained by groups of blocks (same allocating stack, module scope and category) that
// keep growing: each iteration leaves survivors behind. One-time growth (Adam's state at the first step, a
// cache that fills once) is not a leak, and reserved memory that grows while allocated memory does not is
// fragmentation, not a leak. Each group is classified from what holds its blocks at the nearest heap dump:
// a path through autograd nodes to a user variable is a retained autograd graph, a user variable holding
// the block directly is stashed outputs, a block that grows in place is a growing cache.
//
// Memory that does not grow may still be held across iterations: blocks allocated during training that
// are still alive when the next iteration begins, other than parameters, optimizer state and gradients
// that zero_grad clears. A module that keeps its output on self, logits kept until the next forward, a
// cache filled once: reported by site, bytes and retainer, and a failure only past MaxHeld. Gradients that
// no zero_grad ever clears are a finding of their own (GradientFinding): backward adds every step's
// gradients to the last ones, which is a training bug, and they count as held.
//
// The test API is shaped like goleak and pytest-memray:
//
//	func TestTrainingDoesNotLeak(t *testing.T) {
//		t.Parallel()
//		s := leakstest.Record(t, cfg)
//		leaks.Check(t, s, leaks.MaxGrowth(1<<20), leaks.IgnoreScopes("eval"))
//	}
//
// Check fails the test with a one-line reason and the detail after it; Verify returns the same as an error;
// Find and Analyze return the whole Result. Nothing is global, so checks run safely under t.Parallel.
package leaks

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// Verdict is what Analyze concludes.
type Verdict string

// The verdicts.
const (
	NoLeak        Verdict = "no_leak"       // allocated memory does not keep growing after warm-up, and nothing is held
	Leak          Verdict = "leak"          // it does, and groups of surviving blocks explain it
	Held          Verdict = "held"          // it does not, but blocks training allocated outlive their iteration
	Fragmentation Verdict = "fragmentation" // reserved memory keeps growing while allocated memory does not
	Inconclusive  Verdict = "inconclusive"  // too few complete iterations after warm-up to tell
)

// Describe returns the verdict in the words of reports, e.g. "held across iterations".
func (v Verdict) Describe() string {
	switch v {
	case NoLeak:
		return "no leak"
	case Held:
		return "held across iterations"
	}
	return string(v)
}

// Kind is what keeps a suspect's blocks alive.
type Kind string

// The kinds of leak.
const (
	// RetainedGraph: an autograd graph kept alive by a user variable (a loss in a list, an output kept
	// without no_grad or detach) holds the tensors it saved for backward.
	RetainedGraph Kind = "retained_graph"
	// StashedOutputs: a user variable (a list, a dict, a hook's stash) holds the tensors themselves.
	StashedOutputs Kind = "stashed_outputs"
	// GrowingCache: the same place holds a block that grows, or a cache adds to itself.
	GrowingCache Kind = "growing_cache"
	// Unclassified: nothing recorded says what holds the blocks (no heap dump names them).
	Unclassified Kind = "unclassified"
)

// Describe returns the kind in words, e.g. "retained autograd graph".
func (k Kind) Describe() string {
	switch k {
	case RetainedGraph:
		return "retained autograd graph"
	case StashedOutputs:
		return "stashed outputs"
	case GrowingCache:
		return "growing cache"
	}
	return "unclassified growth"
}

// Point is memory measured at the end of one iteration.
type Point struct {
	Iteration int32
	Seq       int // the iteration's last event
	Allocated int64
	Reserved  int64
}

// Result is what Analyze found.
type Result struct {
	Verdict Verdict
	// Kind is the kind of the leak: that of the suspects that leak the most bytes. Empty but for a leak.
	Kind Kind
	// Reason says in one line what was found, e.g. "leak: allocated memory grows 66.50 KiB per iteration
	// over iterations 2-7 (retained autograd graph, retained by loss_history[7])".
	Reason string

	Warmup int
	// Iterations is how many complete training iterations the snapshot holds (setup not counted).
	Iterations int
	// Points are the measurements: the baseline, at the end of the last warm-up iteration (or of setup; in
	// a long run, of the iteration before the last 256), then the end of each complete iteration after it.
	// Empty when there were not enough iterations.
	Points []Point
	// GrowthPerIteration is the mean growth of allocated memory per iteration over Points;
	// ReservedGrowthPerIteration that of reserved memory.
	GrowthPerIteration         int64
	ReservedGrowthPerIteration int64
	// LeakPerIteration is the growth the suspects account for: the sum of their BytesPerIteration.
	LeakPerIteration int64
	// Suspects are the groups of blocks that keep growing, largest first.
	Suspects []Suspect
	// Held are the groups of blocks held across iterations without growing, largest first, measured at the
	// last point; HeldBytes is their sum.
	Held      []HeldGroup
	HeldBytes int64
	// Gradients says that gradients are never cleared between optimizer steps; nil when they are, or when
	// the snapshot has no optimizer step followed by a backward.
	Gradients *GradientFinding

	// PeakAllocated is the snapshot's peak of allocated memory, for MaxPeak.
	PeakAllocated int64

	cfg config
}

// Suspect is a group of blocks, allocated from one stack in one module scope and holding one category,
// whose bytes grow from iteration to iteration.
type Suspect struct {
	Scope    string // "(no scope)" when the blocks have none
	Category snapshot.Category
	// Stack is the allocating stack, innermost first, without the allocator's frames: "function file:line".
	Stack []string
	Kind  Kind

	BytesPerIteration int64
	CountPerIteration float64
	// Bytes and Counts are the group's live bytes and blocks at each Point.
	Bytes  []int64
	Counts []int
	// Survivors are the iterations whose allocations in this group are still alive at the last Point.
	Survivors []int32

	// Example is a representative leaked block (the last one allocated), Label its tensor label.
	Example timeline.Allocation
	Label   string
	// RetainedBy says what held Example at the nearest heap dump; nil when no heap dump named it.
	RetainedBy *RetainerPath
}

// Site returns the innermost frame of the allocating stack, "" without a stack.
func (s *Suspect) Site() string { return innermost(s.Stack) }

// innermost returns the first frame of stack, "" for none.
func innermost(stack []string) string {
	if len(stack) == 0 {
		return ""
	}
	return stack[0]
}

// RetainerPath is the chain of holders that kept a block alive at a heap dump, described for people (a
// timeline.Retainer is one holder on it).
type RetainerPath struct {
	// Path lists the holders from the one holding the block to the root, e.g. "AddmmBackward0[net.2] saved
	// mat1", "AddmmBackward0[net.2]", ..., "loss_history[7]".
	Path   []string
	Root   string
	Dump   int    // the heap_dump event
	Reason string // why the dump was taken: "iteration end", "oom", ...
}

// String returns the path root first: "loss_history[7] > NllLossBackward0 > ... > AddmmBackward0[net.2]
// saved mat1".
func (r *RetainerPath) String() string { return r.Short(0) }

// Short returns the path root first like String, with the middle of a path longer than max holders (max >
// 0) left out: the root and the holder after it, "(N more)", and the two holders nearest the block.
func (r *RetainerPath) Short(max int) string {
	rev := make([]string, 0, len(r.Path))
	for i := len(r.Path) - 1; i >= 0; i-- {
		rev = append(rev, r.Path[i])
	}
	if max > 0 && len(rev) > max && len(rev) > 4 {
		rev = []string{rev[0], rev[1], fmt.Sprintf("(%d more)", len(rev)-4), rev[len(rev)-2], rev[len(rev)-1]}
	}
	return strings.Join(rev, " > ")
}

// Find indexes s and analyzes it; see Analyze.
func Find(s *snapshot.Snapshot, opts ...Option) *Result {
	return Analyze(timeline.New(s), opts...)
}

// groupKey is what suspects are grouped by.
type groupKey struct {
	stack    snapshot.StackID
	scope    snapshot.StringID
	category snapshot.Category
}

// group is a groupKey's live bytes and counts at each point.
type group struct {
	key       groupKey
	bytes     []int64 // the blocks' sizes, what allocated memory counts
	requested []int64 // what the program asked for, which says whether the group grows
	counts    []int
}

// maxMeasured is how many iterations Analyze measures at most: the last ones. A leak shows in a few dozen;
// measuring thousands would cost a live set each.
const maxMeasured = 256

// Analyze measures allocated and reserved memory at the end of each complete iteration after the warm-up
// (the last 256 of them at most), finds the groups of blocks that keep growing, classifies them and gives a
// verdict.
func Analyze(tl *timeline.Timeline, opts ...Option) *Result {
	s := tl.Snapshot()
	its := completeIterations(tl.Iterations(), tl.OOMs(), tl.HeapDumps(), tl.Len(), s.Footer != nil && s.Warning == nil)
	return analyze(newConfig(opts), s, tl.Peak(timeline.Allocated).Bytes, tl.Stats().ByAction[snapshot.ActionIteration], its, timelineMeasurer{tl})
}

// groupSum is a group's live bytes and blocks at one point.
type groupSum struct {
	bytes, requested int64
	count            int
}

// sumGroups sums a live set by group: the blocks' sizes, and the bytes the program asked for (a block's size
// where its request is not recorded).
func sumGroups(live []timeline.Allocation) map[groupKey]groupSum {
	out := map[groupKey]groupSum{}
	for _, b := range live {
		k := groupKey{b.Stack, b.Scope, b.Category}
		g := out[k]
		g.bytes += b.Size
		g.requested += cmp.Or(b.Requested, b.Size)
		g.count++
		out[k] = g
	}
	return out
}

// measurer answers what the analysis asks about the events: memory and its groups at a point (an
// iteration's last event, or -1 for before the first event), the live set at the last point, what retained
// a block, and whether gradients are never cleared. A Timeline of the whole run answers directly; a Stream
// from what it kept.
type measurer interface {
	at(seq int) (allocated, reserved int64, groups map[groupKey]groupSum)
	liveAt(seq int) []timeline.Allocation
	retainer(b timeline.Allocation, at int) (timeline.RetainerPath, bool)
	gradients() *GradientFinding
}

// timelineMeasurer measures with a Timeline of the whole run.
type timelineMeasurer struct{ tl *timeline.Timeline }

func (m timelineMeasurer) at(seq int) (int64, int64, map[groupKey]groupSum) {
	return m.tl.Allocated(seq), m.tl.Reserved(seq), sumGroups(m.tl.LiveAt(seq, nil))
}

func (m timelineMeasurer) liveAt(seq int) []timeline.Allocation { return m.tl.LiveAt(seq, nil) }

func (m timelineMeasurer) retainer(b timeline.Allocation, at int) (timeline.RetainerPath, bool) {
	return m.tl.RetainerPath(b, at)
}

func (m timelineMeasurer) gradients() *GradientFinding { return gradientsNeverCleared(m.tl) }

// analyze is the analysis of the complete iterations its: s names stacks and scopes, peak is the run's peak
// of allocated memory, markers the iteration markers it holds.
func analyze(c config, s *snapshot.Snapshot, peak int64, markers int, its []timeline.IterationSpan, m measurer) *Result {
	r := &Result{Warmup: c.warmup, cfg: c, PeakAllocated: peak}
	r.Gradients = m.gradients()
	r.Iterations = len(its)
	if n := len(its) - c.warmup; n < 2 { // deltas measured
		r.Verdict = Inconclusive
		r.Reason = fmt.Sprintf("inconclusive: %d complete %s with a warm-up of %d; need 2 or more after it",
			len(its), plural(len(its), "iteration"), c.warmup)
		if markers == 0 {
			r.Reason += " (the snapshot has no iteration markers)"
		}
		return r
	}

	seqs, iters, first := measurePoints(its, c.warmup)
	groups := r.measure(m, seqs, iters)
	allocs, reserved := r.growth()
	last := r.Points[len(r.Points)-1]
	live := m.liveAt(last.Seq)
	growing := r.findSuspects(&c, s, m, groups, its[first].Iteration, live)

	// What grows is the leak's when the total grows, and held like the rest when it does not.
	leak := len(r.Suspects) > 0 && allocs[len(allocs)-1] > allocs[0]
	if !leak {
		clear(growing)
	}
	r.Held = held(s, m, &c, live, growing, r.Gradients != nil, last)
	for _, h := range r.Held {
		r.HeldBytes += h.Bytes
	}
	r.conclude(leak, allocs, reserved)
	return r
}

// measurePoints returns where memory is measured in its after a warm-up of warmup iterations: the end of the
// iteration before the measured ones (the last warm-up iteration), or the event before the first iteration,
// then the end of each measured one (the last maxMeasured at most), as event seqs and iterations. first is
// the index in its of the first measured iteration.
func measurePoints(its []timeline.IterationSpan, warmup int) (seqs []int, iters []int32, first int) {
	first = warmup
	if len(its)-warmup > maxMeasured {
		first = len(its) - maxMeasured
	}
	baseSeq := its[0].Start - 1
	baseIter := its[0].Iteration - 1
	if first > 0 {
		baseSeq, baseIter = its[first-1].End-1, its[first-1].Iteration
	}
	seqs = []int{baseSeq}
	iters = []int32{baseIter}
	for _, it := range its[first:] {
		seqs, iters = append(seqs, it.End-1), append(iters, it.Iteration)
	}
	return seqs, iters, first
}

// measure records memory at each point (seqs, with their iterations iters) into r.Points and returns the
// groups' bytes at each point, in a fixed order whatever the map's.
func (r *Result) measure(m measurer, seqs []int, iters []int32) []*group {
	index := map[groupKey]int{}
	var groups []*group
	for i, seq := range seqs {
		alloc, res, sums := m.at(seq)
		r.Points = append(r.Points, Point{Iteration: iters[i], Seq: seq, Allocated: alloc, Reserved: res})
		for k, v := range sums {
			j, ok := index[k]
			if !ok {
				j = len(groups)
				index[k] = j
				groups = append(groups, &group{key: k, bytes: make([]int64, len(seqs)), requested: make([]int64, len(seqs)),
					counts: make([]int, len(seqs))})
			}
			groups[j].bytes[i], groups[j].requested[i], groups[j].counts[i] = v.bytes, v.requested, v.count
		}
	}
	slices.SortFunc(groups, func(a, b *group) int {
		return cmp.Or(cmp.Compare(a.key.stack, b.key.stack), cmp.Compare(a.key.scope, b.key.scope), cmp.Compare(a.key.category, b.key.category))
	})
	return groups
}

// growth sets the mean growth per iteration of allocated and reserved memory over r.Points and returns
// both at each point.
func (r *Result) growth() (allocs, reserved []int64) {
	allocs = make([]int64, len(r.Points))
	reserved = make([]int64, len(r.Points))
	for i, p := range r.Points {
		allocs[i], reserved[i] = p.Allocated, p.Reserved
	}
	n := len(r.Points) - 1
	r.GrowthPerIteration = (allocs[n] - allocs[0]) / int64(n)
	r.ReservedGrowthPerIteration = (reserved[n] - reserved[0]) / int64(n)
	return allocs, reserved
}

// findSuspects sets r.Suspects to the groups that keep growing and that the options do not leave out,
// largest first, and returns every group that keeps growing, left out or not. firstMeasured is the first
// measured iteration, live the live set at the last point.
func (r *Result) findSuspects(c *config, s *snapshot.Snapshot, m measurer, groups []*group, firstMeasured int32, live []timeline.Allocation) map[groupKey]bool {
	n := len(r.Points) - 1
	last := r.Points[n]
	growing := map[groupKey]bool{}
	for _, g := range groups {
		// Growth is judged on what the program asked for: a block's size also holds the allocator's
		// rounding, which changes with the cached block a request lands in (a large block is not split when
		// less than 1 MiB would remain), so that a tensor kept from one iteration into the next would seem to
		// grow and shrink by up to a megabyte without the program keeping more.
		if !sustained(g.requested) {
			continue
		}
		growing[g.key] = true
		if c.ignored(s, g.key) {
			continue
		}
		sp := suspect(s, m, g, n, firstMeasured, last, live)
		if c.filter != nil && !c.filter(sp) {
			continue
		}
		r.Suspects = append(r.Suspects, *sp)
		r.LeakPerIteration += sp.BytesPerIteration
	}
	rankSites(r.Suspects, func(sp *Suspect) site {
		return site{sp.BytesPerIteration, sp.Scope, sp.Category, sp.Example.Alloc}
	})
	return growing
}

// conclude sets the verdict and its reason from what was measured: leak whether the suspects make a leak,
// allocs and reserved the memory at each point.
func (r *Result) conclude(leak bool, allocs, reserved []int64) {
	window := fmt.Sprintf("iterations %d-%d", r.Points[1].Iteration, r.Points[len(r.Points)-1].Iteration)
	switch {
	case leak:
		r.Verdict = Leak
		r.Kind = dominantKind(r.Suspects)
		top := r.Suspects[0]
		r.Reason = fmt.Sprintf("leak: allocated memory grows %s per iteration over %s (%s: %d %s, the largest %s per iteration of %s",
			units.FormatSize(r.LeakPerIteration), window, r.Kind.Describe(), len(r.Suspects), plural(len(r.Suspects), "suspect"),
			units.FormatSize(top.BytesPerIteration), top.Category)
		retainer := ""
		if top.RetainedBy != nil {
			retainer = top.RetainedBy.Root
		}
		r.Reason += siteClause(top.Scope, top.Site(), retainer) + ")"
	case sustained(reserved) && !sustained(allocs):
		r.Verdict = Fragmentation
		r.Reason = fmt.Sprintf("fragmentation, not a leak: reserved memory grows %s per iteration over %s while allocated memory does not (%s per iteration)",
			units.FormatSize(r.ReservedGrowthPerIteration), window, units.FormatChange(r.GrowthPerIteration))
	case r.HeldBytes > 0:
		r.Verdict = Held
		top := r.Held[0]
		r.Reason = fmt.Sprintf("held across iterations, not a leak: %s allocated during training outlives its iteration without growing over %s (%d %s, the largest %s of %s",
			units.FormatSize(r.HeldBytes), window, len(r.Held), plural(len(r.Held), "group"), units.FormatSize(top.Bytes), top.Category)
		retainer := ""
		if top.RetainedBy != nil {
			retainer = top.RetainedBy.Short(4)
		}
		r.Reason += siteClause(top.Scope, top.Site(), retainer) + ")"
	default:
		r.Verdict = NoLeak
		r.Reason = fmt.Sprintf("no leak: allocated memory at the end of %s changes by %s per iteration after a warm-up of %d",
			window, units.FormatChange(r.GrowthPerIteration), r.Warmup)
		if len(r.Suspects) > 0 {
			r.Reason += fmt.Sprintf(" (%d %s grow, but the total does not)", len(r.Suspects), plural(len(r.Suspects), "group"))
		}
	}
}

// siteClause is what a reason says of its largest site: " in SCOPE", " at SITE" and ", retained by
// RETAINER", each when known.
func siteClause(scope, site, retainer string) string {
	var b strings.Builder
	if scope != noScope {
		b.WriteString(" in " + scope)
	}
	if site != "" {
		b.WriteString(" at " + site)
	}
	if retainer != "" {
		b.WriteString(", retained by " + retainer)
	}
	return b.String()
}

// site is what leak sites (suspects, held groups) are ranked by.
type site struct {
	bytes    int64
	scope    string
	category snapshot.Category
	alloc    int // the example block's alloc event
}

// rankSites sorts sites largest first; ties go by scope, category and the example block's allocation, so
// that reports list them in the same order in every run.
func rankSites[S any](sites []S, rank func(*S) site) {
	slices.SortFunc(sites, func(a, b S) int {
		x, y := rank(&a), rank(&b)
		return cmp.Or(cmp.Compare(y.bytes, x.bytes), cmp.Compare(x.scope, y.scope), cmp.Compare(x.category, y.category), cmp.Compare(x.alloc, y.alloc))
	})
}

// noScope names the scope of blocks allocated outside any module.
const noScope = "(no scope)"

// sustained reports whether x keeps growing: it ends higher than it starts and than at its middle, and
// grows in at least two steps. One-time growth (a step up, then flat) is not sustained.
func sustained(x []int64) bool {
	n := len(x) - 1
	if n < 2 || x[n] <= x[0] || x[n] <= x[n/2] {
		return false
	}
	steps := 0
	for i := 1; i <= n; i++ {
		if x[i] > x[i-1] {
			steps++
		}
	}
	return steps >= 2
}

// completeIterations returns the training iterations (setup left out) of spans that ran to their end: all
// but an iteration that ran out of memory, was interrupted or was cut short with the file. ooms and dumps
// are the run's, n its number of events, finished whether the recording ended normally.
func completeIterations(spans []timeline.IterationSpan, ooms []int, dumps []timeline.HeapDump, n int, finished bool) []timeline.IterationSpan {
	var its []timeline.IterationSpan
	for _, it := range spans {
		if it.Iteration >= 0 {
			its = append(its, it)
		}
	}
	// Markers are how iterations are known; a snapshot without them (an imported trace) is one pseudo-iteration,
	// which cannot show growth per iteration.
	if len(its) == 0 {
		return nil
	}
	last := its[len(its)-1]
	stopped := false // the last iteration ran out of memory or was interrupted
	ended := false   // its end-of-iteration heap dump is whole
	for _, o := range ooms {
		stopped = stopped || o >= last.Start && o < last.End
	}
	for _, d := range dumps {
		if d.Seq < last.Start || d.Seq >= last.End {
			continue
		}
		switch d.Reason {
		case "oom", "interrupted":
			stopped = true
		case "iteration end":
			ended = d.Seq+d.Edges+1 < n // events follow it, so no retain event is missing
		}
	}
	if stopped || !finished && !ended {
		its = its[:len(its)-1]
	}
	return its
}

func dominantKind(sus []Suspect) Kind {
	by := map[Kind]int64{}
	for _, s := range sus {
		by[s.Kind] += s.BytesPerIteration
	}
	best := Unclassified
	for _, k := range []Kind{RetainedGraph, StashedOutputs, GrowingCache, Unclassified} {
		if by[k] > by[best] {
			best = k
		}
	}
	return best
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
