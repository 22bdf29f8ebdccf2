package leaks_test

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/optim"
	"github.com/oomdbg/oomdbg/workloads/train"
)

func mlp(bug string) train.Config {
	cfg := train.DefaultMLP()
	cfg.Bug, cfg.Steps = bug, 8
	return cfg
}

func gpt(bug string) train.Config {
	cfg, err := train.PresetConfig("tiny")
	if err != nil {
		panic(err)
	}
	cfg.Device, cfg.Bug, cfg.Steps = "meta", bug, 4
	return cfg
}

// want is what a leak check must find in a recording.
type want struct {
	verdict leaks.Verdict
	kind    leaks.Kind
	// A suspect with this category, a scope matching scope and a retainer whose root matches root.
	category snapshot.Category
	scope    string
	root     string
}

// TestWorkloadBugs records each leak bug of the training runtime, its fixed code path and the negative
// control, on the MLP and on the tiny GPT, and checks what the analysis finds: the verdict, the kind, and a
// suspect in the right scope and category with the right retainer.
func TestWorkloadBugs(t *testing.T) {
	tests := map[string]struct {
		cfg  train.Config
		want want
	}{
		"mlp fixed":             {mlp(""), want{verdict: leaks.NoLeak}},
		"mlp tensor-loss-sum":   {mlp(train.BugTensorLossSum), want{verdict: leaks.NoLeak}},
		"mlp retain-graph":      {mlp(train.BugRetainGraph), want{leaks.Leak, leaks.RetainedGraph, snapshot.CategoryActivation, `^net\.[13]$`, `^loss_history\[6\]$`}},
		"mlp eval-no-grad":      {mlp(train.BugEvalNoGrad), want{leaks.Leak, leaks.RetainedGraph, snapshot.CategoryActivation, `^net\.[13]$`, `^eval_outputs\[6\]$`}},
		"mlp stash-activations": {mlp(train.BugStashActivations), want{leaks.Leak, leaks.StashedOutputs, snapshot.CategoryActivation, `^net\.[13]$`, `^activation_stash\[1[23]\]$`}},
		"gpt fixed":             {gpt(""), want{verdict: leaks.NoLeak}},
		"gpt tensor-loss-sum":   {gpt(train.BugTensorLossSum), want{verdict: leaks.NoLeak}},
		"gpt retain-graph":      {gpt(train.BugRetainGraph), want{leaks.Leak, leaks.RetainedGraph, snapshot.CategoryActivation, `^transformer\.h\.[01]\.attn$`, `^loss_history\[2\]$`}},
		"gpt eval-no-grad":      {gpt(train.BugEvalNoGrad), want{leaks.Leak, leaks.RetainedGraph, snapshot.CategoryActivation, `^transformer\.h\.[01]\.mlp\.c_fc$`, `^eval_outputs\[2\]$`}},
		"gpt stash-activations": {gpt(train.BugStashActivations), want{leaks.Leak, leaks.StashedOutputs, snapshot.CategoryActivation, `^transformer\.h\.[01]$`, `^activation_stash\[[45]\]$`}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			data, res, err := leakstest.Encode(t.Context(), tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			s, err := snapshot.Read(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			r := leaks.Find(s)
			if r.Verdict != tc.want.verdict || r.Kind != tc.want.kind {
				t.Fatalf("verdict %s (%s), want %s (%s): %s\n%s", r.Verdict, r.Kind, tc.want.verdict, tc.want.kind, r.Reason, r.Detail())
			}
			checkPoints(t, r, res)
			if err := r.Err(); (err != nil) != (tc.want.verdict == leaks.Leak) {
				t.Errorf("Err() = %v for a %s verdict", err, r.Verdict)
			}
			if tc.want.verdict != leaks.Leak {
				if len(r.Suspects) != 0 || r.LeakPerIteration != 0 {
					t.Errorf("%d suspects, %d bytes per iteration without a leak", len(r.Suspects), r.LeakPerIteration)
				}
				return
			}
			// The suspects account for all the growth: nothing else grows.
			if r.LeakPerIteration != r.GrowthPerIteration || r.LeakPerIteration <= 0 {
				t.Errorf("suspects leak %d bytes per iteration, memory grows %d", r.LeakPerIteration, r.GrowthPerIteration)
			}
			scope, root := regexp.MustCompile(tc.want.scope), regexp.MustCompile(tc.want.root)
			found := slices.ContainsFunc(r.Suspects, func(sp leaks.Suspect) bool {
				return sp.Category == tc.want.category && scope.MatchString(sp.Scope) && sp.Kind == tc.want.kind &&
					sp.RetainedBy != nil && root.MatchString(sp.RetainedBy.Root) && sp.BytesPerIteration > 0
			})
			if !found {
				t.Errorf("no %s suspect in a scope matching %s retained by %s:\n%s", tc.want.category, tc.want.scope, tc.want.root, r.Detail())
			}
			// The reason names what grows, not a name that holds only the newest iteration.
			if !strings.HasPrefix(r.Reason, "leak: ") || !root.MatchString(r.Suspects[0].RetainedBy.Root) || !strings.Contains(r.Reason, "retained by "+r.Suspects[0].RetainedBy.Root+")") {
				t.Errorf("reason %q", r.Reason)
			}
			for _, sp := range r.Suspects {
				if sp.RetainedBy != nil && sp.RetainedBy.Root == "logits" {
					t.Errorf("a suspect's example is retained by the logits, which hold only the newest iteration: %s", sp.RetainedBy)
				}
			}
		})
	}
}

// checkPoints compares the measurements with the allocator's own account of each iteration: the bytes
// allocated when the last phase of the iteration ended.
func checkPoints(t *testing.T, r *leaks.Result, res *train.Result) {
	t.Helper()
	end := map[int32]int64{}
	for _, p := range res.Phases {
		end[int32(p.Iteration)] = p.End
	}
	if r.Iterations != res.Steps {
		t.Errorf("%d complete iterations, the run made %d steps", r.Iterations, res.Steps)
	}
	for _, p := range r.Points {
		if p.Allocated != end[p.Iteration] {
			t.Errorf("iteration %d ends with %d bytes allocated, the allocator says %d", p.Iteration, p.Allocated, end[p.Iteration])
		}
	}
}

// TestAdamFirstStep: Adam allocates its state at the first step, a one-time growth that no warm-up may
// mistake for a leak.
func TestAdamFirstStep(t *testing.T) {
	for _, opt := range []optim.Kind{optim.Adam, optim.AdamW} {
		for warmup := range 3 {
			t.Run(fmt.Sprintf("%s warm-up %d", opt, warmup), func(t *testing.T) {
				t.Parallel()
				cfg := mlp("")
				cfg.Optimizer = opt
				r := leaks.Find(leakstest.Record(t, cfg), leaks.Warmup(warmup))
				if r.Verdict != leaks.NoLeak || r.Err() != nil {
					t.Fatalf("%s: %s\n%s", r.Verdict, r.Reason, r.Detail())
				}
				if warmup == 0 && r.Points[1].Allocated <= r.Points[0].Allocated {
					t.Fatalf("the first step did not grow memory (%d -> %d bytes): the test shows nothing", r.Points[0].Allocated, r.Points[1].Allocated)
				}
			})
		}
	}
}

func TestFragmentation(t *testing.T) {
	s := leakstest.Fragmentation(t, 8)
	r := leaks.Find(s)
	if r.Verdict != leaks.Fragmentation || r.Err() != nil || len(r.Suspects) != 0 {
		t.Fatalf("%s (err %v): %s", r.Verdict, r.Err(), r.Reason)
	}
	if r.ReservedGrowthPerIteration <= 0 || r.GrowthPerIteration != 0 {
		t.Errorf("reserved grows %d, allocated %d per iteration", r.ReservedGrowthPerIteration, r.GrowthPerIteration)
	}
	if !strings.HasPrefix(r.Reason, "fragmentation, not a leak: reserved memory grows ") {
		t.Errorf("reason %q", r.Reason)
	}
}

// synth writes a small training loop event by event through a snapshot.Writer.
type synth struct {
	buf    bytes.Buffer
	w      *snapshot.Writer
	t      *testing.T
	iter   int32
	phase  snapshot.Phase
	next   uint64
	now    int64
	segs   uint64
	frames map[string]snapshot.StackID
}

func newSynth(t *testing.T) *synth {
	s := &synth{t: t, iter: -1, phase: snapshot.PhaseSetup, next: 0x7f00_0000_0000, frames: map[string]snapshot.StackID{}}
	w, err := snapshot.NewWriter(&s.buf, snapshot.Meta{Tool: "test", Source: "oomdbg", TimeUnit: "ns",
		Devices: []snapshot.DeviceInfo{{Name: "test", Kind: "meta", Capacity: 24 << 30}}})
	if err != nil {
		t.Fatal(err)
	}
	s.w = w
	return s
}

func (s *synth) emit(e snapshot.Event) {
	s.now += 100
	e.Time, e.Phase, e.Iteration = s.now, s.phase, s.iter
	if err := s.w.Write(&e); err != nil {
		s.t.Fatal(err)
	}
}

func (s *synth) iteration(i int32) {
	s.iter = i
	s.emit(snapshot.Event{Action: snapshot.ActionIteration})
	s.phase = snapshot.PhaseForward
	s.emit(snapshot.Event{Action: snapshot.ActionPhase})
}

// alloc allocates size bytes at a fresh address from the code site names.
func (s *synth) alloc(site string, size int64, cat snapshot.Category) uint64 {
	st, ok := s.frames[site]
	if !ok {
		st = s.w.InternStack([]snapshot.FrameID{s.w.InternFrame(site, "model.py", len(s.frames)+1)})
		s.frames[site] = st
	}
	addr := s.next
	s.next += uint64(size+511) / 512 * 512
	s.emit(snapshot.Event{Action: snapshot.ActionAlloc, Addr: addr, Size: size, BlockSize: (size + 511) / 512 * 512,
		Category: cat, Stack: st, Scope: s.w.InternString("model." + site)})
	return addr
}

func (s *synth) free(addr uint64, size int64) {
	bs := (size + 511) / 512 * 512
	s.emit(snapshot.Event{Action: snapshot.ActionFreeRequested, Addr: addr, Size: size, BlockSize: bs})
	s.emit(snapshot.Event{Action: snapshot.ActionFreeCompleted, Addr: addr, Size: size, BlockSize: bs})
}

func (s *synth) segment(size int64) {
	s.segs++
	s.emit(snapshot.Event{Action: snapshot.ActionSegmentAlloc, Addr: 0x1000_0000_0000 + s.segs<<32, Size: size})
}

func (s *synth) snapshot() *snapshot.Snapshot {
	if err := s.w.Close(&snapshot.Footer{}); err != nil {
		s.t.Fatal(err)
	}
	snap, err := snapshot.Read(&s.buf)
	if err != nil {
		s.t.Fatal(err)
	}
	return snap
}

// TestGrowthPatterns checks the verdict on loops whose memory grows in the ways that are and are not leaks.
func TestGrowthPatterns(t *testing.T) {
	const iterations = 10
	tests := map[string]struct {
		step    func(s *synth, i int32, state map[string]uint64)
		verdict leaks.Verdict
		kind    leaks.Kind
	}{
		"flat": {
			step: func(s *synth, i int32, _ map[string]uint64) {
				s.free(s.alloc("tmp", 4096, snapshot.CategoryTemporary), 4096)
			},
			verdict: leaks.NoLeak,
		},
		"cache filled once": {
			step: func(s *synth, i int32, _ map[string]uint64) {
				if i == 5 {
					s.alloc("cache", 1<<20, snapshot.CategoryTemporary)
				}
			},
			verdict: leaks.NoLeak,
		},
		"grew twice then stopped": {
			step: func(s *synth, i int32, _ map[string]uint64) {
				if i == 3 || i == 4 {
					s.alloc("kept", 1<<20, snapshot.CategoryTemporary)
				}
			},
			verdict: leaks.NoLeak,
		},
		"every iteration": {
			step:    func(s *synth, i int32, _ map[string]uint64) { s.alloc("kept", 1024, snapshot.CategoryTemporary) },
			verdict: leaks.Leak, kind: leaks.Unclassified,
		},
		"every other iteration": {
			step: func(s *synth, i int32, _ map[string]uint64) {
				if i%2 == 0 {
					s.alloc("kept", 1024, snapshot.CategoryActivation)
				}
			},
			verdict: leaks.Leak, kind: leaks.RetainedGraph,
		},
		"a buffer regrown larger": {
			step: func(s *synth, i int32, st map[string]uint64) {
				if a, ok := st["buf"]; ok {
					s.free(a, int64(i)*4096)
				}
				st["buf"] = s.alloc("buf", int64(i+1)*4096, snapshot.CategoryTemporary)
			},
			verdict: leaks.Leak, kind: leaks.GrowingCache,
		},
		"a tensor moving between groups": {
			// One block a step changes hands (freed from one site, reallocated at another): groups grow and
			// shrink, the total does not.
			step: func(s *synth, i int32, st map[string]uint64) {
				if i == 0 {
					for k := range 12 {
						st[fmt.Sprint("a", k)] = s.alloc("a", 1024, snapshot.CategoryTemporary)
					}
					return
				}
				s.free(st[fmt.Sprint("a", i)], 1024)
				s.alloc("b", 1024, snapshot.CategoryTemporary)
			},
			verdict: leaks.NoLeak,
		},
		"segments only": {
			step: func(s *synth, i int32, _ map[string]uint64) {
				s.segment(20 << 20)
				s.free(s.alloc("tmp", 4096, snapshot.CategoryTemporary), 4096)
			},
			verdict: leaks.Fragmentation,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newSynth(t)
			s.alloc("weight", 1<<20, snapshot.CategoryParameter)
			state := map[string]uint64{}
			for i := range int32(iterations) {
				s.iteration(i)
				tc.step(s, i, state)
			}
			r := leaks.Find(s.snapshot())
			if r.Verdict != tc.verdict || r.Kind != tc.kind {
				t.Fatalf("%s (%s), want %s (%s): %s\n%s", r.Verdict, r.Kind, tc.verdict, tc.kind, r.Reason, r.Detail())
			}
			if r.Iterations != iterations || len(r.Points) != iterations-leaks.DefaultWarmup+1 {
				t.Errorf("%d iterations, %d points", r.Iterations, len(r.Points))
			}
		})
	}
}

