package replay

import (
	"cmp"
	"fmt"
	"slices"
	"sort"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/torchrules"
	"github.com/oomdbg/oomdbg/snapshot"
)

// carvePlan is how to rebuild one pre-existing segment: its blocks in address order, those in use when the
// trace began and the free gaps between them, which are freed once every segment is carved.
type carvePlan struct {
	seg   preSeg
	tiles []tile
}

type tile struct {
	addr, size uint64
	inUse      bool
}

// Why a pre-existing segment cannot be rebuilt.
const (
	whyExpandable = "an expandable segment"
	whyBlockSize  = "a block the trace frees, of unknown size"
	whyNotInState = "a block in use to the end that the final state does not hold"
	whyLayout     = "a layout the allocator could not have made"
)

// Sizing says how the size of a block from before the trace was found, where the trace frees the block (so
// the final state does not hold it) and its layout alone does not say: the block is its rounded request if
// the allocator split off the rest of the free block that served it, or up to 1 MiB more if it did not.
type Sizing struct {
	// FromTrace counts blocks sized by where the trace's first allocation after them landed while they were
	// alive: the allocator carves a request from the front of a free block, so the free block after such a
	// block began there, and so the block ended there.
	FromTrace int `json:"from_trace"`
	// SplitRule counts blocks no allocation of the trace landed after while they were alive: taken to be
	// their rounded request, the rest split off, as the allocator does whenever the free block that served
	// them was over 1 MiB larger.
	SplitRule int `json:"split_rule"`
}

// Total counts the blocks whose size was inferred.
func (s Sizing) Total() int { return s.FromTrace + s.SplitRule }

// plannedSeg is a segment from before the trace being planned: its blocks in use when the trace began, and
// why it cannot be rebuilt ("" while it can).
type plannedSeg struct {
	seg    preSeg
	blocks []preBlock
	why    string
}

// openBlock is a block from before the trace whose size lies in [lo-addr, hi-addr]: where the free block
// after it began is what decides it.
type openBlock struct {
	seg, block int    // in the segments planned and their blocks
	lo, hi     uint64 // the range its end may take
	oversize   bool   // at least max_split_size: never split, so the rule has nothing to say
}

// plan decides, for each segment alive before the trace, whether its layout when the trace began is certain,
// and if so how to carve it. The rounding rule is the recorded settings' (cfg); sizes come from the final
// state, the allocator's own rules and where the trace's allocations landed (Sizing), never from guesses.
func (t *deviceTrace) plan(cfg allocator.Config) (plans []carvePlan, unknown map[uint64]string, inferred Sizing) {
	unknown = map[uint64]string{}
	var segs []plannedSeg
	var open []openBlock
	divisions := &cfg.RoundupPower2Divisions
	maxSplit := cfg.MaxSplit()
	bi := 0
	for _, seg := range t.preSegs {
		for bi < len(t.preBlocks) && t.preBlocks[bi].addr < seg.addr {
			bi++
		}
		var blocks []preBlock
		for ; bi < len(t.preBlocks) && t.preBlocks[bi].addr < seg.end(); bi++ {
			blocks = append(blocks, t.preBlocks[bi])
		}
		why := ""
		// Size each block in use at the start.
		for i := range blocks {
			b := &blocks[i]
			if !b.freed {
				fb, ok := t.finalBlock(b.addr)
				if !ok {
					why = whyNotInState
					break
				}
				b.size = uint64(fb.Size)
				continue
			}
			r := torchrules.RoundSize(b.requested, divisions)
			if torchrules.IsSmall(r) {
				b.size = r // the small pool always splits off the rest (all its sizes are multiples of 512)
				continue
			}
			// A large-pool block freed by the trace reached the next block in use (or the segment's end) unless
			// the allocator split off the rest, which it does only for a rest over 1 MiB, and never for a block
			// of max_split_size or more (which may then be up to max_non_split_rounding_size larger).
			next := seg.end()
			if i+1 < len(blocks) {
				next = blocks[i+1].addr
			}
			slack := uint64(allocator.SmallSize)
			if r >= maxSplit {
				slack = cfg.MaxNonSplitRoundingSize()
			}
			switch {
			case next < b.addr+r:
				why = whyBlockSize
			case next-(b.addr+r) <= allocator.SmallSize:
				b.size = next - b.addr // a free gap of 1 MiB or less cannot be in the large pool
			default:
				b.size = r
				open = append(open, openBlock{seg: len(segs), block: i, lo: b.addr + r, hi: min(next, b.addr+r+slack),
					oversize: r >= maxSplit})
			}
			if why != "" {
				break
			}
		}
		if seg.expandable {
			why = whyExpandable
		}
		segs = append(segs, plannedSeg{seg, blocks, why})
	}
	for k, end := range t.blockEnds(open, segs) {
		o := open[k]
		p := &segs[o.seg]
		b := &p.blocks[o.block]
		switch {
		case end > 0:
			b.size = end - b.addr
			inferred.FromTrace++
		case !o.oversize:
			inferred.SplitRule++ // b.size is r already
		case p.why == "":
			p.why = whyBlockSize
		}
	}
	for _, p := range segs {
		why := p.why
		var c carvePlan
		if why == "" {
			c, why = carve(p.seg, p.blocks)
		}
		if why != "" {
			unknown[p.seg.addr] = why
			continue
		}
		plans = append(plans, c)
	}
	return plans, unknown, inferred
}

