package replay

import (
	"cmp"
	"iter"
	"slices"
	"sort"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// deviceTrace is what a replay needs of one device: the state from before the trace, the recorded allocator
// events in order, and the final state.
type deviceTrace struct {
	dev       int
	preSegs   []preSeg         // alive before the trace, by address
	preBlocks []preBlock       // in use before the trace, by address
	evs       *snapshot.Events // the snapshot's events
	seqs      []uint32         // the seqs of the device's allocator events, in order
	final     []snapshot.Segment
	maxAddr   uint64 // the highest address the recording mentions
	capacity  uint64 // the memory the recording's allocator could have, when the snapshot says (oomdbg's own)
	given     bool   // capacity is what the user gave for the device (snapshot.DeviceInfo.CapacityGiven)
}

// events returns the device's allocator events in order, with their index among them.
func (t *deviceTrace) events() iter.Seq2[int, snapshot.Event] {
	return func(yield func(int, snapshot.Event) bool) {
		for i, seq := range t.seqs {
			if !yield(i, t.evs.At(int(seq))) {
				return
			}
		}
	}
}

// requests returns the device's allocator events in order as requests, with their seqs: what the hot
// loops read, without the fields they do not.
func (t *deviceTrace) requests() iter.Seq2[int, snapshot.Request] {
	return func(yield func(int, snapshot.Request) bool) {
		for _, seq := range t.seqs {
			if !yield(int(seq), t.evs.Request(int(seq))) {
				return
			}
		}
	}
}

// preSeg is a segment alive before the trace began.
type preSeg struct {
	addr       uint64
	size       uint64
	stream     int64
	small      bool
	expandable bool
}

func (s preSeg) end() uint64 { return s.addr + s.size }

// preBlock is a block in use before the trace began.
type preBlock struct {
	addr      uint64
	requested uint64
	size      uint64 // the importer's block size
	stream    int64
	freed     bool // the trace frees it (else it is in use to the end)
}

func (b preBlock) end() uint64 { return b.addr + b.size }

// splitDevices sorts a snapshot's events by device. Events the importer added for state from before the
// trace (labelled torch.PreExistingLabel) become preSegs and preBlocks.
func splitDevices(s *snapshot.Snapshot) []*deviceTrace {
	pre := snapshot.StringID(0)
	if i := slices.Index(s.Strings, torch.PreExistingLabel); i > 0 {
		pre = snapshot.StringID(i)
	}
	byDev := map[int]*deviceTrace{}
	get := func(d int) *deviceTrace {
		t, ok := byDev[d]
		if !ok {
			t = &deviceTrace{dev: d, evs: &s.Events}
			byDev[d] = t
		}
		return t
	}
	for _, d := range s.Meta.Devices {
		if d.Capacity > d.ContextReserve && d.ContextReserve >= 0 {
			t := get(d.Index)
			t.capacity, t.given = uint64(d.Capacity-d.ContextReserve), d.CapacityGiven
		} else {
			get(d.Index)
		}
	}
	// Size each device's lists first: growing them by copying costs more than the replay itself.
	type count struct{ events, segs, blocks int }
	counts := map[int16]*count{}
	for seq := s.Events.Base(); seq < s.Events.Len(); seq++ {
		r := s.Events.Request(seq)
		c := counts[r.Device]
		if c == nil {
			c = &count{}
			counts[r.Device] = c
		}
		switch {
		case pre == 0 || r.Label != pre:
			c.events++
		case r.Action == snapshot.ActionAlloc:
			c.blocks++
		default:
			c.segs++
		}
	}
	for d, c := range counts {
		t := get(int(d))
		t.seqs = make([]uint32, 0, c.events)
		t.preSegs, t.preBlocks = make([]preSeg, 0, c.segs), make([]preBlock, 0, c.blocks)
	}
	for seq := s.Events.Base(); seq < s.Events.Len(); seq++ {
		r := s.Events.Request(seq)
		e := &r
		t := get(int(e.Device))
		if pre != 0 && e.Label == pre {
			switch e.Action {
			case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
				t.preSegs = append(t.preSegs, preSeg{addr: e.Addr, size: uint64(max(e.Size, 0)), stream: e.Stream,
					small: e.Size <= allocator.SmallBuffer, expandable: e.Action == snapshot.ActionSegmentMap})
			case snapshot.ActionAlloc:
				t.preBlocks = append(t.preBlocks, preBlock{addr: e.Addr, requested: uint64(max(e.Size, 0)),
					size: uint64(max(e.BlockSize, 0)), stream: e.Stream})
			}
			continue
		}
		switch e.Action {
		case snapshot.ActionAlloc, snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted,
			snapshot.ActionSegmentAlloc, snapshot.ActionSegmentFree, snapshot.ActionSegmentMap,
			snapshot.ActionSegmentUnmap, snapshot.ActionOOM:
			t.seqs = append(t.seqs, uint32(seq))
			if e.Action != snapshot.ActionOOM {
				t.maxAddr = max(t.maxAddr, e.Addr+uint64(max(e.Size, 0)))
			}
		}
	}
	if s.Footer != nil {
		for _, seg := range s.Footer.Segments {
			t := get(seg.Device)
			t.final = append(t.final, seg)
			t.maxAddr = max(t.maxAddr, seg.Addr+uint64(max(seg.Size, 0)))
		}
	}
	var out []*deviceTrace
	for _, t := range byDev {
		// The final state by address, which the lookups below search (a snapshot lists it so; a file need not).
		slices.SortStableFunc(t.final, func(a, b snapshot.Segment) int { return cmp.Compare(a.Addr, b.Addr) })
		slices.SortFunc(t.preSegs, func(a, b preSeg) int { return cmp.Compare(a.addr, b.addr) })
		slices.SortFunc(t.preBlocks, func(a, b preBlock) int { return cmp.Compare(a.addr, b.addr) })
		for j := range t.preSegs { // the final state names the pool, when it still holds the segment
			if i := t.finalSeg(t.preSegs[j].addr); i >= 0 {
				t.preSegs[j].small = t.final[i].Pool == allocator.PoolSmall
			}
		}
		// A block from before the trace is freed by the trace if a free reaches its address before any alloc.
		seen := map[uint64]bool{}
		for _, e := range t.requests() {
			if len(t.preBlocks) == 0 {
				break
			}
			switch e.Action {
			case snapshot.ActionAlloc:
				seen[e.Addr] = true
			case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
				if !seen[e.Addr] {
					if i, ok := t.block(e.Addr); ok {
						t.preBlocks[i].freed = true
					}
				}
				seen[e.Addr] = true
			}
		}
		for _, b := range t.preBlocks {
			t.maxAddr = max(t.maxAddr, b.end())
		}
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *deviceTrace) int { return cmp.Compare(a.dev, b.dev) })
	return out
}