// TestLongRun: a run of 300 iterations is measured over its last 256.
func TestLongRun(t *testing.T) {
	s := newSynth(t)
	s.alloc("weight", 1<<20, snapshot.CategoryParameter)
	for i := range int32(300) {
		s.iteration(i)
		s.alloc("kept", 1024, snapshot.CategoryTemporary)
	}
	r := leaks.Find(s.snapshot())
	if r.Verdict != leaks.Leak || len(r.Points) != 257 || r.Points[0].Iteration != 43 || r.Points[1].Iteration != 44 || r.LeakPerIteration != 1024 {
		t.Fatalf("%s, %d points from iteration %d, %d bytes per iteration", r.Verdict, len(r.Points), r.Points[0].Iteration, r.LeakPerIteration)
	}
	if !strings.Contains(r.Reason, "over iterations 44-299") {
		t.Errorf("reason %q", r.Reason)
	}
}

// TestIncomplete covers snapshots that cannot show growth per iteration.
func TestIncomplete(t *testing.T) {
	short := mlp(train.BugRetainGraph)
	short.Steps = 3
	medium, err := train.PresetConfig("gpt2-medium") // runs out of memory in its first forward
	if err != nil {
		t.Fatal(err)
	}
	medium.Steps = 2
	imported := newSynth(t)
	imported.iter, imported.phase = 0, snapshot.PhaseNone
	for range 10 {
		imported.alloc("x", 1024, snapshot.CategoryUnknown)
	}
	tests := map[string]struct {
		s          *snapshot.Snapshot
		opts       []leaks.Option
		iterations int
		reason     string
	}{
		"too short":               {leakstest.Record(t, short), nil, 3, "inconclusive: 3 complete iterations with a warm-up of 2; need 2 or more after it"},
		"too short for warm-up 7": {leakstest.Record(t, mlp("")), []leaks.Option{leaks.Warmup(7)}, 8, "inconclusive: 8 complete iterations with a warm-up of 7; need 2 or more after it"},
		"out of memory":           {leakstest.Record(t, medium), nil, 0, "inconclusive: 0 complete iterations with a warm-up of 2; need 2 or more after it"},
		"no markers":              {imported.snapshot(), nil, 1, "inconclusive: 1 complete iteration with a warm-up of 2; need 2 or more after it (the snapshot has no iteration markers)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := leaks.Find(tc.s, tc.opts...)
			if r.Verdict != leaks.Inconclusive || r.Iterations != tc.iterations || r.Reason != tc.reason || r.Err() != nil {
				t.Errorf("%s, %d iterations, err %v: %q", r.Verdict, r.Iterations, r.Err(), r.Reason)
			}
		})
	}
	// A cut-short file loses its last, unfinished iteration.
	s := leakstest.Record(t, mlp(""))
	cut := *s
	cut.Footer, cut.Events = nil, s.Events[:len(s.Events)-len(s.Events)/10]
	if r := leaks.Find(&cut); r.Iterations >= leaks.Find(s).Iterations {
		t.Errorf("a truncated snapshot keeps all %d iterations", r.Iterations)
	}
}

