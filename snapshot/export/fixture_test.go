package export

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// The fixtures: a small hand-made snapshot whose every byte is known (for golden files), and recordings of
// oomdbg's own workloads (for round trips and real-sized checks).

// builder assembles a snapshot by hand, interning as the Writer does.
type builder struct {
	s      *snapshot.Snapshot
	strs   map[string]snapshot.StringID
	frames map[snapshot.Frame]snapshot.FrameID
}

func newBuilder(m snapshot.Meta) *builder {
	return &builder{
		s:      &snapshot.Snapshot{Meta: m, Strings: []string{""}, Frames: []snapshot.Frame{{}}, Stacks: [][]snapshot.FrameID{nil}},
		strs:   map[string]snapshot.StringID{"": 0},
		frames: map[snapshot.Frame]snapshot.FrameID{},
	}
}

func (b *builder) str(s string) snapshot.StringID {
	if id, ok := b.strs[s]; ok {
		return id
	}
	id := snapshot.StringID(len(b.s.Strings))
	b.s.Strings = append(b.s.Strings, s)
	b.strs[s] = id
	return id
}

// stack interns a stack of "function file line" triples, innermost first.
func (b *builder) stack(frames ...frame) snapshot.StackID {
	ids := make([]snapshot.FrameID, len(frames))
	for i, f := range frames {
		fr := snapshot.Frame{Function: b.str(f.fn), File: b.str(f.file), Line: f.line}
		id, ok := b.frames[fr]
		if !ok {
			id = snapshot.FrameID(len(b.s.Frames))
			b.s.Frames = append(b.s.Frames, fr)
			b.frames[fr] = id
		}
		ids[i] = id
	}
	b.s.Stacks = append(b.s.Stacks, ids)
	return snapshot.StackID(len(b.s.Stacks) - 1)
}

type frame struct {
	fn, file string
	line     int32
}

// add appends an event at the next seq; its time is 1.25 µs a step from 0.3 µs.
func (b *builder) add(e snapshot.Event) {
	b.addAt(e, int64(b.s.Events.Len())*1250+300)
}

// addAt appends e at time ns.
func (b *builder) addAt(e snapshot.Event, ns int64) {
	e.Time = ns
	b.s.Events.Append(&e)
}

const (
	segA = 0x7f0000000000 // a small-pool segment of 2 MiB
	segB = 0x7f0000200000 // a large-pool segment of 20 MiB
	mib  = 1 << 20
)

// fixtureMeta is the fixture's self-description.
func fixtureMeta() snapshot.Meta {
	return snapshot.Meta{
		Tool: "oomdbg", ToolVersion: "test", Created: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), Source: "oomdbg",
		TimeUnit: "ns",
		Devices:  []snapshot.DeviceInfo{{Index: 0, Name: "simulated GPU (meta)", Kind: "meta", Capacity: 64 * mib, ContextReserve: 8 * mib}},
		Workload: json.RawMessage(`{"model":"mlp","batch":16,"optimizer":"adamw"}`),
	}
}

