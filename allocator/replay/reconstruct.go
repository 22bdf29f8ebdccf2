package replay

import (
	"fmt"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/torchrules"
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

// plan decides, for each segment alive before the trace, whether its layout when the trace began is certain,
// and if so how to carve it. The rounding rule is the recorded settings' (cfg); sizes come from the final
// state and the allocator's own rules, never from guesses.
func (t *deviceTrace) plan(cfg allocator.Config) (plans []carvePlan, unknown map[uint64]string) {
	unknown = map[uint64]string{}
	divisions := &cfg.RoundupPower2Divisions
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
			// the allocator split off the rest, which it does only for a rest over 1 MiB.
			next := seg.end()
			if i+1 < len(blocks) {
				next = blocks[i+1].addr
			}
			if next < b.addr+r || next-(b.addr+r) > allocator.SmallSize {
				why = whyBlockSize
				break
			}
			b.size = next - b.addr
		}
		if seg.expandable {
			why = whyExpandable
		}
		var p carvePlan
		if why == "" {
			p, why = carve(seg, blocks)
		}
		if why != "" {
			unknown[seg.addr] = why
			continue
		}
		plans = append(plans, p)
	}
	return plans, unknown
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
