package torch

import (
	"cmp"
	"slices"
	"sort"

	"github.com/oomdbg/oomdbg/snapshot"
)

// A trace records the size each caller asked for, not the size of the block it got: a large-pool block keeps
// a remainder of up to 1 MiB that was not worth splitting off (docs/allocator.md §6). This file
// follows the blocks of every segment through the trace so that each allocation's block size comes from the
// allocator's own split rule wherever the free block it was carved from is known.
//
// Blocks are carved from the low end of a free block, and free neighbours always merge, so an allocation at
// address a was carved from the free block that starts at a and ends at the next block in use (or the
// segment's end). When that is known, block = rounded request if should_split says so, else the whole free
// block. Small-pool blocks need no layout (all small sizes are multiples of 512, so the remainder is always
// split off), nor do expandable segments (they split any remainder of 512 bytes or more).

// preSeg is a segment alive before the trace began.
type preSeg struct {
	addr       uint64
	size       int64
	stream     int64
	stack      snapshot.StackID
	small      bool
	expandable bool
	known      bool // the blocks in use inside it when the trace began are all known, with their sizes
}

func (s *preSeg) end() uint64 { return s.addr + uint64(s.size) }

// preBlock is a block in use before the trace began.
type preBlock struct {
	addr      uint64
	requested int64
	size      int64
	stream    int64
	stack     snapshot.StackID
	sizeKnown bool
	pending   bool // freed before the trace, waiting on other streams: its free_requested predates the trace
}

func (b *preBlock) end() uint64 { return b.addr + uint64(b.size) }

// lseg is a non-expandable segment as the layout pass follows it: the large-pool blocks in use, by address.
type lseg struct {
	base, end uint64
	known     bool
	unloaded  bool // its pre-existing blocks are not in blocks yet: layout.find loads them on first use
	blocks    []lblock
}

type lblock struct {
	addr uint64
	size uint64
}

// Caps on what the layout follows. Real segments hold a few large-pool blocks each (every one is over 1 MiB)
// and a device holds thousands of segments at most; the caps keep crafted traces, whose insertions would
// otherwise cost time quadratic in their length, cheap. Beyond them, layouts become unknown.
const (
	maxLayoutSegments = 1 << 16
	maxSegmentBlocks  = 1 << 12
	maxIntervals      = 1 << 16
)

// layout is the segments of one device during the forward pass.
type layout struct {
	segs []*lseg    // by base address
	exp  intervals  // mapped ranges of expandable segments
	pre  []preBlock // the blocks in use before the trace, by address: what unloaded segments hold
}

// find returns the segment holding addr, or nil. A trace touches few of the segments that predate it, so a
// segment's pre-existing large-pool blocks are loaded when it is first found.
func (l *layout) find(addr uint64) *lseg {
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].base > addr }) - 1
	if i < 0 || addr >= l.segs[i].end {
		return nil
	}
	s := l.segs[i]
	if s.unloaded {
		s.unloaded = false
		if s.known { // an unknown layout is never read
			j, _ := slices.BinarySearchFunc(l.pre, s.base, func(b preBlock, a uint64) int { return cmp.Compare(b.addr, a) })
			for ; j < len(l.pre) && l.pre[j].addr < s.end; j++ {
				if b := &l.pre[j]; b.size > smallSize {
					s.blocks = append(s.blocks, lblock{b.addr, uint64(b.size)})
				}
			}
		}
	}
	return s
}

// add inserts a segment; one that overlaps another (contradictory input) is inserted with an unknown
// layout, and so is its neighbour.
func (l *layout) add(s *lseg) bool {
	if len(l.segs) >= maxLayoutSegments {
		return false // not followed: its allocations get estimated sizes
	}
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].base >= s.base })
	ok := true
	if i > 0 && l.segs[i-1].end > s.base {
		l.segs[i-1].known, s.known, ok = false, false, false
	}
	if i < len(l.segs) && l.segs[i].base < s.end {
		l.segs[i].known, s.known, ok = false, false, false
	}
	l.segs = slices.Insert(l.segs, i, s)
	return ok
}

func (l *layout) remove(base uint64) {
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].base >= base })
	if i < len(l.segs) && l.segs[i].base == base {
		l.segs = slices.Delete(l.segs, i, i+1)
	}
}

// freeBlockAt returns the size of the free block that starts at addr in s, or false when s's layout does not
// show one there (the layout is unknown, or contradicts the trace).
func (s *lseg) freeBlockAt(addr uint64) (uint64, bool) {
	if !s.known {
		return 0, false
	}
	i := sort.Search(len(s.blocks), func(i int) bool { return s.blocks[i].addr >= addr })
	prevEnd := s.base
	if i > 0 {
		prevEnd = s.blocks[i-1].addr + s.blocks[i-1].size
	}
	if prevEnd != addr { // the block before is still in use over addr, or a free gap precedes addr
		return 0, false
	}
	next := s.end
	if i < len(s.blocks) {
		next = s.blocks[i].addr
	}
	if next <= addr {
		return 0, false
	}
	return next - addr, true
}