// fixture is one training step of a one-layer model and the start of a second that runs out of memory:
// every action, a category change, a free that stays pending, segment creation and release, an annotation,
// heap dumps, a device reading. Block sizes follow the caching allocator's rules, and the footer is the state
// the events leave, so PyTorch's tools and oomdbg's importer agree with it.
func fixture() *snapshot.Snapshot {
	b := newBuilder(fixtureMeta())
	main := frame{"main.main", "/src/main.go", 12}
	step := frame{"github.com/example/train.Step", "/src/train/step.go", 40}
	setup := b.stack(frame{"github.com/example/nn.NewLinear", "/src/nn/linear.go", 18}, frame{"github.com/example/train.Setup", "/src/train/setup.go", 9}, main)
	bias := b.stack(frame{"github.com/example/nn.NewLinear", "/src/nn/linear.go", 19}, frame{"github.com/example/train.Setup", "/src/train/setup.go", 9}, main)
	data := b.stack(frame{"github.com/example/data.(*Loader).Next", "/src/data/loader.go", 55}, step, main)
	fwd := b.stack(frame{"github.com/example/nn.(*Linear).Forward", "/src/nn/linear.go", 31}, step, main)
	loss := b.stack(frame{"github.com/example/nn.CrossEntropy", "/src/nn/loss.go", 22}, step, main)
	bwd := b.stack(frame{"github.com/example/autograd.Backward", "/src/autograd/engine.go", 77}, step, main)
	opt := b.stack(frame{"github.com/example/optim.(*AdamW).Step", "/src/optim/adamw.go", 90}, step, main)
	scope := b.str("fc")
	type ev = snapshot.Event
	phase := func(p snapshot.Phase, it int32) { b.add(ev{Action: snapshot.ActionPhase, Phase: p, Iteration: it}) }
	var ph snapshot.Phase
	var it int32 = -1
	alloc := func(addr uint64, req, block int64, c snapshot.Category, sc snapshot.StringID, label string, st snapshot.StackID) {
		b.add(ev{Action: snapshot.ActionAlloc, Addr: addr, Size: req, BlockSize: block, Category: c, Scope: sc,
			Label: b.str(label), Stack: st, Phase: ph, Iteration: it})
	}
	free := func(a snapshot.Action, addr uint64, req, block int64) {
		b.add(ev{Action: a, Addr: addr, Size: req, BlockSize: block, Phase: ph, Iteration: it})
	}

	ph = snapshot.PhaseSetup
	phase(ph, it)
	b.add(ev{Action: snapshot.ActionSegmentAlloc, Addr: segA, Size: 2 * mib, Stack: setup, Phase: ph, Iteration: it})
	alloc(segA, 4096, 4096, snapshot.CategoryParameter, scope, "f32[32,32] fc.weight", setup)
	alloc(segA+4096, 128, 512, snapshot.CategoryParameter, scope, "f32[32] fc.bias", bias)

	it = 0
	b.add(ev{Action: snapshot.ActionIteration, Phase: ph, Iteration: it})
	ph = snapshot.PhaseData
	phase(ph, it)
	alloc(segA+4608, 2048, 2048, snapshot.CategoryInput, 0, "f32[16,32] batch.x", data)
	ph = snapshot.PhaseForward
	phase(ph, it)
	b.add(ev{Action: snapshot.ActionSegmentAlloc, Addr: segB, Size: 20 * mib, Stack: fwd, Scope: scope, Phase: ph, Iteration: it})
	alloc(segB, 8*mib, 8*mib, snapshot.CategoryTemporary, scope, "f32[16,32,4096] fc.out", fwd)
	b.add(ev{Action: snapshot.ActionCategory, Addr: segB, Category: snapshot.CategoryActivation, Scope: scope, Phase: ph, Iteration: it})
	alloc(segA+6656, 1000, 1024, snapshot.CategoryTemporary, 0, "f32[250] loss", loss)
	ph = snapshot.PhaseBackward
	phase(ph, it)
	alloc(segA+7680, 4096, 4096, snapshot.CategoryGradient, scope, "f32[32,32] fc.weight.grad", bwd)
	alloc(segA+11776, 128, 512, snapshot.CategoryGradient, scope, "f32[32] fc.bias.grad", bwd)
	free(snapshot.ActionFreeRequested, segB, 8*mib, 8*mib)
	free(snapshot.ActionFreeCompleted, segB, 8*mib, 8*mib)
	free(snapshot.ActionFreeRequested, segA+6656, 1000, 1024)
	free(snapshot.ActionFreeCompleted, segA+6656, 1000, 1024)
	ph = snapshot.PhaseOptimizer
	phase(ph, it)
	alloc(segA+12288, 4096, 4096, snapshot.CategoryOptimizerState, scope, "f32[32,32] fc.weight.exp_avg", opt)
	alloc(segA+16384, 128, 512, snapshot.CategoryOptimizerState, scope, "f32[32] fc.bias.exp_avg", opt)
	ph = snapshot.PhaseZeroGrad
	phase(ph, it)
	// The weight's gradient was used on another stream: its free waits (active_pending_free to the end).
	free(snapshot.ActionFreeRequested, segA+7680, 4096, 4096)
	free(snapshot.ActionFreeRequested, segA+11776, 128, 512)
	free(snapshot.ActionFreeCompleted, segA+11776, 128, 512)
	b.add(ev{Action: snapshot.ActionAnnotation, Text: b.str(`checkpoint "best" → saved`), Phase: ph, Iteration: it})
	b.add(ev{Action: snapshot.ActionHeapDump, Text: b.str("iteration end"), Phase: ph, Iteration: it})
	b.add(ev{Action: snapshot.ActionRetain, Addr: segA, Holder: 1, Text: b.str("fc.weight"), Phase: ph, Iteration: it})
	b.add(ev{Action: snapshot.ActionRetain, Addr: segA + 12288, Holder: 2, Text: b.str("optimizer.state[fc.weight].exp_avg"), Phase: ph, Iteration: it})

	it = 1
	b.add(ev{Action: snapshot.ActionIteration, Phase: ph, Iteration: it})
	ph = snapshot.PhaseData
	phase(ph, it)
	b.add(ev{Action: snapshot.ActionSample, Size: 600 * mib, Text: b.str("nvml.used"), Phase: ph, Iteration: it})
	alloc(segA+16896, 2048, 2048, snapshot.CategoryInput, 0, "f32[16,32] batch.x", data)
	ph = snapshot.PhaseForward
	phase(ph, it)
	// Out of memory: the allocator releases its cached segment and still cannot find 64 MiB.
	b.add(ev{Action: snapshot.ActionSegmentFree, Addr: segB, Size: 20 * mib, Stack: fwd, Scope: scope, Phase: ph, Iteration: it})
	b.add(ev{Action: snapshot.ActionOOM, Size: 64 * mib, BlockSize: 64 * mib, DeviceFree: 40 * mib, Category: snapshot.CategoryTemporary,
		Scope: scope, Label: b.str("f32[16,32,32768] fc.out"), Stack: fwd, Phase: ph, Iteration: it})
	b.add(ev{Action: snapshot.ActionHeapDump, Text: b.str("oom"), Phase: ph, Iteration: it})
	b.add(ev{Action: snapshot.ActionRetain, Addr: segA + 4608, Holder: 1, Text: b.str("last_batch"), Phase: ph, Iteration: it})

	blocks := []snapshot.Block{
		{Addr: segA, Size: 4096, Requested: 4096, State: stateAllocated},
		{Addr: segA + 4096, Size: 512, Requested: 128, State: stateAllocated},
		{Addr: segA + 4608, Size: 2048, Requested: 2048, State: stateAllocated},
		{Addr: segA + 6656, Size: 1024, Requested: 1000, State: stateInactive},
		{Addr: segA + 7680, Size: 4096, Requested: 4096, State: statePendingFree},
		{Addr: segA + 11776, Size: 512, Requested: 128, State: stateInactive},
		{Addr: segA + 12288, Size: 4096, Requested: 4096, State: stateAllocated},
		{Addr: segA + 16384, Size: 512, Requested: 128, State: stateAllocated},
		{Addr: segA + 16896, Size: 2048, Requested: 2048, State: stateAllocated},
		{Addr: segA + 18944, Size: 2*mib - 18944, State: stateInactive},
	}
	b.s.Footer = &snapshot.Footer{
		Summary:  snapshot.Summary{Events: uint64(b.s.Events.Len())},
		Segments: []snapshot.Segment{{Device: 0, Addr: segA, Size: 2 * mib, Pool: "small", Blocks: blocks}},
	}
	return b.s
}

