package snapshot_test

import (
	"bytes"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

// testMeta is the metadata of hand-built test snapshots.
func testMeta() snapshot.Meta {
	return snapshot.Meta{
		Tool: "oomdbg", ToolVersion: "test", Created: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC),
		Host: "test", Source: "oomdbg", TimeUnit: "ns", AllocatorSettings: "expandable_segments:False",
		Devices: []snapshot.DeviceInfo{{Index: 0, Name: "meta", Kind: "meta", Capacity: 24 << 30, ContextReserve: 512 << 20}},
	}
}

// testFooter is a footer with every field set.
func testFooter(events uint64) *snapshot.Footer {
	return &snapshot.Footer{
		Summary: snapshot.Summary{Events: events, ByAction: map[string]uint64{"alloc": 3}, PeakAllocated: 1 << 30,
			PeakAllocatedSeq: 2, PeakReserved: 2 << 30, EndTime: 123456789},
		Segments: []snapshot.Segment{{Device: 0, Stream: 7, Addr: 0x7f0000000000, Size: 2 << 20, Pool: "small",
			Blocks: []snapshot.Block{{Addr: 0x7f0000000000, Size: 512, Requested: 4, State: "active_allocated"}}}},
	}
}

// script builds events through a Sink, interning what they refer to. Write assigns Seq; the returned events
// are what a reader must give back.
type script func(s snapshottest.Sink) []snapshot.Event

