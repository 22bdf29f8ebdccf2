package leaks_test

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchrules"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/snapshot"
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

// block is the bytes the caching allocator hands out for a request of n bytes (PyTorch's round_size).
func block(n int) int64 { return int64(torchrules.RoundSize(uint64(n), nil)) }

// mlpGradients is the bytes of the default MLP's gradients, one block per parameter: Linear(32, 128),
// Linear(128, 128), Linear(128, 8), weights and biases in float32.
func mlpGradients() int64 {
	return block(128*32*4) + block(128*4) + block(128*128*4) + block(128*4) + block(8*128*4) + block(8*4)
}

// gptGradients is the bytes of nanoGPT's gradients at cfg's shape, one block per parameter in float32:
// the token embedding (tied to the LM head), the position embedding, per block two LayerNorms, the qkv
// and output projections of attention, the MLP's two linears, and the final LayerNorm.
func gptGradients(cfg train.Config) int64 {
	d, f := cfg.DModel, 4
	sum := block(cfg.Vocab*d*f) + block(cfg.Seq*d*f) + 2*block(d*f)
	for range cfg.Layers {
		sum += 4 * block(d*f)                // ln_1, ln_2
		sum += block(3*d*d*f) + block(3*d*f) // c_attn
		sum += block(d*d*f) + block(d*f)     // attn.c_proj
		sum += block(4*d*d*f) + block(4*d*f) // c_fc
		sum += block(4*d*d*f) + block(d*f)   // mlp.c_proj
	}
	return sum
}

// gptLogits is the bytes of the logits nanoGPT's loop keeps until the next forward: batch x seq x vocab.
func gptLogits(cfg train.Config) int64 { return block(cfg.Batch * cfg.Seq * cfg.Vocab * 4) }

// want is what a leak check must find in a recording.
type want struct {
	verdict leaks.Verdict
	kind    leaks.Kind
	// A suspect with this category, a scope matching scope and a retainer whose root matches root.
	category snapshot.Category
	scope    string
	root     string
	// held is the bytes held across iterations; heldBy, when set, matches the retainer of the largest
	// held group.
	held   int64
	heldBy string
	// gradients: the loop never clears its gradients.
	gradients bool
}

