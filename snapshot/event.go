// Package snapshot holds oomdbg's event model and its file format.
//
// A snapshot is a stream of Events: what the caching allocator did (alloc, free, segment changes, OOM), what
// the training runtime said about it (phase, iteration, tensor category changes, retainer edges at heap dumps,
// annotations) and device readings. Strings, stack frames and stacks are interned in tables; events refer to
// them by ID. Writer streams events into the chunked file format described in docs/format.md; Reader reads
// them back from a file, a growing file or a pipe.
package snapshot

import "fmt"

// Action is what an event records.
type Action uint8

// The actions. The first eight mirror PyTorch's TraceEntry actions; the rest are markers from the runtime.
const (
	ActionInvalid       Action = iota
	ActionAlloc                // a block was handed out: Addr, Size (requested), BlockSize (rounded or unsplit)
	ActionFreeRequested        // the program let go of a block: Addr, Size, BlockSize
	ActionFreeCompleted        // the block went back to the cache: Addr, Size, BlockSize
	ActionSegmentAlloc         // cudaMalloc of a segment: Addr (base), Size (segment bytes)
	ActionSegmentFree          // cudaFree of a segment: Addr, Size
	ActionSegmentMap           // expandable segment pages mapped: Addr, Size (mapped bytes)
	ActionSegmentUnmap         // expandable segment pages unmapped: Addr, Size
	ActionOOM                  // the allocator gave up: Size (rounded request), BlockSize (alloc_size), DeviceFree
	ActionPhase                // a phase begins: Phase, Iteration
	ActionIteration            // a training iteration begins: Iteration
	ActionAnnotation           // user text: Text
	ActionCategory             // a live block changed category: Addr, Category, Label
	ActionRetain               // a heap-graph edge at a heap dump: Holder (held by Parent) holds Addr; Text describes Holder
	ActionSample               // a device reading: Size (bytes), Text (what was read, e.g. "nvml.used")
	ActionHeapDump             // a heap dump begins; the Retain events that follow belong to it: Text (why)
	ActionSnapshot             // PyTorch's "snapshot" trace entry (imported traces only): Size
	numActions
)

var actionNames = [...]string{
	ActionInvalid:       "invalid",
	ActionAlloc:         "alloc",
	ActionFreeRequested: "free_requested",
	ActionFreeCompleted: "free_completed",
	ActionSegmentAlloc:  "segment_alloc",
	ActionSegmentFree:   "segment_free",
	ActionSegmentMap:    "segment_map",
	ActionSegmentUnmap:  "segment_unmap",
	ActionOOM:           "oom",
	ActionPhase:         "phase",
	ActionIteration:     "iteration",
	ActionAnnotation:    "annotation",
	ActionCategory:      "category",
	ActionRetain:        "retain",
	ActionSample:        "sample",
	ActionHeapDump:      "heap_dump",
	ActionSnapshot:      "snapshot",
}

// NumActions is one past the largest valid Action; arrays indexed by Action use it as their length.
const NumActions = int(numActions)

// String returns the action's name, PyTorch's spelling for the allocator actions.
func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// Valid reports whether a is one of the defined actions.
func (a Action) Valid() bool { return a > ActionInvalid && a < numActions }

// ParseAction returns the action named s (PyTorch's spelling for the allocator actions).
func ParseAction(s string) (Action, bool) {
	for i, n := range actionNames {
		if n == s && Action(i) != ActionInvalid {
			return Action(i), true
		}
	}
	return ActionInvalid, false
}

// Phase is the part of a training iteration an allocation happened in.
type Phase uint8

// The phases, in the order they usually occur (but load, which comes first).
const (
	PhaseNone      Phase = iota // not tagged (e.g. imported traces without markers)
	PhaseSetup                  // model construction, weights to device
	PhaseData                   // the batch is loaded to the device
	PhaseForward                // the model and the loss
	PhaseBackward               // autograd
	PhaseRecompute              // checkpoint recompute inside backward
	PhaseOptimizer              // optimizer.step
	PhaseZeroGrad               // zero_grad
	PhaseEval                   // evaluation passes
	PhaseLoad                   // the model loaded onto the device (from_pretrained), before setup
	numPhases
)