func (s *lseg) insert(addr, size uint64) {
	if len(s.blocks) >= maxSegmentBlocks {
		s.known, s.blocks = false, nil
		return
	}
	i := sort.Search(len(s.blocks), func(i int) bool { return s.blocks[i].addr >= addr })
	s.blocks = slices.Insert(s.blocks, i, lblock{addr, size})
}

func (s *lseg) removeBlock(addr uint64) {
	i := sort.Search(len(s.blocks), func(i int) bool { return s.blocks[i].addr >= addr })
	if i < len(s.blocks) && s.blocks[i].addr == addr {
		s.blocks = slices.Delete(s.blocks, i, i+1)
	}
}

// interval is a half-open address range of an expandable segment, on one stream.
type interval struct {
	start, end uint64
	stream     int64
}

// intervals is a sorted set of disjoint ranges.
type intervals []interval

// add adds [start, end), merging it with touching ranges of the same stream. It reports false, adding
// nothing, when the range overlaps one already there.
func (iv *intervals) add(start, end uint64, stream int64) bool {
	if end <= start {
		return true
	}
	s := *iv
	if len(s) >= maxIntervals {
		return false
	}
	i := sort.Search(len(s), func(i int) bool { return s[i].end > start }) // the first range ending after start
	if i < len(s) && s[i].start < end {
		return false
	}
	r := interval{start, end, stream}
	lo, hi := i, i
	if i > 0 && s[i-1].end == start && s[i-1].stream == stream {
		r.start, lo = s[i-1].start, i-1
	}
	if i < len(s) && s[i].start == end && s[i].stream == stream {
		r.end, hi = s[i].end, i+1
	}
	*iv = slices.Replace(s, lo, hi, r)
	return true
}

// remove removes [start, end), reporting false when part of it was not there.
func (iv *intervals) remove(start, end uint64) bool {
	if end <= start {
		return true
	}
	s := *iv
	var out intervals
	covered := uint64(0)
	for _, r := range s {
		if r.end <= start || r.start >= end {
			out = append(out, r)
			continue
		}
		covered += min(r.end, end) - max(r.start, start)
		if r.start < start {
			out = append(out, interval{r.start, start, r.stream})
		}
		if r.end > end {
			out = append(out, interval{end, r.end, r.stream})
		}
	}
	*iv = out
	return covered == end-start
}

func (iv intervals) contains(addr uint64) bool {
	i := sort.Search(len(iv), func(i int) bool { return iv[i].end > addr })
	return i < len(iv) && iv[i].start <= addr
}

// startLayout sizes the pre-existing blocks whose size the final state does not give (those freed during
// the trace) and decides which pre-existing segments have a known layout. A block freed during the trace
// started at its address and ends where the next block in use begins, unless the allocator split it: in the
// large pool a free remainder is always over 1 MiB, so a distance to the next block (or the segment's end)
// within 1 MiB of the rounded request means the block reached it; a longer distance leaves the size unknown.
func (im *importer) startLayout(segs []preSeg, blocks []preBlock) {
	bySeg := func(a, b preSeg) int { return cmp.Compare(a.addr, b.addr) }
	if !slices.IsSortedFunc(segs, bySeg) {
		slices.SortFunc(segs, bySeg)
	}
	byBlock := func(a, b preBlock) int { return cmp.Compare(a.addr, b.addr) }
	if !slices.IsSortedFunc(blocks, byBlock) { // blocks of the final state come sorted already
		slices.SortFunc(blocks, byBlock)
	}
	segOf := func(addr uint64) *preSeg {
		i := sort.Search(len(segs), func(i int) bool { return segs[i].addr > addr }) - 1
		if i >= 0 && addr < segs[i].end() {
			return &segs[i]
		}
		return nil
	}
	for i := range blocks {
		b := &blocks[i]
		if b.sizeKnown {
			continue
		}
		r := im.rules.roundSize(uint64(b.requested))
		b.size = int64(r)
		seg := segOf(b.addr)
		switch {
		case r <= smallSize || seg != nil && seg.expandable:
			b.sizeKnown = true
		case seg != nil:
			next := seg.end()
			if i+1 < len(blocks) && blocks[i+1].addr < next {
				next = blocks[i+1].addr
			}
			if next >= b.addr+r && next-(b.addr+r) <= smallSize {
				b.size, b.sizeKnown = int64(next-b.addr), true
			} else {
				seg.known = false
			}
		}
	}
	// Check each known layout against the allocator's invariants: blocks inside the segment and apart, and in
	// the large pool no free gap of 1 MiB or less (every large-pool block is over 1 MiB).
	bi := 0
	for si := range segs {
		s := &segs[si]
		for bi < len(blocks) && blocks[bi].addr < s.addr {
			bi++
		}
		prev := s.addr
		for ; bi < len(blocks) && blocks[bi].addr < s.end(); bi++ {
			b := &blocks[bi]
			gap := b.addr - prev
			if b.addr < prev || b.end() > s.end() || !s.small && !s.expandable && gap > 0 && gap <= smallSize {
				s.known = false
			}
			prev = max(prev, b.end())
		}
		if gap := s.end() - prev; !s.small && !s.expandable && gap > 0 && gap <= smallSize {
			s.known = false
		}
	}
}
