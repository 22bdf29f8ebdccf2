package tracer_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tracer"
)

// memSink is an in-memory Sink that keeps everything, for checking what a Recorder produced.
type memSink struct {
	strings   []string
	stringIDs map[string]snapshot.StringID
	frames    []frame
	frameIDs  map[frame]snapshot.FrameID
	stacks    [][]snapshot.FrameID
	stackIDs  map[string]snapshot.StackID
	events    []snapshot.Event
	footer    *snapshot.Footer
	closed    bool
	failAt    int // Write fails from the failAt-th event on (1-based); 0 never
}

type frame struct {
	function, file string
	line           int
}

func newMemSink() *memSink {
	return &memSink{
		strings:   []string{""},
		stringIDs: map[string]snapshot.StringID{"": 0},
		frames:    []frame{{}},
		frameIDs:  map[frame]snapshot.FrameID{},
		stacks:    [][]snapshot.FrameID{nil},
		stackIDs:  map[string]snapshot.StackID{"": 0},
	}
}

func (s *memSink) InternString(str string) snapshot.StringID {
	if id, ok := s.stringIDs[str]; ok {
		return id
	}
	id := snapshot.StringID(len(s.strings))
	s.strings = append(s.strings, str)
	s.stringIDs[str] = id
	return id
}

func (s *memSink) InternFrame(function, file string, line int) snapshot.FrameID {
	f := frame{function, file, line}
	if id, ok := s.frameIDs[f]; ok {
		return id
	}
	id := snapshot.FrameID(len(s.frames))
	s.frames = append(s.frames, f)
	s.frameIDs[f] = id
	return id
}

func (s *memSink) InternStack(frames []snapshot.FrameID) snapshot.StackID {
	key := fmt.Sprint(frames)
	if len(frames) == 0 {
		key = ""
	}
	if id, ok := s.stackIDs[key]; ok {
		return id
	}
	id := snapshot.StackID(len(s.stacks))
	s.stacks = append(s.stacks, append([]snapshot.FrameID(nil), frames...))
	s.stackIDs[key] = id
	return id
}

var errDiskFull = errors.New("disk full")

func (s *memSink) Write(e *snapshot.Event) error {
	if s.failAt > 0 && len(s.events)+1 >= s.failAt {
		return errDiskFull
	}
	e.Seq = uint64(len(s.events))
	s.events = append(s.events, *e)
	return nil
}

func (s *memSink) Flush() error { return nil }

func (s *memSink) Close(f *snapshot.Footer) error {
	s.footer, s.closed = f, true
	return nil
}

// stackOf returns the frames of a stack, innermost first.
func (s *memSink) stackOf(id snapshot.StackID) []frame {
	var fs []frame
	for _, f := range s.stacks[id] {
		fs = append(fs, s.frames[f])
	}
	return fs
}

// clock returns a fake clock that advances 1 µs per reading.
func clock() func() int64 {
	var t int64
	return func() int64 { t += 1000; return t }
}

// fakeAllocator stands for the allocator model: its frames are skipped like the real one's.
type fakeAllocator struct{ r *tracer.Recorder }

const fakeAllocatorFrames = "github.com/oomdbg/oomdbg/tracer_test.(*fakeAllocator)."

//go:noinline
func (a *fakeAllocator) malloc(addr, size uint64) { a.allocFoundBlock(addr, size) }

//go:noinline
func (a *fakeAllocator) allocFoundBlock(addr, size uint64) {
	a.r.Alloc(0, 0, addr, size, (size+511)/512*512)
}

// allocSite is a workload call site; it returns the line of its call into the allocator.
//
//go:noinline
func allocSite(a *fakeAllocator, addr uint64) int {
	_, _, line, _ := runtime.Caller(0)
	a.malloc(addr, 1000) // must stay on the line after runtime.Caller
	return line + 1
}

//go:noinline
func otherSite(a *fakeAllocator, addr uint64) { a.malloc(addr, 2000) }

