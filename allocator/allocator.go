package allocator

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"

	"github.com/oomdbg/oomdbg/internal/torchrules"
)

// Allocator is PyTorch's DeviceCachingAllocator for one device. It is safe for concurrent use: one mutex
// guards everything, and the Observer is called with it held, as PyTorch calls its trace trackers.
type Allocator struct {
	mu  sync.Mutex
	dev Device
	idx int // device ordinal
	// totalMemory is the device's totalGlobalMem, the base of memory fractions and reservations.
	totalMemory uint64

	cfg          Config
	maxSplit     uint64 // max_split_size, math.MaxUint64 when unlimited
	maxNonSplit  uint64 // max_non_split_rounding_size
	largeSegment uint64 // large_segment_size
	divisions    *[RoundupIntervals]uint64

	obs Observer

	small, large blockPool
	live         map[uint64]*block // allocated blocks by address (NativeCachingAllocator's allocated_blocks)
	events       []*streamEvents   // outstanding cross-stream events, a queue per stream, by stream
	streams      Streams           // how far each stream's work has run
	expandable   []*expandableSegment

	// totalAllocated is total_allocated_memory: the bytes held from the device, which the memory
	// fraction and garbage collection look at.
	totalAllocated uint64
	allowedMax     uint64 // allowed_memory_maximum, when limited
	limited        bool

	stats  Stats
	segSeq uint64 // creation counter of segments, for TieBySegment

	spare   []*block // recycled block structs, so the hot path does not allocate
	key     block    // search key, kept here so lower_bound does not allocate
	scratch []*block // reused by the release paths
}

// allocParams is PyTorch's AllocParams: one request on its way through malloc.
type allocParams struct {
	size       uint64 // rounded size
	stream     int64
	pool       *blockPool
	allocSize  uint64 // get_allocation_size(size)
	expandable bool   // expandable segments active for this request
	block      *block // the block found or created
}

// New returns an allocator for dev with the settings of cfg. A per_process_memory_fraction in cfg acts as
// SetMemoryFraction. cfg should be valid (see Config.Validate; ParseConfig only returns valid ones). Values
// PyTorch would refuse and that would break the model fall back to safe ones: a large_segment_size of
// 10 MiB or less to the default, divisions that are not powers of two to none, and a max_split_size below
// large_segment_size to large_segment_size.
func New(dev Device, cfg Config) *Allocator {
	a := &Allocator{
		dev:         dev,
		idx:         dev.Index(),
		totalMemory: dev.TotalMemory(),
		live:        make(map[uint64]*block),
		streams:     immediate{},
	}
	bySize := orderSizeAddress
	if cfg.TieOrder == TieBySegment {
		bySize = orderSizeSegment
	}
	a.small = blockPool{small: true, statType: statSmallPool,
		blocks: newBlockTree(bySize, 0x9e3779b97f4a7c15), unmapped: newBlockTree(orderAddress, 0xbf58476d1ce4e5b9)}
	a.large = blockPool{small: false, statType: statLargePool,
		blocks: newBlockTree(bySize, 0x94d049bb133111eb), unmapped: newBlockTree(orderAddress, 0x2545f4914f6cdd1d)}
	a.applyConfig(cfg)
	a.stats.MaxSplitSize = maxSplitStat(a.maxSplit)
	if f := cfg.PerProcessMemoryFraction; f > 0 && f < 1 {
		a.allowedMax, a.limited = uint64(f*float64(a.totalMemory)), true
	}
	return a
}

func (a *Allocator) applyConfig(cfg Config) {
	a.cfg = cfg
	a.maxSplit = cfg.MaxSplit()
	a.maxNonSplit = cfg.MaxNonSplitRoundingSize()
	a.largeSegment = cfg.LargeSegment()
	a.divisions = nil
	for i, d := range a.cfg.RoundupPower2Divisions {
		// PyTorch only accepts powers of two; anything else (or absurdly many divisions, where 512*n
		// overflows) would round to sizes that are not multiples of 512, so it counts as off.
		if d&(d-1) != 0 || d > 1<<40 {
			a.cfg.RoundupPower2Divisions[i] = 0
			continue
		}
		if d > 1 {
			a.divisions = &a.cfg.RoundupPower2Divisions
		}
	}
}

