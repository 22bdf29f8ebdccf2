package timeline_test

import (
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

const mib = int64(1 << 20)

// fragmentedTrace is a trace written by hand from PyTorch's allocator rules (docs/allocator.md), default
// settings, 100 MiB for the allocator:
//
//	A 30 MiB: no cached block; a request of 10 MiB or more gets a segment of its size rounded to 2 MiB: 30 MiB
//	B 50 MiB: a 50 MiB segment
//	free A: its segment is cached whole
//	C 12 MiB: best fit is A's 30 MiB block; the 18 MiB left is more than 1 MiB, so it is split off
//	free B: cached whole
//	D 40 MiB: best fit is B's 50 MiB block, split: 10 MiB left
//	E 25 MiB: no free block holds 25 MiB (18 and 10); a 26 MiB segment does not fit the 20 MiB the device has
//	          left; both segments hold a block, so the retry frees nothing: out of memory, although 52 MiB
//	          allocated plus the 25 MiB asked for is less than 100 MiB.
func fragmentedTrace() *snapshot.Snapshot {
	const seg1, seg2 = 0x1000_0000, 0x2000_0000
	evs := []snapshot.Event{
		{Action: snapshot.ActionSegmentAlloc, Addr: seg1, Size: 30 * mib},
		{Action: snapshot.ActionAlloc, Addr: seg1, Size: 30 * mib, BlockSize: 30 * mib},
		{Action: snapshot.ActionSegmentAlloc, Addr: seg2, Size: 50 * mib},
		{Action: snapshot.ActionAlloc, Addr: seg2, Size: 50 * mib, BlockSize: 50 * mib},
		{Action: snapshot.ActionFreeRequested, Addr: seg1, Size: 30 * mib, BlockSize: 30 * mib},
		{Action: snapshot.ActionFreeCompleted, Addr: seg1, Size: 30 * mib, BlockSize: 30 * mib},
		{Action: snapshot.ActionAlloc, Addr: seg1, Size: 12 * mib, BlockSize: 12 * mib},
		{Action: snapshot.ActionFreeRequested, Addr: seg2, Size: 50 * mib, BlockSize: 50 * mib},
		{Action: snapshot.ActionFreeCompleted, Addr: seg2, Size: 50 * mib, BlockSize: 50 * mib},
		{Action: snapshot.ActionAlloc, Addr: seg2, Size: 40 * mib, BlockSize: 40 * mib},
		{Action: snapshot.ActionOOM, Size: 25 * mib, BlockSize: 26 * mib, DeviceFree: 20 * mib},
	}
	for i := range evs {
		evs[i].Seq = uint64(i)
	}
	return &snapshot.Snapshot{Events: snapshot.EventsOf(evs...)}
}

func TestUnallocated(t *testing.T) {
	tl := timeline.New(fragmentedTrace())
	// Reserved minus allocated after each event; a new segment counts with the block after it.
	want := []int64{0, 0, 0, 0, 30 * mib, 30 * mib, 18 * mib, 68 * mib, 68 * mib, 28 * mib, 28 * mib}
	var got []int64
	for i := range tl.Len() {
		got = append(got, tl.Unallocated(i))
	}
	if !slices.Equal(got, want) {
		t.Errorf("unallocated %v\nwant        %v", got, want)
	}
	if cols := tl.UnallocatedColumns(0, tl.Len(), make([]int64, tl.Len())); !slices.Equal(cols, want) {
		t.Errorf("one column an event: %v", cols)
	}
	if cols := tl.UnallocatedColumns(0, tl.Len(), make([]int64, 2)); !slices.Equal(cols, []int64{30 * mib, 68 * mib}) {
		t.Errorf("two columns (events 0-4, 5-10): %v", cols)
	}
	if cols := tl.UnallocatedColumns(4, 7, make([]int64, 4)); !slices.Equal(cols, []int64{30 * mib, 30 * mib, 30 * mib, 18 * mib}) {
		t.Errorf("four columns of three events repeat the events under them: %v", cols)
	}
	if cols := tl.UnallocatedColumns(7, 7, make([]int64, 2)); !slices.Equal(cols, []int64{-1, -1}) {
		t.Errorf("columns of no events: %v", cols)
	}
	for _, r := range [][3]int64{{0, 1, 0}, {2, 3, 0}, {0, 11, 68 * mib}, {9, 11, 28 * mib}, {4, 7, 30 * mib}, {5, 5, 0}} {
		if got := tl.UnallocatedMax(int(r[0]), int(r[1])); got != r[2] {
			t.Errorf("UnallocatedMax(%d, %d) = %d MiB, want %d", r[0], r[1], got/mib, r[2]/mib)
		}
	}
	// Against a plain scan over every range of the trace.
	for from := range tl.Len() {
		for to := from + 1; to <= tl.Len(); to++ {
			var m int64
			for i := from; i < to; i++ {
				m = max(m, tl.Unallocated(i))
			}
			if got := tl.UnallocatedMax(from, to); got != m {
				t.Errorf("UnallocatedMax(%d, %d) = %d, a scan finds %d", from, to, got, m)
			}
		}
	}
}

func TestFragmentationAt(t *testing.T) {
	tl := timeline.New(fragmentedTrace())
	oom := tl.OOMs()[0]
	f := tl.FragmentationAt(oom, 0, "large")
	want := timeline.Fragmentation{Segments: 2, Reserved: 80 * mib, Allocated: 52 * mib, Free: 28 * mib, FreeBlocks: 2,
		Largest: 18 * mib, Split: 28 * mib}
	if f != want {
		t.Errorf("at the OOM: %+v\nwant %+v", f, want)
	}
	if f.Fits(25*mib) || !f.Fits(18*mib) {
		t.Error("Fits disagrees with the largest free block")
	}
	if r := f.Ratio(); r != 28.0/80 {
		t.Errorf("ratio %v, want 0.35", r)
	}
	if small := tl.FragmentationAt(oom, 0, "small"); small != (timeline.Fragmentation{}) {
		t.Errorf("no segment is small: %+v", small)
	}
	// After A is freed (event 5), its segment is whole and free: no block in use, so nothing is split.
	if f := tl.FragmentationAt(5, 0, ""); f.Free != 30*mib || f.Split != 0 || f.FreeBlocks != 1 {
		t.Errorf("after freeing A: %+v", f)
	}
}

func TestSegmentPool(t *testing.T) {
	cases := []struct {
		seg  timeline.SegmentState
		pool string
	}{
		{timeline.SegmentState{Size: 2 * mib, Blocks: []timeline.Allocation{{Size: 512}}}, "small"},
		{timeline.SegmentState{Size: 2 * mib}, "small"},
		{timeline.SegmentState{Size: 20 * mib}, "large"},
		{timeline.SegmentState{Size: 20 * mib, Blocks: []timeline.Allocation{{Size: 1<<20 + 512}}}, "large"},
		{timeline.SegmentState{Size: 20 * mib, Expandable: true, Blocks: []timeline.Allocation{{Size: 1 << 20}}}, "small"},
		{timeline.SegmentState{Size: 6 * mib, Expandable: true}, "small"},
		{timeline.SegmentState{Size: 40 * mib, Expandable: true}, "large"},
	}
	for _, c := range cases {
		if got := c.seg.Pool(); got != c.pool {
			t.Errorf("%+v: %s, want %s", c.seg, got, c.pool)
		}
	}
}
