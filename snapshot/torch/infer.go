package torch

import (
	"slices"
	"strconv"

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
	// requests are the scopes of the OOM events' requests: the module whose forward asked, by event.
	requests map[int]Scope
}

// Scope is the module whose forward made an allocation, as the frames show it.
type Scope struct {
	// Module is the innermost forward of a module the program wrote (not torch's own modules, nor the
	// libraries around them: peft, bitsandbytes, accelerate): one frame for every allocation of that
	// module, the one of its forward's lowest line that allocated; 0 when the stack shows none.
	Module snapshot.FrameID
	// Layer is the index of the repeated module's call (a decoder layer) the allocation ran in, counted
	// from 0 in its forward pass; -1 when the frames do not show one.
	Layer int32
}

// Name is the scope as oomdbg shows it: "forward modeling_llama.py:300", and "layer 3: forward
// modeling_llama.py:300" in a repeated module; "" for none.
func (sc Scope) Name(s *snapshot.Snapshot) string {
	if sc.Module == 0 {
		return ""
	}
	if sc.Layer < 0 {
		return s.FrameString(sc.Module)
	}
	return "layer " + strconv.Itoa(int(sc.Layer)) + ": " + s.FrameString(sc.Module)
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
	// Scope is the module whose forward allocated it.
	Scope
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
	inf, _ := inferEvents(s, s.Events.Slice(0, s.Events.Len()), nil)
	return inf
}

// inferEvents is Infer over s's events as a slice: the import's, which it still writes to. Stacks, when not
// nil, are what readStacks says of s's stacks (the import has read them already). The trace it returns
// holds the blocks' lifetimes, for the import to carry each block's tags to its frees.
func inferEvents(s *snapshot.Snapshot, events []snapshot.Event, stacks []stackFacts) (*Inference, *trace) {
	t := newTrace(s, events, stacks)
	inf := &Inference{}
	inf.Iterations, inf.Boundaries = t.iterations()
	inf.Blocks = t.blocks(inf.Boundaries)
	t.scopes(inf)
	return inf, t
}

// trace is what the inference passes read: a snapshot's events in order, and what each stack says.
type trace struct {
	s      *snapshot.Snapshot
	events []snapshot.Event
	stacks []stackFacts
	origin Origin
	pre    []snapshot.StringID // the ids of PreExistingLabel: the label of reconstructed events
	lives  []lifetime          // every block, in order of its alloc event
	tagged []int               // by event: for a free, the alloc whose tags it carries; -1 for none
}

func newTrace(s *snapshot.Snapshot, events []snapshot.Event, stacks []stackFacts) *trace {
	if len(stacks) != len(s.Stacks) {
		stacks = readStacks(s)
	}
	t := &trace{s: s, events: events, stacks: stacks}
	if o, ok := OriginOf(s); ok {
		t.origin = *o
	}
	for id := 1; id < len(s.Strings); id++ {
		if s.Strings[id] == snapshot.PreExistingLabel {
			t.pre = append(t.pre, snapshot.StringID(id))
		}
	}
	t.link()
	return t
}

// reconstructed is s.Reconstructed(e), by label id rather than by string.
func (t *trace) reconstructed(e *snapshot.Event) bool {
	return e.Label != 0 && slices.Contains(t.pre, e.Label)
}

// link pairs the frees of the trace with their blocks' allocations, by device and address, once for all
// passes: a block's lifetime ends at its free_requested (what the categories read), while its tags go on
// every free until its free_completed (as the runtime writes them).
func (t *trace) link() {
	type open struct {
		block     int  // in t.lives
		requested bool // the lifetime ended
		completed bool // the tags stopped
	}
	type device struct {
		dev  int16
		open map[uint64]open
		pre  int // reconstructed allocations: an import writes them first, all open when the trace begins
	}
	var devs []device // few: searched in order
	find := func(dev int16, at int) int {
		if at >= 0 && devs[at].dev == dev {
			return at
		}
		if at = slices.IndexFunc(devs, func(d device) bool { return d.dev == dev }); at < 0 {
			devs = append(devs, device{dev: dev})
			at = len(devs) - 1
		}
		return at
	}
	// Sizes first: growing the maps rehashes them, and a snapshot imported from the final state alone is
	// mostly reconstructed blocks.
	at, allocs := -1, 0
	for i := range t.events {
		if e := &t.events[i]; e.Action == snapshot.ActionAlloc {
			allocs++
			if at = find(e.Device, at); t.reconstructed(e) {
				devs[at].pre++
			}
		}
	}
	for k := range devs {
		devs[k].open = make(map[uint64]open, devs[k].pre)
	}
	t.lives = make([]lifetime, 0, allocs)
	t.tagged = make([]int, len(t.events))
	at = -1
	for i := range t.events {
		e := &t.events[i]
		t.tagged[i] = -1
		switch e.Action {
		case snapshot.ActionAlloc, snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
		default:
			continue
		}
		at = find(e.Device, at)
		m := devs[at].open
		if e.Action == snapshot.ActionAlloc {
			m[e.Addr] = open{block: len(t.lives)}
			t.lives = append(t.lives, lifetime{alloc: i, free: -1})
			continue
		}
		o, ok := m[e.Addr]
		if !ok {
			continue
		}
		if !o.completed {
			t.tagged[i] = t.lives[o.block].alloc
		}
		if e.Action == snapshot.ActionFreeRequested {
			if o.requested {
				continue
			}
			t.lives[o.block].free = i
			o.requested = true
		} else {
			if o.completed {
				continue
			}
			o.completed = true
		}
		if o.requested && o.completed {
			delete(m, e.Addr)
		} else {
			m[e.Addr] = o
		}
	}
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
	return e.Action == snapshot.ActionAlloc && !t.reconstructed(e)
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