// SetConfig changes the settings while the allocator runs, as torch.cuda.memory._set_allocator_settings
// does: later requests follow the new rounding, splitting and expandable_segments settings (blocks of
// existing expandable segments are then skipped by best fit). As in PyTorch, Stats.MaxSplitSize keeps the
// value the allocator was created with and the memory fraction is left alone. TieOrder cannot change.
func (a *Allocator) SetConfig(cfg Config) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cfg.TieOrder = a.cfg.TieOrder
	a.applyConfig(cfg)
}

// Config returns the allocator's settings.
func (a *Allocator) Config() Config {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cfg
}

// SetObserver sets the observer that receives the trace; nil stops tracing.
func (a *Allocator) SetObserver(o Observer) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.obs = o
}

// SetMemoryFraction limits the allocator to fraction of the device's total memory, as
// torch.cuda.set_per_process_memory_fraction does: a new segment is refused when the reserved bytes plus
// its size would exceed the limit. A fraction of 1 removes the limit.
func (a *Allocator) SetMemoryFraction(fraction float64) error {
	if !(fraction >= 0 && fraction <= 1) {
		//lint:ignore ST1005 PyTorch's message, verbatim
		return fmt.Errorf("invalid fraction:%s. Please set within [0, 1].", strconv.FormatFloat(fraction, 'g', 6, 64))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.allowedMax, a.limited = 0, false
	if fraction < 1 {
		a.allowedMax, a.limited = uint64(fraction*float64(a.totalMemory)), true
	}
	return nil
}

// MemoryFraction returns the memory fraction in effect (1 when there is none).
func (a *Allocator) MemoryFraction() float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.limited {
		return 1
	}
	return float64(a.allowedMax) / float64(a.totalMemory)
}

// RoundSize returns the size a request of size bytes is served with under the allocator's settings.
func (a *Allocator) RoundSize(size uint64) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return torchrules.RoundSize(size, a.divisions)
}

// Malloc hands out a block of at least size bytes for use on stream (a raw cudaStream_t value; 0 is the
// default stream) and returns its address. A size of 0 returns address 0 and touches nothing, as PyTorch
// does. When the device cannot provide the memory, the error is an *OutOfMemoryError; other errors come
// from the Device.
func (a *Allocator) Malloc(size uint64, stream int64) (uint64, error) {
	if size >= torchrules.OneExaByte {
		return 0, &OutOfMemoryError{Device: a.idx, Stream: stream, Requested: size, TooLarge: true}
	}
	if size == 0 {
		return 0, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.events) > 0 {
		a.processEvents()
	}
	rounded := torchrules.RoundSize(size, a.divisions)
	pool := &a.large
	if torchrules.IsSmall(rounded) {
		pool = &a.small
	}
	p := allocParams{
		size:       rounded,
		stream:     stream,
		pool:       pool,
		allocSize:  torchrules.AllocationSize(rounded, a.largeSegment),
		expandable: a.cfg.ExpandableSegments,
	}
	found := a.getFreeBlock(&p)
	if !found {
		var err error
		if found, err = a.newMemory(&p); err != nil {
			return 0, err
		}
	}
	if !found {
		return 0, a.outOfMemory(&p, size)
	}
	b := a.allocFoundBlock(&p, size, a.shouldSplit(p.block, rounded, p.expandable))
	return b.addr, nil
}

// newMemory is malloc's "can't reuse an existing block" path: garbage collection, then alloc_block, then
// the recovery chain, in PyTorch's order.
func (a *Allocator) newMemory(p *allocParams) (bool, error) {
	if a.gcEnabled() {
		if err := a.garbageCollectCachedBlocks(); err != nil {
			return false, err
		}
	}
	if ok, err := a.allocBlock(p, false); ok || err != nil {
		return ok, err
	}
	// Release oversize blocks (only with max_split_size) just enough for this request.
	released, err := a.releaseAvailableCachedBlocks(p)
	if err != nil {
		return false, err
	}
	if released {
		if ok, err := a.allocBlock(p, false); ok || err != nil {
			return ok, err
		}
	}
	// Release every unsplit cached segment and retry once more.
	if err := a.releaseCachedBlocks(); err != nil {
		return false, err
	}
	return a.allocBlock(p, true)
}

