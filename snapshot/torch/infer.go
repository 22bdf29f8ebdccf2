package torch

import (
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Inference is what a PyTorch trace does not say but its frames, phases and lifetimes show: where each
// training iteration begins, and what every block holds (the memory profiler's categories) and which
// module's forward allocated it, each with the rule that decided it. Seqs are those of the snapshot Infer
// read.
type Inference struct {
	// Iterations says where the iteration boundaries come from; Boundaries are the iterations in order,
	// each with its first event. Events before the first are setup (iteration -1).
	Iterations IterationSource
	Boundaries []Boundary
	// Blocks are the allocations, in order of their alloc events, with their category and module.
	Blocks []BlockTag
}

// Boundary is where one iteration begins.
type Boundary struct {
	Seq       int   // its first event
	Iteration int32 // its number: ProfilerStep#N's N, else counted from 0
}

// BlockTag is what Infer says about one block.
type BlockTag struct {
	Seq      int // its alloc event
	Category snapshot.Category
	Rule     CategoryRule
	// Module is the innermost frame of a module's forward the program wrote (not torch's own modules);
	// 0 when the stack shows none.
	Module snapshot.FrameID
}

// Block returns the tag of the block allocated at event seq.
func (inf *Inference) Block(seq int) (BlockTag, bool) {
	i, ok := slices.BinarySearchFunc(inf.Blocks, seq, func(b BlockTag, seq int) int { return b.Seq - seq })
	if !ok {
		return BlockTag{}, false
	}
	return inf.Blocks[i], true
}

// Infer reads an imported PyTorch trace for what it does not say (see the package documentation,
// "Inference"): iterations, categories and modules. It reads the allocator's events, their stacks, the
// phases the import gave them (from record_function regions and frames), and which blocks were
// reconstructed as alive before the trace; it never changes s. Import applies its result; other code calls
// it to ask why a block has its category. Iterations a snapshot already marks (ProfilerStep#N) are kept.
func Infer(s *snapshot.Snapshot) *Inference {
	return inferEvents(s, s.Events.Slice(0, s.Events.Len()))
}

// inferEvents is Infer over s's events as a slice: the import's, which it still writes to.
func inferEvents(s *snapshot.Snapshot, events []snapshot.Event) *Inference {
	t := newTrace(s, events)
	inf := &Inference{}
	inf.Iterations, inf.Boundaries = t.iterations()
	inf.Blocks = t.blocks(inf.Boundaries)
	return inf
}

// trace is what the inference passes read: a snapshot's events in order, and what each stack says.
type trace struct {
	s      *snapshot.Snapshot
	events []snapshot.Event
	stacks []stackFacts
	origin Origin
}

func newTrace(s *snapshot.Snapshot, events []snapshot.Event) *trace {
	t := &trace{s: s, events: events, stacks: readStacks(s)}
	if o, ok := OriginOf(s); ok {
		t.origin = *o
	}
	return t
}

// len returns the number of events.
func (t *trace) len() int { return len(t.events) }

// at returns event i.
func (t *trace) at(i int) *snapshot.Event { return &t.events[i] }

// facts returns what the stack of e says.
func (t *trace) facts(e *snapshot.Event) stackFacts {
	if int(e.Stack) < len(t.stacks) {
		return t.stacks[e.Stack]
	}
	return stackFacts{}
}

// allocation reports whether e is an allocation the trace recorded (not one reconstructed from the final
// state): only those say when the trace's events ran.
func (t *trace) allocation(e *snapshot.Event) bool {
	return e.Action == snapshot.ActionAlloc && !t.s.Reconstructed(e)
}

// training reports whether e is an allocation of forward, backward or recompute.
func (t *trace) training(e *snapshot.Event) bool {
	if !t.allocation(e) {
		return false
	}
	switch e.Phase {
	case snapshot.PhaseForward, snapshot.PhaseBackward, snapshot.PhaseRecompute:
		return true
	}
	return false
}

// stepping reports whether e is in the optimizer's step or zero_grad.
func stepping(e *snapshot.Event) bool {
	return e.Phase == snapshot.PhaseOptimizer || e.Phase == snapshot.PhaseZeroGrad
}

// marker reports whether an event of action a is a tag of the runtime, not an entry of the trace.
func marker(a snapshot.Action) bool {
	switch a {
	case snapshot.ActionPhase, snapshot.ActionIteration, snapshot.ActionCategory, snapshot.ActionRetain,
		snapshot.ActionHeapDump, snapshot.ActionSample, snapshot.ActionAnnotation:
		return true
	}
	return false
}
