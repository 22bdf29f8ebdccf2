package torch

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

// The addresses of testdata/gen.py's scenario.
const (
	mib   = 1 << 20
	addrP = 0x7F0000000000 // pre-existing large segment
	addrS = 0x7F0002000000 // small segment made by the trace
	addrL = 0x7F0004000000 // large segment made by the trace
	addrD = 0x7E0000000000 // device 1's small segment
)

func importTestdata(t *testing.T, name string, opts ...Option) *snapshot.Snapshot {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "snapshots", name))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Import(data, opts...)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return s
}

// findEvent returns the first event of the action at addr on device dev that is (or is not) pre-existing.
func findEvent(s *snapshot.Snapshot, a snapshot.Action, dev int16, addr uint64, pre bool) (snapshot.Event, bool) {
	for _, e := range s.Events.All() {
		if e.Action == a && e.Device == dev && e.Addr == addr && (s.String(e.Label) == PreExistingLabel) == pre {
			return e, true
		}
	}
	return snapshot.Event{}, false
}

// TestGenerations imports one small snapshot per schema generation (testdata/gen.py builds them the way
// PyTorch does, consistent with the allocator's rules) and checks what each field became.
func TestGenerations(t *testing.T) {
	type want struct {
		generation string
		form       string
		timeUnit   string
		settings   string
		devices    []int
		actions    map[string]uint64 // every event, synthetic ones included
		phases     bool              // frames name the phases (G1 and later)
		iterations bool              // ProfilerStep#3 and the optimizer region (G3 and later)
		tags       bool              // user_metadata and category (G4 and later)
		annotate   bool              // the annotate action (G5)
		hostSkip   int
	}
	// The recorded table, 4 divisions for [4, 8) MiB only, in the settings string's shortest form: the first
	// key also covers the intervals below it, ">" those after the last.
	const divisions = "roundup_power2_divisions:[2:0,4:4,>:0]"
	oneDev := map[string]uint64{"segment_alloc": 3, "alloc": 7, "free_requested": 3, "free_completed": 3}
	twoDev := map[string]uint64{"segment_alloc": 4, "alloc": 8, "free_requested": 3, "free_completed": 3, "oom": 1, "snapshot": 1}
	withMarkers := func(m map[string]uint64, extra map[string]uint64) map[string]uint64 {
		out := map[string]uint64{}
		for k, v := range m {
			out[k] = v
		}
		for k, v := range extra {
			out[k] += v
		}
		return out
	}
	tests := map[string]want{
		"g0.pickle": {generation: "G0", form: "snapshot", timeUnit: "index", devices: []int{0}, actions: oneDev},
		"g1.pickle": {generation: "G1", form: "snapshot", timeUnit: "index", devices: []int{0}, phases: true,
			actions: withMarkers(oneDev, map[string]uint64{"phase": 2, "iteration": 1})},
		"g2.pickle": {generation: "G2", form: "snapshot", timeUnit: "us", devices: []int{0, 1}, phases: true,
			actions: withMarkers(twoDev, map[string]uint64{"phase": 3, "iteration": 1})},
		"g3.pickle": {generation: "G3", form: "snapshot", timeUnit: "us", settings: divisions, devices: []int{0, 1},
			phases: true, iterations: true,
			actions: withMarkers(twoDev, map[string]uint64{"phase": 3, "iteration": 1, "annotation": 2})},
		"g3.json": {generation: "G3", form: "snapshot", timeUnit: "us", settings: divisions, devices: []int{0, 1},
			phases: true, iterations: true,
			actions: withMarkers(twoDev, map[string]uint64{"phase": 3, "iteration": 1, "annotation": 2})},
		"g4.pickle": {generation: "G4", form: "snapshot", timeUnit: "us", settings: divisions, devices: []int{0, 1},
			phases: true, iterations: true, tags: true,
			actions: withMarkers(twoDev, map[string]uint64{"phase": 3, "iteration": 1, "annotation": 2})},
		"g5.pickle": {generation: "G5", form: "snapshot", timeUnit: "us", settings: divisions, devices: []int{0, 1},
			phases: true, iterations: true, tags: true, annotate: true, hostSkip: 1,
			actions: withMarkers(twoDev, map[string]uint64{"phase": 3, "iteration": 1, "annotation": 3})},
		"segments.pickle": {form: "segments", timeUnit: "index", devices: []int{0},
			actions: map[string]uint64{"segment_alloc": 3, "alloc": 4}},
	}
	for name, w := range tests {
		t.Run(name, func(t *testing.T) {
			s := importTestdata(t, name)
			checkWellFormed(t, s)
			o, ok := OriginOf(s)
			if !ok {
				t.Fatal("OriginOf: no origin")
			}
			if o.Generation != w.generation || o.Form != w.form {
				t.Errorf("generation %q form %q, want %q %q", o.Generation, o.Form, w.generation, w.form)
			}
			if s.Meta.Source != Source || s.Meta.TimeUnit != w.timeUnit || s.Meta.AllocatorSettings != w.settings {
				t.Errorf("meta source %q time unit %q settings %q, want %q %q %q", s.Meta.Source, s.Meta.TimeUnit,
					s.Meta.AllocatorSettings, Source, w.timeUnit, w.settings)
			}
			var devs []int
			for _, d := range s.Meta.Devices {
				devs = append(devs, d.Index)
			}
			if !slices.Equal(devs, w.devices) {
				t.Errorf("devices %v, want %v", devs, w.devices)
			}
			if !reflect.DeepEqual(s.Footer.Summary.ByAction, w.actions) {
				t.Errorf("events by action %v, want %v", s.Footer.Summary.ByAction, w.actions)
			}
			if o.HostEntries != w.hostSkip || o.Inconsistencies != 0 || o.BlockSizesEstimated != 0 {
				t.Errorf("host entries %d, inconsistencies %d, estimated block sizes %d; want %d, 0, 0",
					o.HostEntries, o.Inconsistencies, o.BlockSizesEstimated, w.hostSkip)
			}
			checkScenario(t, s, w.form == "segments")
			if w.form == "segments" {
				return
			}
			checkPhases(t, s, w.phases, w.iterations)
			checkTags(t, s, w.tags, w.annotate)
			if len(w.devices) == 2 {
				oom, ok := findEvent(s, snapshot.ActionOOM, 1, 0, false)
				if !ok || oom.Size != 8*mib || oom.BlockSize != 20*mib || oom.DeviceFree != 3*mib {
					t.Errorf("oom %+v (found %v), want size 8 MiB, block (alloc_size) 20 MiB, device free 3 MiB", oom, ok)
				}
			}
		})
	}
}