// encode runs sc through a Writer and returns the file and the events as written.
func encode(t testing.TB, sc script, footer *snapshot.Footer, opts ...snapshot.WriterOption) ([]byte, []snapshot.Event) {
	t.Helper()
	var buf bytes.Buffer
	w, err := snapshot.NewWriter(&buf, testMeta(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	events := sc(w)
	if err := w.Close(footer); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), events
}

// emit writes e to s, failing the script on error, and returns it with its Seq.
func emit(s snapshottest.Sink, e snapshot.Event) snapshot.Event {
	if err := s.Write(&e); err != nil {
		panic(err)
	}
	return e
}

// everyAction writes one or more events of every action with typical fields.
func everyAction(s snapshottest.Sink) []snapshot.Event {
	fn := s.InternFrame("github.com/oomdbg/oomdbg/workloads/nn.(*Linear).Forward", "workloads/nn/linear.go", 44)
	fn2 := s.InternFrame("github.com/oomdbg/oomdbg/workloads/tensor.MatMul", "workloads/tensor/linalg.go", 87)
	stack := s.InternStack([]snapshot.FrameID{fn2, fn})
	free := s.InternStack([]snapshot.FrameID{fn})
	scope := s.InternString("blocks.0.attn.qkv")
	label := s.InternString("f32[8,1024,2304] qkv.out")
	seg := uint64(0x7f3a_0000_0000)
	var ev []snapshot.Event
	phase, iter := snapshot.PhaseSetup, int32(-1)
	add := func(e snapshot.Event) {
		switch e.Action {
		case snapshot.ActionPhase:
			phase, iter = e.Phase, e.Iteration
		case snapshot.ActionIteration:
			iter = e.Iteration
		}
		e.Phase, e.Iteration = phase, iter
		ev = append(ev, emit(s, e))
	}
	add(snapshot.Event{Time: 10, Action: snapshot.ActionPhase, Phase: snapshot.PhaseSetup, Iteration: -1})
	add(snapshot.Event{Time: 20, Action: snapshot.ActionSegmentAlloc, Addr: seg, Size: 20 << 20, Stack: stack})
	add(snapshot.Event{Time: 25, Action: snapshot.ActionSegmentMap, Addr: seg + 20<<20, Size: 2 << 20, Stack: stack})
	add(snapshot.Event{Time: 30, Action: snapshot.ActionAlloc, Addr: seg, Size: 8 * 1024 * 2304 * 4, BlockSize: 8 * 1024 * 2304 * 4,
		Category: snapshot.CategoryTemporary, Scope: scope, Label: label, Stack: stack})
	add(snapshot.Event{Time: 31, Action: snapshot.ActionAlloc, Addr: seg + 8*1024*2304*4, Size: 4, BlockSize: 512,
		Category: snapshot.CategoryTemporary, Scope: scope, Label: label, Stack: stack})
	add(snapshot.Event{Time: 35, Action: snapshot.ActionCategory, Addr: seg, Size: 8 * 1024 * 2304 * 4, BlockSize: 8 * 1024 * 2304 * 4,
		Category: snapshot.CategoryActivation, Scope: scope, Label: label, Stack: stack})
	add(snapshot.Event{Time: 40, Action: snapshot.ActionIteration, Iteration: 0})
	add(snapshot.Event{Time: 41, Action: snapshot.ActionPhase, Phase: snapshot.PhaseForward, Iteration: 0})
	add(snapshot.Event{Time: 50, Action: snapshot.ActionFreeRequested, Addr: seg + 8*1024*2304*4, Size: 4, BlockSize: 512,
		Phase: snapshot.PhaseForward, Category: snapshot.CategoryTemporary, Scope: scope, Label: label, Stack: free})
	add(snapshot.Event{Time: 51, Action: snapshot.ActionFreeCompleted, Addr: seg + 8*1024*2304*4, Size: 4, BlockSize: 512,
		Phase: snapshot.PhaseForward, Category: snapshot.CategoryTemporary, Scope: scope, Label: label, Stack: free})
	add(snapshot.Event{Time: 60, Action: snapshot.ActionOOM, Size: 40 << 30, BlockSize: 40 << 30, DeviceFree: 3 << 30,
		Phase: snapshot.PhaseForward, Stack: stack})
	add(snapshot.Event{Time: 70, Action: snapshot.ActionAnnotation, Phase: snapshot.PhaseForward, Text: s.InternString("user marker")})
	add(snapshot.Event{Time: 80, Action: snapshot.ActionSample, Phase: snapshot.PhaseForward, Size: 3 << 30, Text: s.InternString("nvml.used")})
	add(snapshot.Event{Time: 90, Action: snapshot.ActionHeapDump, Phase: snapshot.PhaseForward, Text: s.InternString("iteration end")})
	add(snapshot.Event{Time: 91, Action: snapshot.ActionRetain, Phase: snapshot.PhaseForward, Addr: seg, Holder: 1, Parent: 0,
		Text: s.InternString("AddmmBackward[blocks.0.attn.qkv] saved input")})
	add(snapshot.Event{Time: 92, Action: snapshot.ActionRetain, Phase: snapshot.PhaseForward, Addr: seg, Holder: 2, Parent: 1,
		Text: s.InternString("loss_history[7]")})
	add(snapshot.Event{Time: 95, Action: snapshot.ActionSnapshot, Phase: snapshot.PhaseForward, Size: 99})
	add(snapshot.Event{Time: 96, Action: snapshot.ActionSegmentUnmap, Phase: snapshot.PhaseForward, Addr: seg + 20<<20, Size: 2 << 20})
	add(snapshot.Event{Time: 97, Action: snapshot.ActionFreeRequested, Addr: seg, Size: 8 * 1024 * 2304 * 4, BlockSize: 8 * 1024 * 2304 * 4,
		Phase: snapshot.PhaseForward, Category: snapshot.CategoryActivation, Scope: scope, Label: label, Stack: stack})
	add(snapshot.Event{Time: 98, Action: snapshot.ActionFreeCompleted, Addr: seg, Size: 8 * 1024 * 2304 * 4, BlockSize: 8 * 1024 * 2304 * 4,
		Phase: snapshot.PhaseForward, Category: snapshot.CategoryActivation, Scope: scope, Label: label, Stack: stack})
	add(snapshot.Event{Time: 99, Action: snapshot.ActionSegmentFree, Phase: snapshot.PhaseForward, Addr: seg, Size: 20 << 20})
	return ev
}

// extremes writes events with every field at the edges of its type.
func extremes(s snapshottest.Sink) []snapshot.Event {
	long := s.InternString(string(bytes.Repeat([]byte("x"), 1000)))
	uni := s.InternString("héllo, 世界 🚀")
	f := s.InternFrame("fn", "file.go", math.MaxInt32)
	g := s.InternFrame("", "", math.MinInt32)
	deep := make([]snapshot.FrameID, 200)
	for i := range deep {
		deep[i] = []snapshot.FrameID{f, g}[i%2]
	}
	stack := s.InternStack(deep)
	var ev []snapshot.Event
	for i, e := range []snapshot.Event{
		{Time: math.MaxInt64, Action: snapshot.ActionAlloc, Addr: math.MaxUint64, Size: math.MaxInt64, BlockSize: math.MinInt64},
		{Time: math.MinInt64, Action: snapshot.ActionAlloc, Addr: 0, Size: math.MinInt64, BlockSize: math.MaxInt64},
		{Time: 0, Action: snapshot.ActionFreeRequested, Addr: math.MaxUint64, Size: -1, BlockSize: -1, Device: math.MaxInt16, Stream: math.MinInt64},
		{Time: -1, Action: snapshot.ActionFreeCompleted, Addr: 1 << 63, Device: math.MinInt16, Stream: math.MaxInt64, Iteration: math.MinInt32},
		{Time: 1, Action: snapshot.ActionOOM, Size: math.MaxInt64, BlockSize: math.MaxInt64, DeviceFree: math.MinInt64, Iteration: math.MaxInt32},
		{Time: 2, Action: snapshot.ActionRetain, Addr: math.MaxUint64, Holder: math.MaxUint64, Parent: 1 << 63, Text: long},
		{Time: 3, Action: snapshot.ActionRetain, Addr: 0, Holder: 0, Parent: math.MaxUint64, Text: uni},
		{Time: 4, Action: snapshot.ActionCategory, Addr: math.MaxUint64, Category: snapshot.CategoryAMPCache, Scope: long, Label: uni, Stack: stack},
		{Time: 5, Action: snapshot.ActionPhase, Phase: snapshot.PhaseEval, Iteration: -1, Device: -1, Stream: -1},
		{Time: 6, Action: snapshot.ActionSample, Size: math.MinInt64, DeviceFree: math.MaxInt64, Device: 1, Stream: 0x7f00_dead_beef},
		{Time: 6, Action: snapshot.ActionSnapshot, Size: 1},
	} {
		e.Seq = uint64(1000 + i) // Write overwrites whatever the caller put there
		ev = append(ev, emit(s, e))
	}
	return ev
}

// random writes n events with random fields, reusing earlier addresses the way frees and category changes
// do, so every address mode and every field flag is exercised.
func random(seed uint64, n int) script {
	return func(s snapshottest.Sink) []snapshot.Event {
		rng := rand.New(rand.NewPCG(seed, 1))
		var strs []snapshot.StringID
		for i := range 50 {
			strs = append(strs, s.InternString("s"+string(rune('a'+i%26))+string(rune('A'+i/26))))
		}
		var frames []snapshot.FrameID
		for i := range 20 {
			frames = append(frames, s.InternFrame("fn", "file", i))
		}
		var stacks []snapshot.StackID
		for i := range 15 {
			stacks = append(stacks, s.InternStack(frames[i:i+1+i%5]))
		}
		pick := func(ids []snapshot.StringID) snapshot.StringID {
			if rng.IntN(4) == 0 {
				return 0
			}
			return ids[rng.IntN(len(ids))]
		}
		var addrs []uint64
		var ev []snapshot.Event
		var t int64
		for range n {
			t += rng.Int64N(100000) - 1000
			e := snapshot.Event{
				Time:      t,
				Action:    snapshot.Action(1 + rng.IntN(snapshot.NumActions-1)),
				Phase:     snapshot.Phase(rng.IntN(snapshot.NumPhases)),
				Iteration: int32(rng.IntN(5)) - 1,
				Category:  snapshot.Category(rng.IntN(snapshot.NumCategories)),
				Scope:     pick(strs),
				Label:     pick(strs),
				Text:      pick(strs),
				Stack:     stacks[rng.IntN(len(stacks))],
				Size:      rng.Int64N(1 << 30),
			}
			e.BlockSize = (e.Size + 511) &^ 511
			if rng.IntN(5) == 0 {
				e.BlockSize += 512 * rng.Int64N(4)
			}
			switch {
			case len(addrs) > 0 && rng.IntN(2) == 0:
				e.Addr = addrs[rng.IntN(len(addrs))]
			default:
				e.Addr = rng.Uint64()
			}
			if rng.IntN(20) == 0 {
				e.Device, e.Stream = int16(rng.IntN(3)), rng.Int64()
			}
			if rng.IntN(10) == 0 {
				e.DeviceFree = rng.Int64()
			}
			if rng.IntN(8) == 0 {
				e.Holder, e.Parent = rng.Uint64N(100), rng.Uint64N(100)
			}
			if e.Action == snapshot.ActionAlloc {
				addrs = append(addrs, e.Addr)
			}
			ev = append(ev, emit(s, e))
		}
		return ev
	}
}

// manyBlocks allocates more blocks than the alloc ring holds, at distinct addresses, and frees them all,
// newest first: frees beyond the ring's reach must fall back to explicit addresses.
func manyBlocks(s snapshottest.Sink) []snapshot.Event {
	const n = 40000
	var ev []snapshot.Event
	for i := range n {
		ev = append(ev, emit(s, snapshot.Event{Time: int64(i), Action: snapshot.ActionAlloc, Addr: 0x7f00_0000_0000 + uint64(i)*4096*3, Size: 4096, BlockSize: 4096}))
	}
	for i := n - 1; i >= 0; i-- {
		ev = append(ev, emit(s, snapshot.Event{Time: int64(2*n - i), Action: snapshot.ActionFreeRequested, Addr: 0x7f00_0000_0000 + uint64(i)*4096*3, Size: 4096, BlockSize: 4096}))
	}
	return ev
}

// readAll reads data with Next, checking that it agrees with ReadChunk and Read.
func readAll(t testing.TB, data []byte, opts ...snapshot.ReaderOption) *snapshot.Snapshot {
	t.Helper()
	s, err := snapshot.Read(bytes.NewReader(data), opts...)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	r, err := snapshot.NewReader(bytes.NewReader(data), opts...)
	if err != nil {
		t.Fatalf("NewReader: %v", err)
	}
	var next []snapshot.Event
	for {
		e, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		next = append(next, e)
	}
	if got := s.Events.Slice(0, s.Events.Len()); !reflect.DeepEqual(next, got) && len(next)+len(got) > 0 {
		t.Fatalf("Next and Read disagree: %d and %d events", len(next), s.Events.Len())
	}
	return s
}

// sameEvents fails unless got equals want, naming the first difference.
func sameEvents(t testing.TB, got snapshot.Events, want []snapshot.Event) {
	t.Helper()
	for i, e := range got.Range(0, len(want)) {
		if e != want[i] {
			t.Fatalf("event %d:\n got %+v\nwant %+v", i, e, want[i])
		}
	}
	if got.Len() != len(want) {
		t.Fatalf("got %d events, want %d", got.Len(), len(want))
	}
}