func TestStackNamesTheCallerNotTheAllocator(t *testing.T) {
	sink := newMemSink()
	r := tracer.New(sink, tracer.WithClock(clock()), tracer.WithSkippedFrames(fakeAllocatorFrames))
	a := &fakeAllocator{r}
	line := allocSite(a, 0x1000)

	if len(sink.events) != 1 {
		t.Fatalf("%d events, want 1", len(sink.events))
	}
	frames := sink.stackOf(sink.events[0].Stack)
	if len(frames) < 2 {
		t.Fatalf("stack %v has fewer than 2 frames", frames)
	}
	top := frames[0]
	if !strings.HasSuffix(top.function, "tracer_test.allocSite") || !strings.HasSuffix(top.file, "recorder_test.go") || top.line != line {
		t.Errorf("innermost frame %+v, want allocSite at recorder_test.go:%d", top, line)
	}
	if !strings.HasSuffix(frames[1].function, "TestStackNamesTheCallerNotTheAllocator") {
		t.Errorf("second frame %+v, want the test function", frames[1])
	}
	for _, f := range frames {
		for _, skipped := range []string{"runtime.", "github.com/oomdbg/oomdbg/tracer.", fakeAllocatorFrames} {
			if strings.HasPrefix(f.function, skipped) {
				t.Errorf("frame %s should have been skipped", f.function)
			}
		}
	}
}

func TestStacksAreInternedOncePerCallSite(t *testing.T) {
	sink := newMemSink()
	r := tracer.New(sink, tracer.WithClock(clock()), tracer.WithSkippedFrames(fakeAllocatorFrames))
	a := &fakeAllocator{r}
	for i := range 100 {
		allocSite(a, uint64(i))
		otherSite(a, uint64(i))
	}
	if got := len(sink.stacks) - 1; got != 2 {
		t.Fatalf("%d distinct stacks from two call sites, want 2", got)
	}
	first, second := sink.events[0].Stack, sink.events[1].Stack
	if first == second {
		t.Fatal("two call sites share a stack ID")
	}
	for i, e := range sink.events {
		want := first
		if i%2 == 1 {
			want = second
		}
		if e.Stack != want {
			t.Fatalf("event %d has stack %d, want %d", i, e.Stack, want)
		}
	}
}

func TestRepeatedStackDoesNotAllocate(t *testing.T) {
	r := tracer.New(discardSink{}, tracer.WithClock(clock()))
	allocs := testing.AllocsPerRun(1000, func() {
		r.TagNextAlloc(snapshot.CategoryActivation, "f32[8,1024,768] fc.out")
		r.Alloc(0, 0, 0x7f0000000000, 25165824, 25165824)
		r.FreeRequested(0, 0, 0x7f0000000000, 25165824, 25165824)
	})
	if allocs != 0 {
		t.Errorf("recording a known stack allocates %.1f times per event pair, want 0", allocs)
	}
}