// outOfMemory records the OOM and builds the error PyTorch raises.
func (a *Allocator) outOfMemory(p *allocParams, size uint64) error {
	free, total, err := a.dev.MemGetInfo()
	if err != nil {
		return fmt.Errorf("alloc: cudaMemGetInfo: %w", err)
	}
	e := &OutOfMemoryError{
		Device:         a.idx,
		Stream:         p.stream,
		Requested:      size,
		Rounded:        p.size,
		AllocSize:      p.allocSize,
		DeviceFree:     free,
		DeviceTotal:    total,
		AllowedMaximum: a.allowedMax,
		Limited:        a.limited,
		Processes:      a.dev.Processes(),
	}
	if a.obs != nil {
		a.obs.OOM(a.idx, p.stream, p.size, p.allocSize, free)
	}
	a.stats.NumOOMs++
	e.Allocated = uint64(a.stats.AllocatedBytes[statAll].Current)
	e.Reserved = uint64(a.stats.ReservedBytes[statAll].Current)
	return e
}

func (a *Allocator) gcEnabled() bool {
	return a.limited && a.cfg.GarbageCollectionThreshold > 0
}

// getFreeBlock is get_free_block: best fit among the pool's cached blocks on the request's stream. Like
// std::set::lower_bound it inspects one candidate (after the expandable-segment adjustments) and gives up
// if that one is unsuitable.
func (a *Allocator) getFreeBlock(p *allocParams) bool {
	pool := p.pool
	if a.gcEnabled() {
		pool.getFreeBlocksCallCount++
	}
	a.key = block{stream: p.stream, size: p.size}
	b := pool.blocks.lowerBound(&a.key)
	if b == nil || b.stream != p.stream {
		return false
	}
	if b.seg != nil {
		if p.expandable {
			// Best fit counts an expandable block at the size it can grow to by mapping the unmapped
			// block after it, so a later (bigger) block may fit better.
			for b.seg != nil {
				next := pool.blocks.after(b)
				if next == nil || next.stream != p.stream || expandableSize(next) >= expandableSize(b) {
					break
				}
				b = next
			}
		} else {
			// Expandable segments were switched off after some were made: use only ordinary blocks.
			for b != nil && b.seg != nil && b.stream == p.stream {
				b = pool.blocks.after(b)
			}
			if b == nil || b.stream != p.stream {
				return false
			}
		}
	}
	// Do not hand out an oversize block for a normal request.
	if p.size < a.maxSplit && b.size >= a.maxSplit {
		return false
	}
	// An oversize request may take an oversize block only if the waste stays under the limit.
	if p.size >= a.maxSplit && b.size >= satAdd(p.size, a.maxNonSplit) {
		return false
	}
	pool.blocks.erase(b)
	p.block = b
	return true
}

func expandableSize(b *block) uint64 {
	if b.next != nil && !b.next.mapped {
		return b.size + b.next.size
	}
	return b.size
}

func satAdd(x, y uint64) uint64 {
	if x > math.MaxUint64-y {
		return math.MaxUint64
	}
	return x + y
}

// shouldSplit is should_split (torchrules.ShouldSplit): a block of an expandable segment splits by the
// small pool's rule.
func (a *Allocator) shouldSplit(b *block, size uint64, expandable bool) bool {
	return torchrules.ShouldSplit(b.size, size, b.pool.small || expandable, a.maxSplit)
}

