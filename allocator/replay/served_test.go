package replay

import (
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
)

const mib = 1 << 20

// fragmentedOOM is a trace written by hand from PyTorch's allocator rules, default settings, 100 MiB for the
// allocator (snapshot's TestFragmentationAt derives it step by step): A 30 MiB and B 50 MiB get segments of
// their own; A is freed, C 12 MiB splits its segment (18 MiB left free); B is freed, D 40 MiB splits its
// segment (10 MiB left free); E 25 MiB fits no free block and its 26 MiB segment not the 20 MiB left:
// out of memory with 52 MiB allocated.
//
// Under expandable_segments:True, by the same rules: A maps two 20 MiB pages of one segment and takes its
// first 30 MiB; B grows the free 10 MiB after it by two more pages, [30, 80); freeing A leaves [0, 30) free;
// C takes [0, 12); freeing B merges [12, 80) free; D takes [12, 52); E fits in [52, 80). Served, with 80 MiB
// mapped in two map operations of two pages each.
func fragmentedOOM() *snapshot.Snapshot {
	const seg1, seg2 = 0x7f00_0000_0000, 0x7f00_1000_0000
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
	return &snapshot.Snapshot{Events: snapshot.EventsOf(evs...), Meta: snapshot.Meta{Source: "oomdbg",
		Devices: []snapshot.DeviceInfo{{Index: 0, Kind: "meta", Capacity: 100 * mib}}}}
}

func TestServeOOM(t *testing.T) {
	s := fragmentedOOM()
	expandable := allocator.Config{ExpandableSegments: true}
	got, capacity, err := ServeOOM(s, []allocator.Config{{}, expandable}, 0)
	if err != nil || capacity != 100*mib {
		t.Fatal(err, capacity)
	}
	want := []Served{
		{Settings: "", Served: false, PeakReserved: 80 * mib, DeviceAllocs: 2},
		{Settings: "expandable_segments:True", Served: true, PeakReserved: 80 * mib, DeviceAllocs: 2},
	}
	if len(got) != len(want) {
		t.Fatalf("%+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("replay %d: %+v\nwant %+v", i, got[i], want[i])
		}
	}
	// A device too small for B fails B, before the OOM.
	small, _, err := ServeOOM(s, []allocator.Config{{}}, 60*mib)
	if err != nil {
		t.Fatal(err)
	}
	if small[0].Served || !small[0].FailedEarlier {
		t.Errorf("on 60 MiB: %+v", small[0])
	}
	none, _, err := ServeOOM(&snapshot.Snapshot{Events: snapshot.EventsOf(s.Events.Slice(0, 10)...)}, []allocator.Config{expandable}, 0)
	if err != nil || none != nil {
		t.Errorf("a trace without an OOM: %v, %v", none, err)
	}
}
