// Package export writes snapshots in the formats other tools read: PyTorch's memory snapshot (a pickle, or
// the same document as JSON) for pytorch.org/memory_viz, a pprof heap profile of the live set for
// `go tool pprof`, a Chrome/Perfetto trace for ui.perfetto.dev, and a timeline plot (SVG or PNG) to share.
//
// Write does any of them from a snapshot; Torch, TorchJSON, Pprof, Perfetto, SVG and PNG do one from a
// Timeline. Exports stream their output: the memory they take beyond the snapshot and its Timeline grows
// with the blocks alive at once and the counter changes of a trace (16 bytes each), never with the file.
//
// # What goes where
//
// PyTorch's snapshot (Torch, TorchJSON) has the schema of torch.cuda.memory._snapshot() (documented in
// docs/pytorch-snapshots.md):
//
//   - device_traces holds the allocator's actions only (alloc, free_requested, free_completed, segment_*,
//     oom, snapshot), one list per device ordinal, each entry {action, addr, size, stream, time_us, frames}
//     (an oom has device_free instead of addr). time_us is Meta.Created plus Event.Time; a snapshot whose
//     times are event indices has none, like PyTorch before 2.2. Sizes are PyTorch's: the requested bytes
//     for blocks, the segment bytes for segments, the rounded request for an OOM.
//   - frames are the Go (or imported Python) frames {filename, line, name}, innermost first. Each distinct
//     frame and stack is written once and referenced after, as PyTorch's symbolizer shares them. A free
//     without a stack of its own carries the block's allocation stack, as PyTorch records it unless told to
//     record free stacks.
//   - category (memory_viz colours blocks by it) is the block's category as it ended: a temporary that
//     autograd saved reads as an activation. It is written only when some block has one.
//   - user_metadata (shown by memory_viz under "User Metadata") is the block's module scope, e.g.
//     "transformer.h.0.attn.c_attn". This is where PyTorch's _set_memory_metadata puts what a program is
//     running, and it leaves the stacks exactly as recorded (and shared, so the file stays small); a leading
//     frame would have done neither. oomdbg reads it back as the scope, so a scope survives a round trip
//     exactly; a block without one has none written, and an importer infers one from its frames as for any
//     PyTorch snapshot. The tensor's label ("f32[1024,192] linear.out") has no place in PyTorch's schema
//     that an importer would not take for the scope, and is not written.
//   - external_annotations holds the record_function regions PyTorch would record: ProfilerStep#N around
//     each iteration (torch.profiler's schedule), the phases by name ("setup", "data", "forward",
//     "backward", "recompute", "eval") and the optimizer's as Optimizer.step#AdamW.step and
//     Optimizer.zero_grad#AdamW.zero_grad (its hooks' names), and annotation events. memory_viz does not
//     draw them; oomdbg's importer and other tools do.
//   - segments is the allocator's final state (the footer), with each segment's creating stack and each
//     active block's allocation stack; allocator_settings comes from Meta.AllocatorSettings.
//
// Markers without a PyTorch counterpart (heap dumps and their retainer edges, category changes, device
// readings) are left out.
//
// The pprof profile (PprofProfile) holds the blocks allocated at one event, the peak by default: sample
// types inuse_objects/count and inuse_space/bytes, Go frames as Locations and Functions with file and line,
// and the tags as labels: phase, category, scope and tensor (strings) and iteration (a number). For leaks,
// export at the end of two iterations (--at iteration-end:N) and diff them:
//
//	oomdbg export run.oomdbg --format pprof --at iteration-end:2 -o a.pb.gz
//	oomdbg export run.oomdbg --format pprof --at iteration-end:5 -o b.pb.gz
//	go tool pprof -top -diff_base a.pb.gz b.pb.gz
//
// The Perfetto trace (Perfetto) has counter tracks for allocated and reserved bytes, the capacity and each
// category, slices for iterations and phases, and instants for the peak, OOMs, heap dumps and annotations.
// The plot (SVG, PNG) draws allocated and reserved bytes bucketed by their maximum per column, never
// averaged, with the phases shaded under the curve and the capacity, the peak and the OOM marked.
package export
