package triage_test

import (
	"context"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/snapshot/torch"
	"github.com/oomdbg/oomdbg/triage"
)

const mib = 1 << 20

// handTrace is a trace derived by hand from PyTorch's allocator rules (snapshot's TestFragmentationAt walks
// it): on 100 MiB for the allocator, A 30 MiB and B 50 MiB get segments of their own; A is freed and C 12 MiB
// splits its segment, leaving 18 MiB free; B is freed and D 40 MiB splits its segment, leaving 10 MiB free;
// E 25 MiB fits neither free block, and its 26 MiB segment not the 20 MiB the device has left.
func handTrace() *snapshot.Snapshot {
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
	return &snapshot.Snapshot{Events: snapshot.EventsOf(evs...), Meta: snapshot.Meta{Source: "oomdbg",
		Devices: []snapshot.DeviceInfo{{Index: 0, Kind: "meta", Capacity: 100 * mib}}}}
}

// replays is a Replayer that answers what it is given.
type replays struct {
	r   *triage.Replays
	err error
}

func (r replays) ServeOOM(context.Context, *snapshot.Snapshot) (*triage.Replays, error) {
	return r.r, r.err
}

func TestFragmentationOOMDiagnosis(t *testing.T) {
	rp := replays{r: &triage.Replays{Note: "replayed on 100.00 MiB",
		Recorded: triage.Replayed{Settings: "", PeakReserved: 80 * mib},
		Tried: []triage.Replayed{
			{Settings: "expandable_segments:True", Served: true, PeakReserved: 80 * mib},
			{Settings: "max_split_size_mb:128", PeakReserved: 80 * mib},
		}}}
	r := triage.Analyze(context.Background(), timeline.New(handTrace()), triage.Options{Replayer: rp})
	o := r.OOM
	// By hand: 52 MiB allocated, 80 reserved, free blocks of 18 and 10 MiB; 25 MiB is at most 28 + 20.
	if o.Kind != triage.OOMFragmentation || o.Request != 25*mib || o.FreeInReserved != 28*mib || o.FreeBlocks != 2 ||
		o.LargestFreeBlock != 18*mib || o.Allocated != 52*mib || o.Reserved != 80*mib || o.Free != 20*mib {
		t.Errorf("OOM %+v", o)
	}
	want := "the 25.00 MiB request fits in none of 2 free blocks totalling 28.00 MiB (the largest is 18.00 MiB), and the device had 20.00 MiB free for a new segment of 26.00 MiB: a fragmentation OOM. 52.00 MiB allocated plus the request is 77.00 MiB, within the 100.00 MiB the allocator could have"
	if o.Diagnosis != want {
		t.Errorf("diagnosis\n%s\nwant\n%s", o.Diagnosis, want)
	}
	if kind, d := triage.DiagnoseOOM(timeline.New(handTrace()), 10); kind != o.Kind || d != o.Diagnosis {
		t.Errorf("DiagnoseOOM says %s: %s", kind, d)
	}
	if kind, d := triage.DiagnoseOOM(timeline.New(handTrace()), 9); kind != "" || d != "" {
		t.Errorf("DiagnoseOOM of an alloc says %s: %s", kind, d)
	}
	if len(o.ServedBy) != 1 || o.ServedBy[0].Settings != "expandable_segments:True" || len(o.Replays) != 3 {
		t.Errorf("served by %+v, replays %+v", o.ServedBy, o.Replays)
	}
	var text strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "expandable_segments:True would have served it; max_split_size_mb:128 would not.") {
		t.Errorf("the text report does not say which setting serves it:\n%s", text.String())
	}
	// After a fragmentation OOM the replayed settings that serve the request lead the advice; one the replay
	// showed would not serve it is no advice (the text above says it would not).
	if len(r.Advice) < 1 || r.Advice[0].Fix != "expandable_segments:True" || !r.Advice[0].Replayed || !*r.Advice[0].Fits {
		t.Errorf("advice %+v", r.Advice)
	}
	for _, a := range r.Advice {
		if a.Fix == "max_split_size_mb:128" {
			t.Errorf("advises %s, which the replay showed would not serve the request: %+v", a.Fix, a)
		}
	}

	// A replay under the recorded settings that does not fail as the recording did discredits the others.
	rp.r.Recorded.Served = true
	r = triage.Analyze(context.Background(), timeline.New(handTrace()), triage.Options{Replayer: rp})
	if r.OOM.ServedBy != nil || !strings.HasPrefix(r.OOM.ReplayNote, "not known: ") {
		t.Errorf("served by %+v, note %q", r.OOM.ServedBy, r.OOM.ReplayNote)
	}

	// 60 MiB is more than the 28 free in the segments and the 20 on the device: capacity.
	s := handTrace()
	evs := s.Events.Slice(0, s.Events.Len())
	evs[10].Size, evs[10].BlockSize = 60*mib, 60*mib
	s.Events = snapshot.EventsOf(evs...)
	if r := triage.Analyze(context.Background(), timeline.New(s), triage.Options{}); r.OOM.Kind != triage.OOMCapacity ||
		!strings.HasSuffix(r.OOM.Diagnosis, "a capacity OOM. 52.00 MiB allocated plus the request is 112.00 MiB, more than the 100.00 MiB the allocator could have") {
		t.Errorf("60 MiB: %s: %s", r.OOM.Kind, r.OOM.Diagnosis)
	}
}

