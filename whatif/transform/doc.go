// Package transform changes a recorded trace the way a memory fix would change the program's requests to
// the caching allocator: a smaller batch, gradient accumulation, another optimizer, zero_grad that zeroes
// instead of releasing, activation checkpointing. Each Transform is a pure function from a trace to a trace,
// so they compose; allocator/replay then replays the result through the allocator model (oomdbg
// whatif).
//
// A transformation reads only the event model's tags: phase, iteration, category and scope. oomdbg's own
// recordings carry all of them; a PyTorch snapshot carries them once they are inferred. Where a trace lacks
// the tags a transformation needs, it refuses with a *MissingTagsError rather than guess.
//
// Every transformation states what it assumed in one line with its figures ("batch x0.5: 1.2 GiB of the
// 1.6 GiB live at the recorded peak scale with the batch ..."), since a trace records sizes, not shapes: what
// scales with the batch is read off categories and lifetimes.
//
// The trace a transformation returns keeps what a replay needs: allocations and frees, each allocation at an
// address of its own (an identifier: the replay's allocator places blocks itself), the release markers
// (segment_free runs), the OOM and the phase, iteration and category markers. Segment events from the
// recording, heap dumps and device samples are left out: they are the recorded allocator's answers, not the
// program's requests.
package transform