// The phases' values are stored in files, so a new phase is added at the end, whatever order it occurs in:
// load, the first of a run, is the last value (format version 2).

var phaseNames = [...]string{"none", "setup", "data", "forward", "backward", "recompute", "optimizer", "zero_grad", "eval", "load"}

// NumPhases is one past the largest valid Phase.
const NumPhases = int(numPhases)

// String returns the phase's name, e.g. "forward".
func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// Valid reports whether p is one of the defined phases.
func (p Phase) Valid() bool { return p < numPhases }

// ParsePhase returns the phase named s.
func ParsePhase(s string) (Phase, bool) {
	for i, n := range phaseNames {
		if n == s {
			return Phase(i), true
		}
	}
	return PhaseNone, false
}

// Category says what a block holds: PyTorch's memory-profiler categories plus amp_cache and unknown.
type Category uint8

// The categories.
const (
	CategoryUnknown        Category = iota
	CategoryParameter               // model weights
	CategoryGradient                // .grad of parameters
	CategoryOptimizerState          // e.g. Adam's exp_avg, exp_avg_sq
	CategoryActivation              // saved for backward by autograd
	CategoryTemporary               // freed within the op or phase that made it
	CategoryInput                   // the batch
	CategoryAutogradDetail          // intermediate gradients inside backward
	CategoryAMPCache                // autocast's cast copies of fp32 weights
	numCategories
)

var categoryNames = [...]string{"unknown", "parameter", "gradient", "optimizer_state", "activation", "temporary", "input", "autograd_detail", "amp_cache"}

// NumCategories is one past the largest valid Category.
const NumCategories = int(numCategories)

// String returns the category's name, e.g. "optimizer_state".
func (c Category) String() string {
	if int(c) < len(categoryNames) {
		return categoryNames[c]
	}
	return fmt.Sprintf("category(%d)", uint8(c))
}

// Valid reports whether c is one of the defined categories.
func (c Category) Valid() bool { return c < numCategories }

// ParseCategory returns the category named s.
func ParseCategory(s string) (Category, bool) {
	for i, n := range categoryNames {
		if n == s {
			return Category(i), true
		}
	}
	return CategoryUnknown, false
}

// StringID names an interned string; 0 is the empty string.
type StringID uint32

// FrameID names an interned stack frame; IDs start at 1.
type FrameID uint32

// StackID names an interned stack; 0 is "no stack".
type StackID uint32

// Frame is one stack frame. Function, File and Line are as the source language reports them.
type Frame struct {
	Function StringID
	File     StringID
	Line     int32
}

// Event is one record of a snapshot. Which fields mean something depends on Action (see the constants); the
// tags (Phase, Iteration, Scope, Category, Label, Stack) describe the allocation an event is about.
type Event struct {
	Seq    uint64 // position in the snapshot, from 0, assigned by the Writer
	Time   int64  // nanoseconds since the start of the recording
	Action Action
	Device int16
	Stream int64 // the raw stream handle; 0 is the default stream

	Addr       uint64 // block or segment address
	Size       int64  // requested bytes (alloc, free), segment bytes, rounded request (oom), a reading (sample)
	BlockSize  int64  // bytes of the block as the allocator handed it out (alloc, free); alloc_size (oom)
	DeviceFree int64  // oom: bytes the device had free

	Phase     Phase
	Iteration int32 // training step; -1 for setup
	Category  Category
	Scope     StringID // module path, e.g. "blocks.3.attn.qkv"
	Label     StringID // tensor label, e.g. "bf16[8,1024,2048] qkv.out"
	Stack     StackID
	Text      StringID // annotation text, retainer description, sample source

	Holder uint64 // retain: the holder's ID, unique within a heap dump
	Parent uint64 // retain: the holder that holds Holder; 0 for a root
}