func TestOOMKind(t *testing.T) {
	for _, c := range []struct {
		request, free, deviceFree int64
		kind                      string
	}{
		{25, 28, 20, triage.OOMFragmentation},
		{48, 28, 20, triage.OOMFragmentation},
		{49, 28, 20, triage.OOMCapacity},
		{10, 0, 5, triage.OOMCapacity},
	} {
		if got := triage.OOMKind(c.request, c.free, c.deviceFree); got != c.kind {
			t.Errorf("%d requested, %d free in segments, %d on the device: %s, want %s", c.request, c.free, c.deviceFree, got, c.kind)
		}
	}
}

func TestFragmentationRule(t *testing.T) {
	base := triage.Measurement{Fix: "as configured", PeakReserved: 21 << 30, OOM: true, Fragmentation: 0.215}
	ec := triage.Measurement{Fix: triage.EmptyCacheFix, PeakReserved: 20 << 30, Fragmentation: 0.094, CostSteps: 18,
		MallocsPerStep: 84.6, FreesPerStep: 84, ReleasedPerStep: 15 << 30}
	rc := triage.CheckFragmentationRule([]triage.Measurement{base, {Fix: "expandable_segments:True"}, ec})
	want := "21.5% of reserved memory was unallocated at its peak (above 20%: the rule says empty_cache); measured, empty_cache every step takes peak reserved from 21.00 GiB to 20.00 GiB and the run from out of memory to fitting; it costs 84.6 cudaMalloc and 84 cudaFree calls per step, returning 15.00 GiB per step"
	if rc == nil || !rc.Applies || rc.Verdict != want || *rc.After.MallocsPerStep != 84.6 || rc.Before.MallocsPerStep != nil {
		t.Fatalf("%+v\nwant %s", rc, want)
	}
	base.Fragmentation, base.OOM, base.CostSteps, base.MallocsPerStep = 0.12, false, 18, 0.5
	ec.OOM = true
	rc = triage.CheckFragmentationRule([]triage.Measurement{base, ec})
	if rc.Applies || !strings.Contains(rc.Verdict, "(not above 20%: the rule says nothing)") ||
		!strings.Contains(rc.Verdict, "from fitting to out of memory") || !strings.Contains(rc.Verdict, "(0.5 and 0 without)") {
		t.Errorf("%s", rc.Verdict)
	}
	if triage.CheckFragmentationRule([]triage.Measurement{base}) != nil {
		t.Error("a rule check without an empty_cache measurement")
	}
}

// TestSettingsRanked checks the measured settings lead the advice after a fragmentation OOM, ranked: those
// that fit first, by peak reserved, then by cudaMalloc calls per step.
func TestSettingsRanked(t *testing.T) {
	m := sweep{m: &triage.Measurements{Note: "n", Rows: []triage.Measurement{{Fix: "as configured", OOM: true}},
		SettingsNote: "s", Settings: []triage.Measurement{
			{Fix: "as configured", PeakReserved: 90 * mib, OOM: true},
			{Fix: "gc", PeakReserved: 99 * mib, OOM: true},
			{Fix: "empty_cache every step", PeakReserved: 70 * mib, CostSteps: 3, MallocsPerStep: 80},
			{Fix: "expandable", PeakReserved: 85 * mib, CostSteps: 3, MallocsPerStep: 0.3},
			{Fix: "sort", PeakReserved: 70 * mib, CostSteps: 3, MallocsPerStep: 0},
		}}}
	r := triage.Analyze(context.Background(), timeline.New(handTrace()), triage.Options{Measurer: m})
	var got []string
	for _, a := range r.Advice[:4] {
		got = append(got, a.Fix)
	}
	if strings.Join(got, ",") != "sort,empty_cache every step,expandable,gc" || r.Advice[0].Saving != 20*mib || *r.Advice[3].Fits {
		t.Errorf("advice %v (%+v)", got, r.Advice[0])
	}
	if r.FragmentationRule == nil || r.FragmentationRule.After.PeakReserved != 70*mib {
		t.Errorf("rule %+v", r.FragmentationRule)
	}
}