// blockEnds returns, for each open block, where the trace's first allocation in [lo, hi] landed before
// the trace freed the block (0 for none): the end of the block, since the free block after it began
// there. The ranges of open blocks lie apart, each between its block and the next block in use; segs gives
// their addresses.
func (t *deviceTrace) blockEnds(open []openBlock, segs []plannedSeg) []uint64 {
	ends := make([]uint64, len(open))
	if len(open) == 0 {
		return ends
	}
	byLo := make([]int, len(open)) // open blocks by the start of their range
	for k := range byLo {
		byLo[k] = k
	}
	slices.SortFunc(byLo, func(a, b int) int { return cmp.Compare(open[a].lo, open[b].lo) })
	freed := make([]bool, len(open))
	owner := make(map[uint64]int, len(open)) // a block's address -> its open block
	for k, o := range open {
		owner[segs[o.seg].blocks[o.block].addr] = k
	}
	for _, e := range t.requests() {
		switch e.Action {
		case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
			if k, ok := owner[e.Addr]; ok {
				freed[k] = true
			}
		case snapshot.ActionAlloc:
			j := sort.Search(len(byLo), func(j int) bool { return open[byLo[j]].lo > e.Addr }) - 1
			if j < 0 {
				continue
			}
			k := byLo[j]
			if o := open[k]; !freed[k] && ends[k] == 0 && e.Addr <= o.hi {
				ends[k] = e.Addr
			}
		}
	}
	return ends
}

// carve lays out the tiles of one segment, checking the layout is one the allocator makes: blocks inside the
// segment, apart, multiples of 512 bytes; in a small segment (2 MiB) blocks of at most 1 MiB; in a large one
// (a whole number of 2 MiB pages, at least 10 MiB) blocks and free gaps of over 1 MiB.
func carve(seg preSeg, blocks []preBlock) (carvePlan, string) {
	p := carvePlan{seg: seg}
	if seg.small && seg.size != allocator.SmallBuffer ||
		!seg.small && (seg.size < allocator.MinLargeAlloc || seg.size%allocator.RoundLarge != 0) {
		return p, whyLayout
	}
	at := seg.addr
	gap := func(end uint64) bool {
		n := end - at
		if n == 0 {
			return true
		}
		if n%allocator.MinBlockSize != 0 || !seg.small && n <= allocator.SmallSize {
			return false
		}
		// A free gap is carved in pieces a single request can take (small pool: at most 1 MiB); freed together
		// at the end, they merge back into one free block.
		for n > 0 {
			piece := n
			if seg.small {
				piece = min(n, allocator.SmallSize)
			}
			p.tiles = append(p.tiles, tile{addr: at, size: piece})
			at += piece
			n -= piece
		}
		return true
	}
	for _, b := range blocks {
		if b.addr < at || b.end() > seg.end() || b.size == 0 || b.size%allocator.MinBlockSize != 0 ||
			seg.small && b.size > allocator.SmallSize || !seg.small && b.size <= allocator.SmallSize || !gap(b.addr) {
			return p, whyLayout
		}
		p.tiles = append(p.tiles, tile{addr: b.addr, size: b.size, inUse: true})
		at = b.end()
	}
	if !gap(seg.end()) {
		return p, whyLayout
	}
	return p, ""
}

// build carves every planned segment into a fresh allocator under PyTorch's default settings, where each
// request of a tile's size lands exactly on it: a large segment is allocated whole and freed, then cut from
// its low end; a small one is cut as it is made. The other segments are whole, so no request can land
// elsewhere. The gaps are freed last, merging back into the free blocks the segment had.
func build(a *allocator.Allocator, dev *traceDevice, plans []carvePlan) error {
	var gaps []uint64
	for _, p := range plans {
		if !p.seg.small {
			dev.hint = p.seg.addr
			addr, err := a.Malloc(p.seg.size, p.seg.stream)
			if err != nil || addr != p.seg.addr {
				return fmt.Errorf("replay: rebuilding the segment at %#x: got %#x (%v)", p.seg.addr, addr, err)
			}
			if err := a.Free(addr); err != nil {
				return err
			}
		}
		for _, tl := range p.tiles {
			dev.hint = p.seg.addr
			addr, err := a.Malloc(tl.size, p.seg.stream)
			if err != nil || addr != tl.addr {
				return fmt.Errorf("replay: rebuilding the block at %#x of the segment at %#x: got %#x (%v)",
					tl.addr, p.seg.addr, addr, err)
			}
			if !tl.inUse {
				gaps = append(gaps, addr)
			}
		}
		dev.hint = 0
	}
	for _, addr := range gaps {
		if err := a.Free(addr); err != nil {
			return err
		}
	}
	return nil
}