// twoDevices is the fixture with a second device that holds one segment and one block.
func twoDevices() *snapshot.Snapshot {
	s := fixture()
	s.Meta.Devices = append(s.Meta.Devices, snapshot.DeviceInfo{Index: 1, Name: "simulated GPU 1 (meta)", Kind: "meta", Capacity: 64 * mib})
	const segC = 0x7e0000000000
	last := s.Events.At(s.Events.Len() - 1)
	for _, e := range []snapshot.Event{
		{Action: snapshot.ActionSegmentAlloc, Device: 1, Addr: segC, Size: 20 * mib},
		{Action: snapshot.ActionAlloc, Device: 1, Addr: segC, Size: 12 * mib, BlockSize: 12 * mib, Category: snapshot.CategoryActivation},
	} {
		e.Seq, e.Time = uint64(s.Events.Len()), last.Time+int64(s.Events.Len())
		e.Phase, e.Iteration = last.Phase, last.Iteration
		s.Events.Append(&e)
	}
	s.Footer.Segments = append(s.Footer.Segments, snapshot.Segment{Device: 1, Addr: segC, Size: 20 * mib, Pool: "large", Blocks: []snapshot.Block{
		{Addr: segC, Size: 12 * mib, Requested: 12 * mib, State: stateAllocated},
		{Addr: segC + 12*mib, Size: 8 * mib, State: stateInactive},
	}})
	return s
}

// recordings caches the workloads the tests record, by name.
var recordings sync.Map

// recorded runs a workload as leakstest records it (a clock of 100 ns per event, so that many events share a
// microsecond of PyTorch's time_us) and returns its snapshot as read back from the file.
func recorded(t testing.TB, name string) *snapshot.Snapshot {
	t.Helper()
	if s, ok := recordings.Load(name); ok {
		return s.(*snapshot.Snapshot)
	}
	cfg, ok := recordingConfigs()[name]
	if !ok {
		t.Fatalf("no recording %q", name)
	}
	s := leakstest.Record(t, cfg)
	recordings.Store(name, s)
	return s
}

// recordingConfigs are the workloads of the tests, all on the meta device (shapes only, milliseconds to run).
func recordingConfigs() map[string]train.Config {
	tiny := func() train.Config {
		c, err := train.PresetConfig("tiny")
		if err != nil {
			panic(err)
		}
		c.Device, c.Steps = "meta", 3
		return c
	}
	oom, err := train.PresetConfig("gpt2-medium")
	if err != nil {
		panic(fmt.Sprint(err))
	}
	oom.Device, oom.Steps = "meta", 2
	expandable := tiny()
	expandable.AllocConf, _ = train.ParseAllocConf("expandable_segments:True")
	leak := tiny()
	leak.Steps, leak.Bug = 5, train.BugRetainGraph
	mlp := train.DefaultMLP()
	mlp.Device, mlp.Steps = "meta", 3
	return map[string]train.Config{
		"tiny":       tiny(),
		"oom":        oom,
		"expandable": expandable,
		"leak":       leak,
		"mlp":        mlp,
	}
}