// TestAdviceLeavesOutWhatIsAlreadySet: memory reserved but unallocated at the peak suggests expandable
// segments, unless the snapshot was recorded with them: the real f7, whose allocator_settings say
// expandable_segments:True (and max_split_size_mb:128), and a hand trace with the same settings.
func TestAdviceLeavesOutWhatIsAlreadySet(t *testing.T) {
	gap := func(settings string) *snapshot.Snapshot {
		evs := []snapshot.Event{ // a 100 MiB segment holding 10 MiB: 90 MiB reserved but unallocated
			{Action: snapshot.ActionSegmentAlloc, Addr: 0x1000_0000, Size: 100 * mib},
			{Action: snapshot.ActionAlloc, Addr: 0x1000_0000, Size: 10 * mib, BlockSize: 10 * mib},
		}
		for i := range evs {
			evs[i].Seq = uint64(i)
		}
		return &snapshot.Snapshot{Events: snapshot.EventsOf(evs...), Meta: snapshot.Meta{Source: "pytorch", AllocatorSettings: settings,
			Devices: []snapshot.DeviceInfo{{Index: 0}}}}
	}
	advises := func(s *snapshot.Snapshot) bool {
		r := triage.Analyze(context.Background(), timeline.New(s), triage.Options{})
		for _, a := range r.Advice {
			if a.Fix == "expandable_segments:True" {
				return true
			}
		}
		return false
	}
	if !advises(gap("")) {
		t.Fatal("90 MiB reserved but unallocated of 100 under PyTorch's defaults: expandable segments not advised")
	}
	for _, settings := range []string{"expandable_segments:True", "expandable_segments:True,max_split_size_mb:128"} {
		if advises(gap(settings)) {
			t.Errorf("recorded with %s: advises expandable_segments:True", settings)
		}
	}
	if data := torchtest.OptionalFixture(t, torchtest.F7); data != nil {
		s, err := torch.Import(data)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(s.Meta.AllocatorSettings, "expandable_segments:True") {
			t.Fatalf("f7's settings read %q", s.Meta.AllocatorSettings)
		}
		if advises(s) {
			t.Errorf("f7, recorded with %s: advises expandable_segments:True", s.Meta.AllocatorSettings)
		}
	}
}

// TestOOMNamesFreeMemoryOnOtherStreams: by PyTorch's rules, a 40 MiB block freed on stream 1 (without
// record_stream, so at once) is cached on stream 1 and never serves stream 0; stream 0's 35 MiB request then
// meets no free block of its own stream, and the device's 20 MiB cannot hold its 36 MiB segment. The
// diagnosis names the 40 MiB cached on stream 1, which would hold it.
func TestOOMNamesFreeMemoryOnOtherStreams(t *testing.T) {
	const seg1, seg2 = 0x1000_0000, 0x2000_0000
	evs := []snapshot.Event{
		{Action: snapshot.ActionSegmentAlloc, Stream: 1, Addr: seg1, Size: 40 * mib},
		{Action: snapshot.ActionAlloc, Stream: 1, Addr: seg1, Size: 40 * mib, BlockSize: 40 * mib},
		{Action: snapshot.ActionSegmentAlloc, Addr: seg2, Size: 30 * mib},
		{Action: snapshot.ActionAlloc, Addr: seg2, Size: 30 * mib, BlockSize: 30 * mib},
		{Action: snapshot.ActionFreeRequested, Stream: 1, Addr: seg1, Size: 40 * mib, BlockSize: 40 * mib},
		{Action: snapshot.ActionFreeCompleted, Stream: 1, Addr: seg1, Size: 40 * mib, BlockSize: 40 * mib},
		{Action: snapshot.ActionOOM, Size: 35 * mib, BlockSize: 36 * mib, DeviceFree: 20 * mib},
	}
	for i := range evs {
		evs[i].Seq = uint64(i)
	}
	s := &snapshot.Snapshot{Events: snapshot.EventsOf(evs...), Meta: snapshot.Meta{Source: "oomdbg",
		Devices: []snapshot.DeviceInfo{{Index: 0, Kind: "meta", Capacity: 90 * mib}}}}
	kind, diag := triage.DiagnoseOOM(timeline.New(s), len(evs)-1)
	if kind != triage.OOMFragmentation {
		t.Errorf("kind %q: 30 MiB allocated plus 35 is within 70 reserved and 20 free", kind)
	}
	for _, want := range []string{"40.00 MiB is cached on streams other than the request's (stream 0)", "(stream 1 40.00 MiB)",
		"one there would hold the request, the largest on its own stream is 0 B"} {
		if !strings.Contains(diag, want) {
			t.Errorf("diagnosis %q lacks %q", diag, want)
		}
	}
}