// TestWorkloadBugs records each leak bug of the training runtime, its fixed code path and the negative
// control, on the MLP and on the tiny GPT (whose loop keeps the logits until the next forward, as
// nanoGPT's does), and checks what the analysis finds: the verdict, the kind, a suspect in the right scope
// and category with the right retainer, the bytes held across iterations against the model's shapes, and
// whether gradients are never cleared.
func TestWorkloadBugs(t *testing.T) {
	g := gpt("")
	logits, qkv := gptLogits(g), int64(g.Layers)*block(g.Batch*g.Seq*3*g.DModel*4)
	scalar := block(4) // total_loss, a float32 scalar kept on the device
	tests := map[string]struct {
		cfg  train.Config
		want want
	}{
		"mlp fixed":             {mlp(""), want{verdict: leaks.NoLeak}},
		"mlp tensor-loss-sum":   {mlp(train.BugTensorLossSum), want{verdict: leaks.Held, held: scalar, heldBy: `^total_loss$`}},
		"mlp retain-graph":      {mlp(train.BugRetainGraph), want{verdict: leaks.Leak, kind: leaks.RetainedGraph, category: snapshot.CategoryActivation, scope: `^net\.[13]$`, root: `^loss_history\[6\]$`}},
		"mlp eval-no-grad":      {mlp(train.BugEvalNoGrad), want{verdict: leaks.Leak, kind: leaks.RetainedGraph, category: snapshot.CategoryActivation, scope: `^net\.[13]$`, root: `^eval_outputs\[6\]$`}},
		"mlp stash-activations": {mlp(train.BugStashActivations), want{verdict: leaks.Leak, kind: leaks.StashedOutputs, category: snapshot.CategoryActivation, scope: `^net\.[13]$`, root: `^activation_stash\[1[23]\]$`}},
		"mlp no-zero-grad":      {mlp(train.BugNoZeroGrad), want{verdict: leaks.Held, held: mlpGradients(), heldBy: `^net\.[024]\.(weight|bias) > net\.[024]\.(weight|bias)\.grad$`, gradients: true}},
		"mlp module-attribute":  {mlp(train.BugModuleAttribute), want{verdict: leaks.Held, held: 2*block(64*128*4) + block(64*8*4), heldBy: `^net\.[02]\.intermediate$`}},
		"gpt fixed":             {gpt(""), want{verdict: leaks.Held, held: logits, heldBy: `^logits$`}},
		"gpt tensor-loss-sum":   {gpt(train.BugTensorLossSum), want{verdict: leaks.Held, held: logits + scalar, heldBy: `^logits$`}},
		"gpt retain-graph":      {gpt(train.BugRetainGraph), want{verdict: leaks.Leak, kind: leaks.RetainedGraph, category: snapshot.CategoryActivation, scope: `^transformer\.h\.[01]\.attn$`, root: `^loss_history\[2\]$`, held: logits, heldBy: `^logits$`}},
		"gpt eval-no-grad":      {gpt(train.BugEvalNoGrad), want{verdict: leaks.Leak, kind: leaks.RetainedGraph, category: snapshot.CategoryActivation, scope: `^transformer\.h\.[01]\.mlp\.c_fc$`, root: `^eval_outputs\[2\]$`, held: logits, heldBy: `^logits$`}},
		"gpt stash-activations": {gpt(train.BugStashActivations), want{verdict: leaks.Leak, kind: leaks.StashedOutputs, category: snapshot.CategoryActivation, scope: `^transformer\.h\.[01]$`, root: `^activation_stash\[[45]\]$`, held: logits, heldBy: `^logits$`}},
		"gpt no-zero-grad":      {gpt(train.BugNoZeroGrad), want{verdict: leaks.Held, held: gptGradients(g) + logits, heldBy: `\.grad$`, gradients: true}},
		"gpt module-attribute":  {gpt(train.BugModuleAttribute), want{verdict: leaks.Held, held: qkv + logits, heldBy: `^transformer\.h\.[01]\.attn\.intermediate$`}},
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
			checkHeld(t, r, tc.want)
			if err := r.Err(); (err != nil) != (tc.want.verdict == leaks.Leak) {
				t.Errorf("Err() = %v for a %s verdict", err, r.Verdict)
			}
			if tc.want.verdict != leaks.Leak {
				if len(r.Suspects) != 0 || r.LeakPerIteration != 0 || r.GrowthPerIteration != 0 {
					t.Errorf("%d suspects, %d bytes per iteration, growth %d without a leak", len(r.Suspects), r.LeakPerIteration, r.GrowthPerIteration)
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

// checkHeld checks what is held across iterations and the finding on gradients.
func checkHeld(t *testing.T, r *leaks.Result, w want) {
	t.Helper()
	var sum int64
	for _, h := range r.Held {
		sum += h.Bytes
		if h.Category == snapshot.CategoryParameter || h.Category == snapshot.CategoryOptimizerState ||
			h.Category == snapshot.CategoryGradient && !w.gradients {
			t.Errorf("%s of %s in %s held across iterations", units.FormatSize(h.Bytes), h.Category, h.Scope)
		}
	}
	if r.HeldBytes != w.held || sum != w.held {
		t.Errorf("%d bytes held across iterations (groups sum to %d), want %d:\n%s", r.HeldBytes, sum, w.held, r.Detail())
	}
	if w.heldBy != "" {
		if len(r.Held) == 0 || r.Held[0].RetainedBy == nil || !regexp.MustCompile(w.heldBy).MatchString(r.Held[0].RetainedBy.String()) {
			t.Errorf("the largest held group is not retained by %s:\n%s", w.heldBy, r.Detail())
		} else if r.Verdict == leaks.Held && !strings.Contains(r.Reason, "retained by "+r.Held[0].RetainedBy.Short(4)+")") {
			t.Errorf("reason %q does not name the retainer %s", r.Reason, r.Held[0].RetainedBy.Short(4))
		}
	}
	if r.Verdict == leaks.Held && !strings.HasPrefix(r.Reason, "held across iterations, not a leak: "+units.FormatSize(w.held)+" ") {
		t.Errorf("reason %q", r.Reason)
	}
	if (r.Gradients != nil) != w.gradients {
		t.Fatalf("gradients never cleared: %+v, want %v", r.Gradients, w.gradients)
	}
	if g := r.Gradients; g != nil {
		var grads int64
		for _, h := range r.Held {
			if h.Category == snapshot.CategoryGradient {
				grads += h.Bytes
			}
		}
		if g.Bytes != grads || g.Steps != r.Iterations-1 || g.Of != g.Steps || g.FirstIteration != 0 || !g.Certain ||
			!strings.HasPrefix(g.Reason, "gradients never cleared: ") {
			t.Errorf("gradients finding %+v; %d bytes of gradients held, %d iterations", g, grads, r.Iterations)
		}
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
	for _, opt := range []knob.Optimizer{knob.Adam, knob.AdamW} {
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
	return s.allocBlock(site, size, (size+511)/512*512, cat)
}

// allocBlock allocates size bytes in a block of block bytes, as the caching allocator does when it hands a
// cached block over unsplit.
func (s *synth) allocBlock(site string, size, block int64, cat snapshot.Category) uint64 {
	st, ok := s.frames[site]
	if !ok {
		st = s.w.InternStack([]snapshot.FrameID{s.w.InternFrame(site, "model.py", len(s.frames)+1)})
		s.frames[site] = st
	}
	addr := s.next
	s.next += uint64(block)
	s.emit(snapshot.Event{Action: snapshot.ActionAlloc, Addr: addr, Size: size, BlockSize: block,
		Category: cat, Stack: st, Scope: s.w.InternString("model." + site)})
	return addr
}

func (s *synth) free(addr uint64, size int64) { s.freeBlock(addr, size, (size+511)/512*512) }

func (s *synth) freeBlock(addr uint64, size, bs int64) {
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

// enter begins phase p.
func (s *synth) enter(p snapshot.Phase) {
	s.phase = p
	s.emit(snapshot.Event{Action: snapshot.ActionPhase})
}

// TestGrowthPatterns checks the verdict on loops whose memory grows in the ways that are and are not leaks,
// and what is held across iterations.
func TestGrowthPatterns(t *testing.T) {
	const iterations = 10
	tests := map[string]struct {
		step    func(s *synth, i int32, state map[string]uint64)
		verdict leaks.Verdict
		kind    leaks.Kind
		held    int64
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
			verdict: leaks.Held, held: 1 << 20,
		},
		"grew twice then stopped": {
			step: func(s *synth, i int32, _ map[string]uint64) {
				if i == 3 || i == 4 {
					s.alloc("kept", 1<<20, snapshot.CategoryTemporary)
				}
			},
			verdict: leaks.Held, held: 2 << 20,
		},
		"kept until the next iteration": {
			step: func(s *synth, i int32, st map[string]uint64) {
				if a, ok := st["out"]; ok {
					s.free(a, 4096)
				}
				st["out"] = s.alloc("out", 4096, snapshot.CategoryActivation)
			},
			verdict: leaks.Held, held: 4096,
		},
		"kept until the next iteration, in blocks of varying size": {
			// The allocator hands the 4 MiB request a 4.75 MiB cached block unsplit at iterations 3, 7 and 9
			// (less than 1 MiB would remain): the blocks grow in three steps, the program keeps the same.
			step: func(s *synth, i int32, st map[string]uint64) {
				block := func(i int32) int64 {
					if i == 3 || i == 7 || i == 9 {
						return 19 << 18
					}
					return 4 << 20
				}
				if a, ok := st["out"]; ok {
					s.freeBlock(a, 4<<20, block(i-1))
				}
				st["out"] = s.allocBlock("out", 4<<20, block(i), snapshot.CategoryActivation)
			},
			verdict: leaks.Held, held: 19 << 18,
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
		"a leak beside a held block": {
			step: func(s *synth, i int32, st map[string]uint64) {
				s.alloc("kept", 1024, snapshot.CategoryTemporary)
				if a, ok := st["out"]; ok {
					s.free(a, 4096)
				}
				st["out"] = s.alloc("out", 4096, snapshot.CategoryActivation)
			},
			verdict: leaks.Leak, kind: leaks.Unclassified, held: 4096,
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
			// shrink, the total does not, and all twelve blocks are held.
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
			verdict: leaks.Held, held: 12 * 1024,
		},
		"segments only": {
			step: func(s *synth, i int32, _ map[string]uint64) {
				s.segment(20 << 20)
				s.free(s.alloc("tmp", 4096, snapshot.CategoryTemporary), 4096)
			},
			verdict: leaks.Fragmentation,
		},
		"optimizer state and gradients zeroed in place": {
			step: func(s *synth, i int32, st map[string]uint64) {
				s.enter(snapshot.PhaseBackward)
				if i == 0 {
					s.alloc("grad", 1<<20, snapshot.CategoryGradient)
				}
				s.enter(snapshot.PhaseOptimizer)
				if i == 0 {
					s.alloc("exp_avg", 1<<20, snapshot.CategoryOptimizerState)
				}
				s.enter(snapshot.PhaseZeroGrad)
			},
			verdict: leaks.NoLeak,
		},
		"gradients never cleared": {
			step: func(s *synth, i int32, st map[string]uint64) {
				s.enter(snapshot.PhaseBackward)
				if i == 0 {
					s.alloc("grad", 1<<20, snapshot.CategoryGradient)
				}
				s.enter(snapshot.PhaseOptimizer)
			},
			verdict: leaks.Held, held: 1 << 20,
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
			snap := s.snapshot()
			r := leaks.Find(snap)
			if r.Verdict != tc.verdict || r.Kind != tc.kind {
				t.Fatalf("%s (%s), want %s (%s): %s\n%s", r.Verdict, r.Kind, tc.verdict, tc.kind, r.Reason, r.Detail())
			}
			if r.Iterations != iterations || len(r.Points) != iterations-leaks.DefaultWarmup+1 {
				t.Errorf("%d iterations, %d points", r.Iterations, len(r.Points))
			}
			if r.HeldBytes != tc.held {
				t.Errorf("%d bytes held across iterations, want %d:\n%s", r.HeldBytes, tc.held, r.Detail())
			}
			if err := r.Err(); (err != nil) != (tc.verdict == leaks.Leak) {
				t.Errorf("Err() = %v for a %s verdict", err, r.Verdict)
			}
			if err := leaks.Verify(snap, leaks.MaxHeld(tc.held), leaks.MaxGrowth(1<<30)); err != nil {
				t.Errorf("Verify with MaxHeld(%d) = %v", tc.held, err)
			}
			if tc.held > 0 {
				err := leaks.Verify(snap, leaks.MaxHeld(tc.held-1), leaks.MaxGrowth(1<<30))
				var f *leaks.Failure
				if !errors.As(err, &f) || !strings.HasPrefix(f.Reason, "held: "+units.FormatSize(tc.held)+" held across iterations, over the limit of ") {
					t.Errorf("Verify with MaxHeld(%d) = %v", tc.held-1, err)
				}
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
	cut.Footer, cut.Events = nil, snapshot.EventsOf(s.Events.Slice(0, s.Events.Len()-s.Events.Len()/10)...)
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
