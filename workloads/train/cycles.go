package train

import (
	"context"
	"encoding/binary"
	"hash/maphash"

	"github.com/oomdbg/oomdbg/workloads/dist"
)

// Simulate runs cfg as RunWithin does, for a planner that asks what memory a configuration takes and what its
// steps move: where a step accumulates micro-batches of one shape, those between the first and the last run
// through a cycle of allocator states, and once the state a micro-batch starts from repeats one seen before,
// the whole cycles left before the last micro-batch are counted instead of run. From the same state the same
// requests do the same thing, so the peaks, the verdict, what the rank moves and the losses are RunWithin's
// (TestAccumulationSimulatedByItsCycle in package fit holds them to the full run), in time that does not grow
// with the micro-batches: a step of 8,192 took thousands of times one. Phases and StepStats list only the
// micro-batches run. A run whose next micro-batch depends on more than the device's allocator (host memory
// for offload, garbage collection's block ages, lengths that vary by batch, a recorder) runs every one.
func Simulate(ctx context.Context, cfg Config, limit int64) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res, _, err := runValidWith(ctx, cfg, nil, max(limit, 1), nil, true)
	return res, err
}

// cycleFinder watches the states micro-batches of one step start from, for one that repeats.
type cycleFinder struct {
	seed  maphash.Seed
	seen  map[uint64]int // a state -> the first micro-batch that started from it
	loss  []float32      // by micro-batch: the step's loss before it
	moved []dist.Traffic // by micro-batch: what the rank had moved in the step before it
	buf   []byte
}

// newCycleFinder returns a finder for one step of r, or nil where cycles are not to be skipped.
func (r *run) newCycleFinder() *cycleFinder {
	if !r.skipCycles || r.cfg.Accum <= 3 || !r.cfg.SeqDist.Fixed() || r.rec != nil || r.host != nil ||
		r.dev.Allocator().Config().GarbageCollectionThreshold > 0 {
		return nil
	}
	return &cycleFinder{seed: maphash.MakeSeed(), seen: map[uint64]int{}}
}

// skip is called before micro-batch micro of k, with the step's loss so far. When the state it starts from
// repeats that of an earlier one, it counts the whole cycles left before the last micro-batch as run (their
// loss and what they move) and returns how many micro-batches they are; else it notes the state and returns 0.
func (c *cycleFinder) skip(r *run, micro, k int, lossSum float32) (int, float32) {
	var moved dist.Traffic
	if r.rank != nil {
		moved = r.rank.StepTraffic()
	}
	state := c.state(r)
	j, ok := c.seen[state]
	if !ok {
		c.seen[state] = micro
		c.loss, c.moved = append(c.loss, lossSum), append(c.moved, moved)
		return 0, 0
	}
	period := micro - j
	n := (k - 1 - micro) / period // whole cycles before the last micro-batch
	if n == 0 {
		return 0, 0
	}
	if r.rank != nil {
		r.rank.RepeatTraffic(c.moved[j-1], n) // c.loss and c.moved start at micro-batch 1
	}
	return n * period, float32(n) * (lossSum - c.loss[j-1])
}

// state hashes what the next micro-batch's allocations depend on: every segment of the device's allocator with
// its blocks (place, size, request, state), and the unified memory of a paged optimizer.
func (c *cycleFinder) state(r *run) uint64 {
	b := c.buf[:0]
	for _, s := range r.dev.Allocator().Segments() {
		b = binary.LittleEndian.AppendUint64(b, s.Addr)
		b = binary.LittleEndian.AppendUint64(b, s.Size)
		b = binary.LittleEndian.AppendUint64(b, uint64(s.Stream))
		b = append(b, s.Pool...)
		for _, bl := range s.Blocks {
			b = binary.LittleEndian.AppendUint64(b, bl.Addr)
			b = binary.LittleEndian.AppendUint64(b, bl.Size)
			b = binary.LittleEndian.AppendUint64(b, bl.Requested)
			b = append(b, bl.State...)
		}
	}
	if m, ok := r.dev.Managed(); ok {
		ms := m.ManagedStats()
		b = binary.LittleEndian.AppendUint64(b, ms.Allocated)
		b = binary.LittleEndian.AppendUint64(b, ms.Resident)
	}
	c.buf = b
	return maphash.Bytes(c.seed, b)
}