// block returns the index of the pre-existing block at addr.
func (t *deviceTrace) block(addr uint64) (int, bool) {
	return slices.BinarySearchFunc(t.preBlocks, addr, func(b preBlock, a uint64) int { return cmp.Compare(b.addr, a) })
}

// finalSeg returns the index of the final segment at addr, or -1.
func (t *deviceTrace) finalSeg(addr uint64) int {
	i, ok := slices.BinarySearchFunc(t.final, addr, func(s snapshot.Segment, a uint64) int { return cmp.Compare(s.Addr, a) })
	if !ok {
		return -1
	}
	return i
}

// finalBlock returns the final state's block at addr, if it is in use: in the segment that begins last at or
// below addr (segments do not overlap; in a file where they do, that one).
func (t *deviceTrace) finalBlock(addr uint64) (snapshot.Block, bool) {
	i := sort.Search(len(t.final), func(i int) bool { return t.final[i].Addr > addr }) - 1
	if i < 0 {
		return snapshot.Block{}, false
	}
	seg := t.final[i]
	if addr >= seg.Addr+uint64(max(seg.Size, 0)) {
		return snapshot.Block{}, false
	}
	j := sort.Search(len(seg.Blocks), func(j int) bool { return seg.Blocks[j].Addr >= addr })
	if j < len(seg.Blocks) && seg.Blocks[j].Addr == addr && seg.Blocks[j].State != allocator.StateInactive {
		return seg.Blocks[j], true
	}
	return snapshot.Block{}, false
}
