// Package allocator models PyTorch's CUDA caching allocator (DeviceCachingAllocator in
// c10/cuda/CUDACachingAllocator.cpp) closely enough that a trace replayed through it hands out the same
// addresses, grows the same segments and fails with the same out-of-memory message as PyTorch would.
//
// An Allocator serves one device. Requests are rounded (round_size, with the roundup_power2_divisions
// table), routed to the small pool (rounded size <= 1 MiB) or the large pool, and served best-fit from the
// free blocks cached on the same stream, ordered by (stream, size, address) exactly as PyTorch's std::set
// with lower_bound: one candidate is inspected and blocks cached on other streams are never reused. A block
// that is too big is split at its low end (should_split); a freed block merges with free neighbours of its
// own segment. When the cache cannot serve a request the allocator asks the Device for a new segment
// (get_allocation_size: 2 MiB, 20 MiB or the request rounded to 2 MiB), and on failure walks PyTorch's
// recovery chain: release oversize blocks (only with max_split_size), release every unsplit cached segment
// and retry, then give up with an *OutOfMemoryError carrying PyTorch's exact message. Expandable segments
// (expandable_segments:True) reserve address space per (stream, pool) and map 2 MiB or 20 MiB pages on
// demand; memory fractions, garbage_collection_threshold and record_stream are modelled too.
//
// Every step is reported to an Observer in PyTorch's trace order (alloc, free_requested, free_completed,
// segment_alloc, segment_free, segment_map, segment_unmap, oom), and Stats mirrors
// torch.cuda.memory_stats(). Segments returns the allocator state in the shape of a PyTorch snapshot.
//
// Segments come from a Device: SimDevice accounts memory against a capacity minus a CUDA-context reserve so
// that OOMs happen where they would on a real card; a CUDA-backed Device lives behind a build tag elsewhere.
//
// Streams (record_stream) are modelled as PyTorch has them: a block freed after RecordStream marked it used
// on other streams gets one event recorded on each (insert_events) and stays active_pending_free; each
// request first walks every stream's events oldest first, stopping at the first that has not completed
// (process_events), and caches a block when its last event completes; Synchronize and EmptyCache wait for
// them all (synchronize_and_free_events). Whether an event has completed is asked of a Streams, which the
// simulated runtime implements with its model of the streams' progress (workloads/device) and the replay
// of a recorded trace with what the trace says. Without one, every event has completed by the next request.
//
// Out of scope: private memory pools (CUDA graph capture, torch.cuda.MemPool, use_on_oom pools), IPC
// sharing, free-memory callbacks (trigger_free_memory_callbacks), the cudaMallocAsync backend, peer access,
// the pinned host allocator, PYTORCH_NO_CUDA_MEMORY_CACHING and throw_on_cudamalloc_oom. ParseConfig
// refuses backend:cudaMallocAsync and throw_on_cudamalloc_oom:True; settings that do not change where
// device memory goes (pinned_*, release_lock_on_cudamalloc, graph_capture_record_stream_reuse, the
// expandable_segments_reserve* address-space settings) are accepted, kept for String, and have no effect.
package allocator
