package timeline

import (
	"cmp"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// The allocator's segments at any event, replayed from the segment events and the live blocks.

// SegmentState is one allocator segment at some event: a cudaMalloc'd segment, or the mapped pages of an
// expandable segment (contiguous mappings are one SegmentState), with the blocks in it and the free gaps
// between them.
type SegmentState struct {
	Device     int16
	Stream     int64
	Addr       uint64
	Size       int64
	Expandable bool
	// Blocks are the active blocks inside the segment, by address; a block whose free was requested but has
	// not completed (PyTorch's active_pending_free) has Free set at or before the event.
	Blocks []Allocation
	// Gaps are the free ranges: inactive, cached memory.
	Gaps []Gap
}

// Gap is a free range of a segment.
type Gap struct {
	Addr uint64
	Size int64
}

// Allocated returns the bytes of the segment's blocks.
func (s *SegmentState) Allocated() int64 {
	var n int64
	for _, b := range s.Blocks {
		n += b.Size
	}
	return n
}

// segRange is a segment, or a mapped range of an expandable one.
type segRange struct {
	device     int16
	stream     int64
	addr       uint64
	size       int64
	expandable bool
}

func (r segRange) end() uint64 { return r.addr + uint64(r.size) }

func compareRange(r segRange, k liveKey) int {
	if c := cmp.Compare(r.device, k.device); c != 0 {
		return c
	}
	return cmp.Compare(r.addr, k.addr)
}

// segmentSet is the segments held at some point, by (device, address).
type segmentSet struct {
	segs []segRange
}

// apply applies a segment event and returns the change of reserved bytes. matched is false for a free or
// unmap of memory the set does not hold (reserved before the trace began).
func (ss *segmentSet) apply(e *snapshot.Event) (delta int64, matched bool) {
	size := max(e.Size, 0)
	key := liveKey{e.Device, e.Addr}
	i, found := slices.BinarySearchFunc(ss.segs, key, compareRange)
	switch e.Action {
	case snapshot.ActionSegmentAlloc:
		ss.segs = slices.Insert(ss.segs, i, segRange{device: e.Device, stream: e.Stream, addr: e.Addr, size: size})
		return size, true
	case snapshot.ActionSegmentMap:
		// Pages mapped right after a mapped range extend it.
		if i > 0 {
			if p := &ss.segs[i-1]; p.expandable && p.device == e.Device && p.end() == e.Addr {
				p.size += size
				return size, true
			}
		}
		ss.segs = slices.Insert(ss.segs, i, segRange{device: e.Device, stream: e.Stream, addr: e.Addr, size: size, expandable: true})
		return size, true
	case snapshot.ActionSegmentFree:
		if !found {
			return 0, false
		}
		size = ss.segs[i].size
		ss.segs = slices.Delete(ss.segs, i, i+1)
		return -size, true
	case snapshot.ActionSegmentUnmap:
		return ss.unmap(e.Device, e.Addr, e.Addr+uint64(size))
	}
	return 0, true
}

// unmap cuts [lo, hi) out of the ranges of device and returns minus the bytes cut. Unmaps are rare: a scan
// is simpler than a search that would have to allow for overlapping ranges in a hostile file.
func (ss *segmentSet) unmap(device int16, lo, hi uint64) (int64, bool) {
	var cut int64
	for i := 0; i < len(ss.segs); i++ {
		r := ss.segs[i]
		a, b := max(r.addr, lo), min(r.end(), hi)
		if r.device != device || a >= b {
			continue
		}
		cut += int64(b - a)
		var keep []segRange
		if r.addr < a {
			left := r
			left.size = int64(a - r.addr)
			keep = append(keep, left)
		}
		if b < r.end() {
			right := r
			right.addr, right.size = b, int64(r.end()-b)
			keep = append(keep, right)
		}
		ss.segs = slices.Replace(ss.segs, i, i+1, keep...)
		i += len(keep) - 1
	}
	return -cut, cut > 0
}

// SegmentsAt returns the allocator's segments after event seq, by device and address, each with its active
// blocks and free gaps. A snapshot without segment events (many imported traces) has none.
func (t *Timeline) SegmentsAt(seq int) []SegmentState {
	if seq < t.base || len(t.segEvents) == 0 && len(t.startSegs) == 0 {
		return nil
	}
	ss := segmentSet{segs: slices.Clone(t.startSegs)}
	for _, s := range t.segEvents {
		if int(s) > seq {
			break
		}
		e := t.s.Events.At(int(s))
		ss.apply(&e)
	}
	if len(ss.segs) == 0 {
		return nil
	}
	blocks := t.ActiveAt(seq, nil)
	slices.SortFunc(blocks, func(a, b Allocation) int {
		if c := cmp.Compare(a.Device, b.Device); c != 0 {
			return c
		}
		return cmp.Compare(a.Addr, b.Addr)
	})
	out := make([]SegmentState, len(ss.segs))
	for i, r := range ss.segs {
		out[i] = SegmentState{Device: r.device, Stream: r.stream, Addr: r.addr, Size: r.size, Expandable: r.expandable}
	}
	for _, b := range blocks {
		i, found := slices.BinarySearchFunc(ss.segs, liveKey{b.Device, b.Addr}, compareRange)
		if !found {
			i-- // the segment starting before the block
		}
		if i < 0 || ss.segs[i].device != b.Device || b.Addr >= ss.segs[i].end() {
			continue // a block in memory reserved before the trace began
		}
		out[i].Blocks = append(out[i].Blocks, b)
	}
	for i := range out {
		s := &out[i]
		at := s.Addr
		for _, b := range s.Blocks {
			if b.Addr > at {
				s.Gaps = append(s.Gaps, Gap{Addr: at, Size: int64(b.Addr - at)})
			}
			at = max(at, b.Addr+uint64(b.Size))
		}
		if end := s.Addr + uint64(s.Size); at < end {
			s.Gaps = append(s.Gaps, Gap{Addr: at, Size: int64(end - at)})
		}
	}
	return out
}