// checkScenario checks the segments and blocks of gen.py's scenario: which are pre-existing, and the block
// size of every allocation (rounded, or unsplit), which the trace does not record.
func checkScenario(t *testing.T, s *snapshot.Snapshot, segmentsOnly bool) {
	t.Helper()
	type blk struct {
		addr      uint64
		pre       bool
		size, req int64
	}
	blocks := []blk{
		{addrP, true, 8 * mib, 8 * mib},                  // ghost: in use from before to the end
		{addrP + 14*mib, true, 6 * mib, 6 * mib},         // ghost
		{addrS + 1024, false, 1536, 1500},                // small pool: rounded to 512
		{addrL + 7*mib, false, 13 * mib, 12*mib + mib/2}, // the 13 MiB rest was not split (<= 1 MiB over)
		{addrP + 8*mib, true, 6 * mib, 6*mib - 100},      // freed by the trace: sized by the layout
		{addrS, false, 1024, 1000},                       //
		{addrL, false, 7 * mib, 7 * mib},                 // split: 13 MiB left over
	}
	if segmentsOnly {
		// The final state alone: every block in use is pre-existing, the freed ones are gone.
		blocks = []blk{{addrP, true, 8 * mib, 8 * mib}, {addrP + 14*mib, true, 6 * mib, 6 * mib},
			{addrS + 1024, true, 1536, 1500}, {addrL + 7*mib, true, 13 * mib, 12*mib + mib/2}}
	}
	for _, b := range blocks {
		e, ok := findEvent(s, snapshot.ActionAlloc, 0, b.addr, b.pre)
		if !ok {
			t.Errorf("no alloc (pre-existing %v) at %#x", b.pre, b.addr)
			continue
		}
		if e.BlockSize != b.size || e.Size != b.req {
			t.Errorf("alloc at %#x: block %d requested %d, want %d %d", b.addr, e.BlockSize, e.Size, b.size, b.req)
		}
	}
	// One pre-existing segment (P); S and L are made by the trace unless only the state is known.
	for _, seg := range []struct {
		addr uint64
		pre  bool
	}{{addrP, true}, {addrS, segmentsOnly}, {addrL, segmentsOnly}} {
		if _, ok := findEvent(s, snapshot.ActionSegmentAlloc, 0, seg.addr, seg.pre); !ok {
			t.Errorf("no segment_alloc (pre-existing %v) at %#x", seg.pre, seg.addr)
		}
	}
	if len(s.Footer.Segments) < 3 || s.Footer.Segments[0].Addr != addrP || len(s.Footer.Segments[0].Blocks) != 3 ||
		s.Footer.Segments[0].Blocks[1].Addr != addrP+8*mib {
		t.Errorf("footer segments %+v: want P first, with three blocks at computed addresses", s.Footer.Segments)
	}
	// The allocated bytes at the end equal PyTorch's own count in the final state.
	var allocated, want int64
	for _, e := range s.Events.All() {
		if e.Device != 0 {
			continue
		}
		switch e.Action {
		case snapshot.ActionAlloc:
			allocated += e.BlockSize
		case snapshot.ActionFreeRequested:
			allocated -= e.BlockSize
		}
	}
	for _, seg := range s.Footer.Segments {
		for _, b := range seg.Blocks {
			if seg.Device == 0 && b.State == stateAllocated {
				want += b.Size
			}
		}
	}
	if allocated != want {
		t.Errorf("allocated at the end %d, the final state holds %d", allocated, want)
	}
}