// allocBlock is alloc_block: a new segment from the device (or pages mapped into an expandable segment),
// unless the memory fraction forbids it. It returns false without error when the device is out of memory.
func (a *Allocator) allocBlock(p *allocParams, isRetry bool) (bool, error) {
	if isRetry {
		a.stats.NumAllocRetries++
	}
	if a.limited && a.totalAllocated+p.allocSize > a.allowedMax {
		return false, nil
	}
	if p.expandable {
		b, err := a.tryAllocateExpandableBlock(p)
		if err != nil || b == nil {
			return false, err
		}
		p.block = b
		return true, nil
	}
	addr, err := a.dev.Malloc(p.allocSize)
	if err != nil {
		if errors.Is(err, ErrOutOfMemory) {
			return false, nil
		}
		return false, fmt.Errorf("alloc: cudaMalloc of %d bytes: %w", p.allocSize, err)
	}
	a.totalAllocated += p.allocSize
	a.segSeq++
	b := a.newBlock()
	b.addr, b.size, b.stream, b.pool, b.mapped, b.segSeq = addr, p.allocSize, p.stream, p.pool, true, a.segSeq
	a.stats.Segment.increase(p.pool.statType, 1)
	a.stats.ReservedBytes.increase(p.pool.statType, p.allocSize)
	if p.allocSize >= a.maxSplit {
		a.stats.OversizeSegments.increase(1)
	}
	a.stats.NumDeviceAlloc++
	if a.obs != nil {
		a.obs.SegmentAlloc(a.idx, p.stream, addr, p.allocSize)
	}
	p.block = b
	return true, nil
}

// allocFoundBlock is alloc_found_block: hand out p.block, first splitting off its high end as a cached
// remainder when split is set.
func (a *Allocator) allocFoundBlock(p *allocParams, origSize uint64, split bool) *block {
	b := p.block
	pool := p.pool
	st := pool.statType
	alreadySplit := b.isSplit()
	if split {
		remaining := b
		b = a.newBlock()
		b.addr, b.size, b.stream, b.pool, b.mapped = remaining.addr, p.size, p.stream, pool, true
		b.seg, b.segSeq = remaining.seg, remaining.segSeq
		b.prev = remaining.prev
		if b.prev != nil {
			b.prev.next = b
		}
		b.next = remaining
		remaining.prev = b
		remaining.addr += p.size
		remaining.size -= p.size
		pool.insertFree(remaining)
		if b.seg == nil {
			if alreadySplit {
				// An inactive split block shrinks by the handed-out size.
				a.stats.InactiveSplitBytes.decrease(st, b.size)
			} else {
				// A new inactive split block appears: the remainder.
				a.stats.InactiveSplitBytes.increase(st, remaining.size)
				a.stats.InactiveSplit.increase(st, 1)
			}
		}
	} else if alreadySplit && b.seg == nil {
		a.stats.InactiveSplitBytes.decrease(st, b.size)
		a.stats.InactiveSplit.decrease(st, 1)
	}
	b.allocated = true
	b.requested = origSize
	if a.obs != nil {
		a.obs.Alloc(a.idx, b.stream, b.addr, origSize, b.size)
	}
	a.live[b.addr] = b
	a.stats.Allocation.increase(st, 1)
	a.stats.AllocatedBytes.increase(st, b.size)
	a.stats.Active.increase(st, 1)
	a.stats.ActiveBytes.increase(st, b.size)
	a.stats.RequestedBytes.increase(st, b.requested)
	if b.size >= a.maxSplit {
		a.stats.OversizeAllocations.increase(1)
	}
	return b
}

// newBlock returns a zeroed block struct, recycled when possible.
func (a *Allocator) newBlock() *block {
	if n := len(a.spare); n > 0 {
		b := a.spare[n-1]
		a.spare = a.spare[:n-1]
		return b
	}
	return new(block)
}

// recycle returns a block struct that no longer describes memory.
func (a *Allocator) recycle(b *block) {
	uses := b.streamUses[:0]
	*b = block{streamUses: uses}
	a.spare = append(a.spare, b)
}

// BlockSize returns the size of the allocated block at addr (at least the rounded request; more when the
// remainder was not split off) and whether addr is an allocated block.
func (a *Allocator) BlockSize(addr uint64) (uint64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b, ok := a.live[addr]; ok {
		return b.size, true
	}
	return 0, false
}

// Stats returns a copy of the allocator's statistics.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// ResetPeakStats sets every peak to its current value, as torch.cuda.reset_peak_memory_stats does.
func (a *Allocator) ResetPeakStats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.resetPeaks()
}

// ResetAccumulatedStats zeroes the allocated/freed totals and the event counters, as
// torch.cuda.reset_accumulated_memory_stats does.
func (a *Allocator) ResetAccumulatedStats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.resetAccumulated()
}

// Device returns the allocator's device.
func (a *Allocator) Device() Device { return a.dev }