func TestEventsCarryTheRuntimeTags(t *testing.T) {
	sink := newMemSink()
	r := tracer.New(sink, tracer.WithClock(clock()), tracer.WithStackDepth(0))

	r.Alloc(0, 0, 0x100, 4096, 4096) // setup, iteration -1, no scope
	r.BeginIteration(3)
	r.SetPhase(snapshot.PhaseForward)
	r.PushScope("blocks.0")
	r.PushScope("blocks.0.attn.qkv")
	r.TagNextAlloc(snapshot.CategoryTemporary, "f32[8,1024,2304] qkv.out")
	r.Alloc(0, 7, 0x200, 75497472, 75497472)
	r.SetCategory(0, 0x200, snapshot.CategoryActivation, "")
	r.PopScope()
	r.Alloc(0, 0, 0x300, 100, 512) // tags were for one allocation only
	r.SetPhase(snapshot.PhaseBackward)
	r.FreeRequested(0, 7, 0x200, 75497472, 75497472)
	r.FreeCompleted(0, 7, 0x200, 75497472, 75497472)
	r.Annotate("checkpoint saved")
	r.Sample(0, "nvml.used", 1<<30)
	r.OOM(0, 0, 1<<31, 1<<31, 1<<20)

	str := func(id snapshot.StringID) string { return sink.strings[id] }
	type want struct {
		action    snapshot.Action
		phase     snapshot.Phase
		iteration int32
		scope     string
		category  snapshot.Category
		label     string
		text      string
		stream    int64
	}
	wants := []want{
		{action: snapshot.ActionAlloc, phase: snapshot.PhaseSetup, iteration: -1},
		{action: snapshot.ActionIteration, phase: snapshot.PhaseSetup, iteration: 3},
		{action: snapshot.ActionPhase, phase: snapshot.PhaseForward, iteration: 3},
		{action: snapshot.ActionAlloc, phase: snapshot.PhaseForward, iteration: 3, scope: "blocks.0.attn.qkv",
			category: snapshot.CategoryTemporary, label: "f32[8,1024,2304] qkv.out", stream: 7},
		{action: snapshot.ActionCategory, phase: snapshot.PhaseForward, iteration: 3, scope: "blocks.0.attn.qkv",
			category: snapshot.CategoryActivation},
		{action: snapshot.ActionAlloc, phase: snapshot.PhaseForward, iteration: 3, scope: "blocks.0"},
		{action: snapshot.ActionPhase, phase: snapshot.PhaseBackward, iteration: 3, scope: "blocks.0"},
		{action: snapshot.ActionFreeRequested, phase: snapshot.PhaseBackward, iteration: 3, scope: "blocks.0", stream: 7},
		{action: snapshot.ActionFreeCompleted, phase: snapshot.PhaseBackward, iteration: 3, scope: "blocks.0", stream: 7},
		{action: snapshot.ActionAnnotation, phase: snapshot.PhaseBackward, iteration: 3, scope: "blocks.0", text: "checkpoint saved"},
		{action: snapshot.ActionSample, phase: snapshot.PhaseBackward, iteration: 3, scope: "blocks.0", text: "nvml.used"},
		{action: snapshot.ActionOOM, phase: snapshot.PhaseBackward, iteration: 3, scope: "blocks.0"},
	}
	if len(sink.events) != len(wants) {
		t.Fatalf("%d events, want %d", len(sink.events), len(wants))
	}
	var lastTime int64
	for i, w := range wants {
		e := sink.events[i]
		got := want{e.Action, e.Phase, e.Iteration, str(e.Scope), e.Category, str(e.Label), str(e.Text), e.Stream}
		if got != w {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, got, w)
		}
		if e.Time <= lastTime {
			t.Errorf("event %d: time %d does not advance past %d", i, e.Time, lastTime)
		}
		lastTime = e.Time
	}
	if e := sink.events[10]; e.Size != 1<<30 {
		t.Errorf("sample size %d, want %d", e.Size, 1<<30)
	}
	if e := sink.events[11]; e.Size != 1<<31 || e.BlockSize != 1<<31 || e.DeviceFree != 1<<20 {
		t.Errorf("oom sizes %d/%d/%d", e.Size, e.BlockSize, e.DeviceFree)
	}
}

func TestHeapDumpIsOneRun(t *testing.T) {
	sink := newMemSink()
	r := tracer.New(sink, tracer.WithClock(clock()), tracer.WithStackDepth(0))
	edges := []tracer.Retainer{
		{Holder: 1, Description: "loss_history[7]"},
		{Holder: 2, Parent: 1, Description: "NllLossBackward saved log_probs", Addr: 0x400},
		{Holder: 3, Parent: 2, Description: "AddmmBackward[lm_head] saved input", Addr: 0x800, Device: 1},
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 200 {
			r.Alloc(0, 0, 0x100, 512, 512)
		}
	})
	r.HeapDump("iteration end", edges)
	wg.Wait()

	start := -1
	for i, e := range sink.events {
		if e.Action == snapshot.ActionHeapDump {
			start = i
		}
	}
	if start < 0 || sink.strings[sink.events[start].Text] != "iteration end" {
		t.Fatalf("no heap_dump marker with its reason")
	}
	for i, want := range edges {
		e := sink.events[start+1+i]
		got := tracer.Retainer{Holder: e.Holder, Parent: e.Parent, Description: sink.strings[e.Text], Device: int(e.Device), Addr: e.Addr}
		if e.Action != snapshot.ActionRetain || got != want {
			t.Errorf("event %d after the marker: %v %+v, want retain %+v", i+1, e.Action, got, want)
		}
	}
}