// checkPhases checks the phases the frames and the record_function regions give.
func checkPhases(t *testing.T, s *snapshot.Snapshot, phases, iterations bool) {
	t.Helper()
	type at struct {
		act  snapshot.Action
		addr uint64
	}
	want := map[at]snapshot.Phase{
		{snapshot.ActionAlloc, addrS}:                 snapshot.PhaseNone,      // forward frames
		{snapshot.ActionAlloc, addrS + 1024}:          snapshot.PhaseBackward,  // the autograd engine on the stack
		{snapshot.ActionFreeCompleted, addrS}:         snapshot.PhaseBackward,  // a free keeps the phase
		{snapshot.ActionSegmentAlloc, addrL}:          snapshot.PhaseOptimizer, // torch/optim frames
		{snapshot.ActionAlloc, addrL + 7*mib}:         snapshot.PhaseOptimizer,
		{snapshot.ActionFreeCompleted, addrL}:         snapshot.PhaseOptimizer, // frames only: the phase holds
		{snapshot.ActionAlloc, addrP}:                 snapshot.PhaseNone,      // pre-existing
		{snapshot.ActionFreeCompleted, addrP + 8*mib}: snapshot.PhaseNone,
	}
	if iterations {
		// Optimizer.step#Adam.step ended before the free: the phase ends with it.
		want[at{snapshot.ActionFreeCompleted, addrL}] = snapshot.PhaseNone
	}
	if phases && !iterations {
		// Found from the optimizer's frames, iteration 0 begins with it: no frame places it, so it is
		// the batch.
		want[at{snapshot.ActionAlloc, addrS}] = snapshot.PhaseData
	}
	if !phases {
		for k := range want {
			want[k] = snapshot.PhaseNone
		}
	}
	for k, p := range want {
		e, ok := findEvent(s, k.act, 0, k.addr, k.act == snapshot.ActionAlloc && k.addr == addrP)
		if !ok {
			t.Errorf("no %v at %#x", k.act, k.addr)
			continue
		}
		if e.Phase != p {
			t.Errorf("%v at %#x: phase %v, want %v", k.act, k.addr, e.Phase, p)
		}
		wantIter := int32(-1)
		switch {
		case s.String(e.Label) == PreExistingLabel:
		case iterations:
			wantIter = 3
		case phases && k.addr != addrP+8*mib:
			// No ProfilerStep: the optimizer's frames end iteration 0, which begins with the forward
			// allocation before the backward one; the pre-existing block's free comes before it.
			wantIter = 0
		}
		if e.Iteration != wantIter {
			t.Errorf("%v at %#x: iteration %d, want %d", k.act, k.addr, e.Iteration, wantIter)
		}
	}
	// Markers: each phase change is announced, and the iteration marker opens step 3.
	var markers []snapshot.Phase
	iterMarkers := 0
	for _, e := range s.Events.All() {
		switch e.Action {
		case snapshot.ActionPhase:
			markers = append(markers, e.Phase)
		case snapshot.ActionIteration:
			iterMarkers++
			if want := int32(3); !iterations && e.Iteration != 0 || iterations && e.Iteration != want {
				t.Errorf("iteration marker for %d (ProfilerStep#3 %v)", e.Iteration, iterations)
			}
		}
	}
	if phases != (iterMarkers == 1) {
		t.Errorf("%d iteration markers", iterMarkers)
	}
	if phases && len(markers) < 2 || phases && (markers[0] != snapshot.PhaseBackward || markers[1] != snapshot.PhaseOptimizer) {
		t.Errorf("phase markers %v, want backward then optimizer first", markers)
	}
}