func TestOptions(t *testing.T) {
	retain := leakstest.Record(t, mlp(train.BugRetainGraph))
	stash := leakstest.Record(t, mlp(train.BugStashActivations))
	const rate = 75*1024 + 512 // the retain-graph leak, bytes per iteration
	tests := map[string]struct {
		s      *snapshot.Snapshot
		opts   []leaks.Option
		fail   bool
		reason string // a substring of the failure's reason
	}{
		"leak fails":                 {retain, nil, true, "leak: allocated memory grows 75.50 KiB per iteration"},
		"under max growth":           {retain, []leaks.Option{leaks.MaxGrowth(rate)}, false, ""},
		"over max growth":            {retain, []leaks.Option{leaks.MaxGrowth(rate - 1)}, true, ", over the limit of 75.50 KiB per iteration"},
		"peak under limit":           {stash, []leaks.Option{leaks.MaxPeak(1 << 30), leaks.MaxGrowth(1 << 20)}, false, ""},
		"peak over limit":            {stash, []leaks.Option{leaks.MaxPeak(100 << 10), leaks.MaxGrowth(1 << 20)}, true, "peak: allocated memory peaked at "},
		"peak and leak":              {stash, []leaks.Option{leaks.MaxPeak(100 << 10)}, true, "; peak: allocated memory peaked at "},
		"scopes ignored":             {stash, []leaks.Option{leaks.IgnoreScopes("net")}, false, ""},
		"scope prefix is a module":   {stash, []leaks.Option{leaks.IgnoreScopes("ne")}, true, "leak: "},
		"one scope of two ignored":   {stash, []leaks.Option{leaks.IgnoreScopes("net.1")}, true, "32.00 KiB per iteration"},
		"function ignored, short":    {stash, []leaks.Option{leaks.IgnoreFunctions("nn.(*ReLU).Forward")}, false, ""},
		"function ignored, full":     {stash, []leaks.Option{leaks.IgnoreFunctions("github.com/oomdbg/oomdbg/workloads/nn.(*ReLU).Forward")}, false, ""},
		"function not on the stacks": {stash, []leaks.Option{leaks.IgnoreFunctions("nn.(*Linear).Forward")}, true, "leak: "},
		"category ignored":           {stash, []leaks.Option{leaks.IgnoreCategories(snapshot.CategoryActivation)}, false, ""},
		"filter keeps none":          {retain, []leaks.Option{leaks.Filter(func(s *leaks.Suspect) bool { return s.Scope == "nowhere" })}, false, ""},
		"filter keeps one": {retain, []leaks.Option{leaks.Filter(func(s *leaks.Suspect) bool { return s.Category == snapshot.CategoryInput })},
			true, "leak: allocated memory grows 8.50 KiB per iteration"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := leaks.Verify(tc.s, tc.opts...)
			if (err != nil) != tc.fail {
				t.Fatalf("Verify = %v, want failure %v", err, tc.fail)
			}
			if err == nil {
				return
			}
			f, ok := err.(*leaks.Failure)
			if !ok {
				t.Fatalf("error %T, want *leaks.Failure", err)
			}
			if !strings.Contains(f.Reason, tc.reason) || strings.Contains(f.Reason, "\n") {
				t.Errorf("reason %q, want one line containing %q", f.Reason, tc.reason)
			}
			if first, _, _ := strings.Cut(err.Error(), "\n"); first != f.Reason {
				t.Errorf("the error's first line is %q, want the reason", first)
			}
		})
	}
}

