// Package torch imports PyTorch CUDA memory snapshots into oomdbg's snapshot model: the pickles
// torch.cuda.memory._dump_snapshot writes (protocols 2 to 5), the bare list of segments
// torch.cuda.memory_snapshot returns, and either as JSON (memory_viz reads that too). Sniff tells them from
// their first bytes; Import and ImportFile read them; OriginOf tells what an imported snapshot came from.
//
// # Generations
//
// The schema changed over PyTorch releases (docs/pytorch-snapshots.md §10). The importer keys on the fields
// present, never on a version, so every generation, and mixtures, import the same way:
//
//	G0 (≤2.0)   blocks {size, requested_size, state, history}: addresses are summed from the segment's base,
//	            frames and (without requested_size) the request come from history[0], as memory_viz does
//	G1 (≈2.1)   block address and frames, segment frames and is_expandable; no time_us: Meta.TimeUnit "index"
//	G2 (≈2.2)   time_us: Meta.TimeUnit "us", Event.Time = (time_us - first time_us) × 1000
//	G3 (≈2.4)   allocator_settings -> Meta.AllocatorSettings; external_annotations -> markers (below)
//	G4 (≈2.7)   user_metadata (else compile_context) -> Event.Scope
//	G5 (≈2.11)  the annotate action -> an annotation event on the block; host_segments and host_traces
//	            (pinned host memory) are counted in Origin.HostEntries and not imported
//	segments    memory_snapshot()'s list: the final state only
//
// # Events
//
// Each trace entry becomes one event: alloc, free_requested, free_completed, segment_alloc, segment_free,
// segment_map and segment_unmap with their address, size and stream; snapshot; oom with Size the rounded
// request, DeviceFree the device's free bytes, BlockSize the segment size the allocator tried to get
// (get_allocation_size, what PyTorch's message prints). Entries of actions this package does not know are
// skipped and counted in Origin.SkippedActions. Devices are merged by time_us when every entry has one
// (time_us that steps back on a device is held at its latest value), else concatenated in device order with
// Event.Time the entry's position. Meta.Devices lists every device with segments, trace entries or
// annotations. Meta.Created is the first time_us.
//
// Event.Size is the requested (unrounded) size, as the trace records it. Event.BlockSize is the size of the
// block the allocator handed out, which the trace does not record: small-pool blocks (requests rounded to at
// most 1 MiB) and blocks of expandable segments are the rounded request, since the allocator splits off any
// remainder there; a large-pool block is the rounded request if the allocator split the free block it came
// from (should_split: more than 1 MiB left, request under max_split_size), else the whole free block. The
// importer follows every segment's blocks through the trace to know that free block wherever the segment's
// layout is known; blocks still in use at the end take their size from the final state. Where the layout is
// not known, BlockSize is the rounded request, a lower bound, and Origin.BlockSizesEstimated counts it.
// Rounding uses the recorded allocator_settings (max_split_size, roundup_power2_divisions,
// large_segment_size_mb), or PyTorch's defaults when the snapshot predates them.
//
// # State from before the trace
//
// PyTorch's trace is a ring buffer of the newest entries: what was allocated before it began appears only
// as frees without an alloc, and as blocks and segments of the final state the trace never made. The importer
// adds events for them at time 0, before the first recorded event, labelled PreExistingLabel ("pre-existing
// (allocated before the trace)"): a segment_alloc (segment_map for expandable segments) for every segment
// alive when the trace began (found by walking the final state back over the trace's segment events), and an
// alloc for every block in use then, with a free_requested after it when that block's free was already
// requested (active_pending_free). Their stacks are the final state's for blocks still in use, the free's for
// blocks the trace frees (memory_viz shows the same). So allocated and reserved bytes are right from the
// first event, and Origin.PreExistingSegments and Origin.PreExistingBlocks count what was added.
//
// # Phases, iterations and annotations
//
// record_function regions (external_annotations, START and END) become markers: ProfilerStep#N starts
// iteration N (an iteration event), Optimizer.step#... is the optimizer phase and Optimizer.zero_grad#...
// the zero_grad phase while they last, and any other name becomes an annotation event whose Text is the name
// and whose Label is the stage, "START" or "END". Between those, the phase follows the stacks of
// allocations: the autograd engine on the stack means backward, torch.utils.checkpoint rebuilding activations
// recompute, torch/optim code the optimizer, zero_grad zero_grad, and otherwise a module's __call__ forward;
// other frames mean no phase. An allocation without frames (autograd's threads have no Python frames) keeps
// the phase, and frees, whose stacks are often their allocation's, never change it. A phase event
// precedes the first event of each new phase. Events before the first ProfilerStep are iteration -1.
//
// # Inference
//
// What a trace does not mark, Infer finds and the import applies (docs/pytorch-snapshots.md, "Iterations
// and categories"). Iterations without ProfilerStep#N: each optimizer step (an Optimizer.step#... region,
// else a run of allocations with torch/optim on their stacks) ends one; an iteration begins at its first
// forward or backward allocation, moved back over the allocations just before it that nothing places (the
// batch); else each forward after a backward begins one; else one forward and its backward, or a forward
// that ran out of memory, are iteration 0, cut short before its step. An iteration event precedes each, and
// Origin.Iterations says where they came from. Categories, where the file records none: frames that say
// what a block is (autocast's cast, the optimizer's _init_group, AccumulateGrad, Module._apply and
// weight loading), then, in a training trace, the phases of its allocation and free; a block alive before
// the trace by where it is freed; a block alive at the OOM a trace ends in by what the other blocks of its
// stack did in that phase (CategoryRule lists the rules, infer_cut.go the last two). A block's scope, where
// the file gives none, is the module the program wrote whose forward allocated it, looked for through the
// libraries around modules (accelerate's hooks, peft, bitsandbytes, checkpointing, torch.compile), with
// the index of the repeated layer it ran in: "layer 3: forward modeling_llama.py:300" (infer_scopes.go).
//
// # Stacks and tags
//
// Frames are filtered as memory_viz's frameFilter filters them (the unwinder, the interpreter loop, dispatcher
// plumbing; WithAllFrames keeps them) and interned innermost first. PyTorch shares each distinct traceback
// list and frame dict between the entries that have them, and the pickle keeps that sharing: a traceback
// seen before costs one lookup. The category is the entries' "category" where the file has one
// (_memory_viz._profile_to_snapshot writes the memory profiler's), else inferred (Inference). Stacks deeper than the file format holds
// keep their innermost frames; longer strings are cut at 64 KiB.
//
// # Final state
//
// Footer.Segments holds the snapshot's segments and blocks as PyTorch reported them (addresses computed for
// the legacy format); Footer.Summary counts the events and gives the peaks, allocated bytes counting from
// alloc to free_requested, as PyTorch's allocated_bytes does.
//
// # Hostile input
//
// Files are untrusted. The pickle decoder (internal/pickle) refuses every opcode that would import or call
// code and checks every declared length against the input before allocating; Limits bound the input and
// the number of entries; every failure is an *ImportError naming where in the structure it happened
// ("device_traces[0][1234].size: want int, got str"), and no input makes Import panic. The result is a pure
// function of the input, so an import can be compared with the import of its export.
//
// # Memory
//
// ImportReader and ImportFile decode a pickle as they read it, through a small buffer, and stop at the
// first bad opcode: a 2 GiB file that is not a pickle past its first bytes costs a few KiB. The decoded
// pickle (pickle.Doc, 2 to 5 bytes per byte of pickle) is dropped, and collected, once its trace entries
// are read into 64-byte records, before the events are built, so an import holds at most the larger of
// the Doc and the records together, and the records and the events together. Inference rewrites events in
// place, so they are built as a slice of Events (112 bytes each) and moved into the snapshot's columns at
// the end, both held for a moment (for an 87 MB pickle of 1.5M entries: 150 + 94 MB, then 94 + 168 MB and
// 14 MB of columns, after which the slice goes). Limits.MaxMemory is a ceiling on all of it, counted before
// each allocation (decoding included): past it an import fails with a *MemoryError, which matches ErrMemory
// and ErrLimit, instead of allocating.
package torch