func TestSummaryFollowsAllocatedAndReserved(t *testing.T) {
	sink := newMemSink()
	r := tracer.New(sink, tracer.WithClock(clock()), tracer.WithStackDepth(0))
	r.SegmentAlloc(0, 0, 0x0, 20<<20)
	r.Alloc(0, 0, 0x0, 3<<20, 3<<20)
	r.Alloc(0, 0, 3<<20, 5<<20, 5<<20) // peak: 8 MiB, event 2
	r.FreeRequested(0, 0, 0x0, 3<<20, 3<<20)
	r.FreeCompleted(0, 0, 0x0, 3<<20, 3<<20)
	r.Alloc(0, 0, 0x0, 2<<20, 2<<20) // 7 MiB
	r.SegmentAlloc(0, 0, 20<<20, 2<<20)
	r.SegmentFree(0, 0, 20<<20, 2<<20)
	if err := r.Close(nil); err != nil {
		t.Fatal(err)
	}
	s := sink.footer.Summary
	if s.PeakAllocated != 8<<20 || s.PeakAllocatedSeq != 2 {
		t.Errorf("peak allocated %d at event %d, want %d at event 2", s.PeakAllocated, s.PeakAllocatedSeq, 8<<20)
	}
	if s.PeakReserved != 22<<20 {
		t.Errorf("peak reserved %d, want %d", s.PeakReserved, 22<<20)
	}
	wantCounts := map[string]uint64{"segment_alloc": 2, "segment_free": 1, "alloc": 3, "free_requested": 1, "free_completed": 1}
	if fmt.Sprint(s.ByAction) != fmt.Sprint(wantCounts) || s.Events != 8 {
		t.Errorf("counts %v (%d events), want %v (8)", s.ByAction, s.Events, wantCounts)
	}
	if s.EndTime != sink.events[len(sink.events)-1].Time {
		t.Errorf("end time %d, want the last event's %d", s.EndTime, sink.events[len(sink.events)-1].Time)
	}
}

func TestFirstSinkErrorStopsRecording(t *testing.T) {
	sink := newMemSink()
	sink.failAt = 3
	r := tracer.New(sink, tracer.WithClock(clock()), tracer.WithStackDepth(0))
	for i := range 10 {
		r.Alloc(0, 0, uint64(i)*512, 512, 512)
	}
	if len(sink.events) != 2 {
		t.Errorf("%d events written, want the 2 before the failure", len(sink.events))
	}
	if !errors.Is(r.Err(), errDiskFull) {
		t.Errorf("Err() = %v, want %v", r.Err(), errDiskFull)
	}
	if err := r.Close(nil); !errors.Is(err, errDiskFull) {
		t.Errorf("Close() = %v, want %v", err, errDiskFull)
	}
	if !sink.closed || sink.footer != nil {
		t.Errorf("sink closed %v with footer %v; want closed without a footer", sink.closed, sink.footer)
	}
	if err := r.Close(nil); !errors.Is(err, tracer.ErrClosed) {
		t.Errorf("second Close() = %v, want ErrClosed", err)
	}
}

func TestConcurrentRecording(t *testing.T) {
	sink := newMemSink()
	r := tracer.New(sink)
	const workers, perWorker = 4, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				addr := uint64(w)<<32 | uint64(i)<<12
				r.PushScope(fmt.Sprintf("worker.%d", w))
				r.Alloc(w, int64(w), addr, 4096, 4096)
				r.PopScope()
				r.FreeRequested(w, int64(w), addr, 4096, 4096)
				r.FreeCompleted(w, int64(w), addr, 4096, 4096)
			}
		})
	}
	wg.Go(func() {
		for i := range 50 {
			r.BeginIteration(i)
			r.SetPhase(snapshot.PhaseForward)
		}
	})
	wg.Wait()
	if err := r.Close(nil); err != nil {
		t.Fatal(err)
	}
	if want := workers*perWorker*3 + 100; len(sink.events) != want {
		t.Fatalf("%d events, want %d", len(sink.events), want)
	}
	if s := sink.footer.Summary; s.ByAction["alloc"] != workers*perWorker || s.Events != uint64(len(sink.events)) {
		t.Errorf("summary %+v does not count every event", s)
	}
	for i, e := range sink.events {
		if e.Seq != uint64(i) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
	}
}

// discardSink interns nothing and stores nothing: it measures the Recorder alone.
type discardSink struct{}

func (discardSink) InternString(string) snapshot.StringID            { return 1 }
func (discardSink) InternFrame(string, string, int) snapshot.FrameID { return 1 }
func (discardSink) InternStack([]snapshot.FrameID) snapshot.StackID  { return 1 }
func (discardSink) Write(*snapshot.Event) error                      { return nil }
func (discardSink) Flush() error                                     { return nil }
func (discardSink) Close(*snapshot.Footer) error                     { return nil }