// recorder is a TestingT that keeps what a check reports.
type recorder struct {
	helper int
	errors []string
}

func (r *recorder) Helper() { r.helper++ }
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func TestCheck(t *testing.T) {
	tests := map[string]struct {
		cfg  train.Config
		fail bool
	}{
		"fixed":        {mlp(""), false},
		"retain-graph": {mlp(train.BugRetainGraph), true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var rec recorder
			leaks.Check(&rec, leakstest.Record(t, tc.cfg))
			if rec.helper == 0 {
				t.Error("Check did not mark itself a helper")
			}
			if (len(rec.errors) > 0) != tc.fail {
				t.Fatalf("errors %q, want failure %v", rec.errors, tc.fail)
			}
			if tc.fail {
				lines := strings.Split(rec.errors[0], "\n")
				if !strings.HasPrefix(lines[0], "leak: ") || !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "retained by loss_history[6]") }) {
					t.Errorf("failure:\n%s", rec.errors[0])
				}
			}
		})
	}
}

func TestIterationList(t *testing.T) {
	r := leaks.Find(leakstest.Record(t, mlp(train.BugRetainGraph)))
	if got := r.Suspects[0].Survivors; !slices.Equal(got, []int32{0, 1, 2, 3, 4, 5, 6, 7}) {
		t.Fatalf("survivors %v", got)
	}
	if !strings.Contains(r.Detail(), "left alive by iterations 0-7\n") {
		t.Errorf("detail:\n%s", r.Detail())
	}
}

func TestRetainerShort(t *testing.T) {
	r := leaks.RetainerPath{Path: []string{"a saved x", "a", "b", "c", "d", "root"}, Root: "root"}
	tests := map[int]string{
		0: "root > d > c > b > a > a saved x",
		6: "root > d > c > b > a > a saved x",
		5: "root > d > (2 more) > a > a saved x",
	}
	for max, want := range tests {
		if got := r.Short(max); got != want {
			t.Errorf("Short(%d) = %q, want %q", max, got, want)
		}
	}
}
