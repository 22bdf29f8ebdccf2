// Package replay runs a recorded PyTorch trace (a snapshot imported by snapshot/torch) through the caching
// allocator model of package allocator.
//
// CheckFidelity replays the allocations and frees under the settings the recording ran with and compares what
// the model does with what PyTorch did: the size of every segment the recording created, the address of every
// block it reused, the segments released by each empty_cache (or out-of-memory retry), and the final segment
// state. CompareSettings replays the same trace under other settings (expandable_segments,
// max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold, ...) and reports the peak
// reserved memory, the memory lost to fragmentation, and whether the recorded out-of-memory error would still
// happen. Run does both and returns a Report to print (oomdbg replay).
//
// The package sits beside the allocator model rather than in snapshot/torch because it drives the model:
// snapshot and its subpackages stay free of workloads.
//
// # Addresses
//
// A recording's addresses are real GPU addresses; the model's come from its Device. The fidelity replay's
// device hands the model, for each segment the recording created, the address the recording got, whenever
// that range is free, so that the model's best fit breaks ties between equal-sized blocks by the same
// addresses PyTorch compared. Recorded segment bases are mapped to model segment bases as segments appear,
// and a reused block's address is compared as an offset within its segment, so a model that drifts (a
// segment of another size, at another address) is still compared fairly from then on.
//
// # State from before the trace
//
// PyTorch's trace is a ring buffer: it may begin long after the program did. The importer marks the segments
// and blocks that were alive when the trace began (snapshot/torch.PreExistingLabel). The fidelity replay
// rebuilds a pre-existing segment in the model, block for block, where its layout at the start is known:
// every block in use then with its size, and a layout that obeys the allocator's invariants. A block still in
// use at the end has its size in the final state. A block the trace frees has none recorded: it is its
// rounded request, or, where the allocator served it from a free block at most 1 MiB larger and so did not
// split it, up to 1 MiB more. Where the next block in use leaves no room for a free block (1 MiB or less),
// it reached that block. Otherwise the trace decides: the allocator carves a request from the front of a
// free block, so the first allocation the trace makes after the block, while it is alive, lands where the
// free block after it began, which is where the block ended. Where the trace makes none, the split rule
// sizes it (the rounded request). Fidelity.Inferred counts both kinds, and the report says so; the replay's
// addresses and final state, compared with the recording's, show whether the inference held (it does for
// every reuse of the real ring-buffer traces in shared/fixtures). A block of max_split_size or more, which
// the allocator never splits, has no rule to size it without the trace. The replay carves each segment with
// allocations of exactly those sizes under default settings, frees the gaps, then switches to the recorded
// settings. A segment whose layout is still not known is left out: allocations the recording served from it
// are counted as not replayed (Fidelity.Unknown) and not compared, and its release is not compared either.
//
// The what-if replay cannot know where blocks allocated before the trace would have landed under other
// settings; it allocates them, in address order, before the trace, under the settings being tried (and does
// the same for the recorded settings, so the two compare like for like), and drops cached free memory from
// before the trace.
//
// # Releases
//
// A trace does not say why a segment was released (torch.cuda.empty_cache, the out-of-memory retry that
// releases every cached segment, garbage collection). Each run of segment_free entries is replayed as
// EmptyCache, which releases exactly what the retry path releases.
package replay