// checkTags checks user_metadata (scope), the profiler's category, annotations and the annotate action.
func checkTags(t *testing.T, s *snapshot.Snapshot, tags, annotate bool) {
	t.Helper()
	e, _ := findEvent(s, snapshot.ActionAlloc, 0, addrS, false)
	if got := s.String(e.Scope); (got == "layer.0") != tags {
		t.Errorf("scope of the first small alloc %q (tags %v)", got, tags)
	}
	e, _ = findEvent(s, snapshot.ActionAlloc, 0, addrS+1024, false)
	if (e.Category == snapshot.CategoryActivation) != tags {
		t.Errorf("category of the second small alloc %v (tags %v)", e.Category, tags)
	}
	var notes []string
	for _, e := range s.Events.All() {
		if e.Action == snapshot.ActionAnnotation {
			notes = append(notes, s.String(e.Label)+" "+s.String(e.Text))
		}
	}
	want := []string(nil)
	if s.Meta.AllocatorSettings != "" {
		want = []string{"START my_region", "END my_region"}
	}
	if annotate {
		want = append(want, " kv cache")
	}
	if !slices.Equal(notes, want) {
		t.Errorf("annotations %q, want %q", notes, want)
	}
}

// TestFrameFilter checks memory_viz's frameFilter: the unwinder and interpreter frames are dropped, unless
// WithAllFrames keeps them.
func TestFrameFilter(t *testing.T) {
	tests := map[string]struct {
		opts   []Option
		hidden bool
	}{
		"filtered":   {nil, false},
		"all frames": {[]Option{WithAllFrames()}, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := importTestdata(t, "g2.pickle", tc.opts...)
			var names []string
			for _, f := range s.Frames[1:] {
				names = append(names, s.String(f.Function))
			}
			for _, hidden := range []string{"torch::unwind::unwind()", "_PyEval_EvalFrameDefault"} {
				if slices.Contains(names, hidden) != tc.hidden {
					t.Errorf("frame %q present %v, want %v (frames %q)", hidden, !tc.hidden, tc.hidden, names)
				}
			}
			if !slices.Contains(names, "forward") || !slices.Contains(names, "train_step") {
				t.Errorf("frames %q lack the program's own", names)
			}
			// The stack of an alloc is innermost first.
			e, _ := findEvent(s, snapshot.ActionAlloc, 0, addrS, false)
			st := s.Stack(e.Stack)
			if len(st) == 0 || s.String(s.Frame(st[0]).Function) != map[bool]string{false: "forward", true: "torch::unwind::unwind()"}[tc.hidden] {
				t.Errorf("stack %v does not start with the innermost frame", st)
			}
		})
	}
}

// TestJSONMatchesPickle checks that the JSON form (memory_viz reads it too) imports to the same snapshot as
// the pickle of the same data.
func TestJSONMatchesPickle(t *testing.T) {
	for _, name := range []string{"g3", "g5"} {
		t.Run(name, func(t *testing.T) {
			p := importTestdata(t, name+".pickle")
			j := importTestdata(t, name+".json")
			p.Meta.Workload, j.Meta.Workload = nil, nil
			if !reflect.DeepEqual(p, j) {
				t.Errorf("JSON and pickle import differently:\npickle %+v\njson   %+v", p.Events, j.Events)
			}
		})
	}
}

// TestPhaseEvidence checks what a stack says about its phase, innermost frame first, with the frames PyTorch
// records: a module call is forward unless something else on the stack names the phase.
func TestPhaseEvidence(t *testing.T) {
	const (
		module     = "/usr/lib/python3/dist-packages/torch/nn/modules/module.py"
		checkpoint = "/usr/lib/python3/dist-packages/torch/utils/checkpoint.py"
	)
	type fr struct{ name, file string }
	linear := fr{"forward", "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py"}
	call := []fr{{"_call_impl", module}, {"_wrapped_call_impl", module}}
	train := fr{"train_step", "/work/train.py"}
	stack := func(parts ...any) []fr {
		var out []fr
		for _, p := range parts {
			switch x := p.(type) {
			case fr:
				out = append(out, x)
			case []fr:
				out = append(out, x...)
			}
		}
		return out
	}
	tests := []struct {
		name   string
		frames []fr
		want   snapshot.Phase
	}{
		{"module call", stack(linear, call, train), snapshot.PhaseForward},
		{"loss outside a module", stack(fr{"cross_entropy", "/usr/lib/python3/dist-packages/torch/nn/functional.py"}, train), snapshot.PhaseNone},
		{"backward", stack(fr{"backward", "/usr/lib/python3/dist-packages/torch/_tensor.py"}, train), snapshot.PhaseBackward},
		{"autograd engine under a module's hook", stack(call, fr{"torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "??"}), snapshot.PhaseBackward},
		{"checkpoint recompute, 2.x", stack(linear, call, fr{"recompute_fn", checkpoint}, fr{"unpack_hook", checkpoint}), snapshot.PhaseRecompute},
		{"checkpoint recompute, reentrant", stack(linear, call, fr{"backward", checkpoint}), snapshot.PhaseRecompute},
		{"checkpoint first pass", stack(linear, call, fr{"forward", checkpoint}, fr{"checkpoint", checkpoint}, call, train), snapshot.PhaseForward},
		{"optimizer", stack(fr{"_multi_tensor_adamw", "/usr/lib/python3/dist-packages/torch/optim/adamw.py"}, fr{"step", "/usr/lib/python3/dist-packages/torch/optim/adamw.py"}, train), snapshot.PhaseOptimizer},
		{"zero_grad", stack(fr{"zero_grad", module}, train), snapshot.PhaseZeroGrad},
		{"moving the model", stack(fr{"convert", module}, fr{"_apply", module}, fr{"to", module}, train), snapshot.PhaseNone},
		// transformers' from_pretrained putting a 4-bit checkpoint on the device (bitsandbytes quantizing
		// under create_quantized_param), and the runtime's load.
		{"from_pretrained", stack(fr{"quantize_4bit", "/usr/lib/python3/dist-packages/bitsandbytes/functional.py"},
			fr{"_quantize", "/usr/lib/python3/dist-packages/bitsandbytes/nn/modules.py"},
			fr{"_load_state_dict_into_meta_model", "/usr/lib/python3/dist-packages/transformers/modeling_utils.py"},
			fr{"_load_pretrained_model", "/usr/lib/python3/dist-packages/transformers/modeling_utils.py"},
			fr{"from_pretrained", "/usr/lib/python3/dist-packages/transformers/modeling_utils.py"}, train), snapshot.PhaseLoad},
		{"the runtime's load", stack(fr{"github.com/oomdbg/oomdbg/workloads/nn.NewLlama", "llama.go"},
			fr{"github.com/oomdbg/oomdbg/workloads/train.(*run).load", "run.go"}), snapshot.PhaseLoad},
	}
	tab, err := newTables(true, 0, &budget{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab.scratch = tab.scratch[:0]
			h := stackHashSeed
			for i, f := range tt.frames {
				id := tab.frame(f.name, f.file, int64(i+1))
				tab.scratch = append(tab.scratch, id)
				h = stackHash(h, id)
			}
			id := tab.stack(h)
			facts := readStacks(&snapshot.Snapshot{Strings: tab.strings, Frames: tab.frames, Stacks: tab.stacks})
			got, ok := facts[id].phase.phase()
			if !ok || got != tt.want {
				t.Errorf("phase %v (%v), want %v", got, ok, tt.want)
			}
		})
	}
}
