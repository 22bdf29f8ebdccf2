package leaks_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/export"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/snapshot/torch"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// torchLoop writes a PyTorch memory snapshot (the JSON form of _dump_snapshot's dict) of a training loop as
// PyTorch records it: no categories, phases only as the frames of allocations and, when regions is set,
// ProfilerStep#N and Optimizer.step# / Optimizer.zero_grad# record_function regions. Each step allocates
// activations in forward (a module's __call__ on the stack), frees them in backward, and writes two
// gradients: new blocks on the first step, or every step once zero_grad freed them, else new gradients
// added into the old ones and freed; the first optimizer step allocates Adam's state, and each
// step a temporary. zeroGrad is what the loop does after each step: "none" (set_to_none=True:
// frees the gradients from zero_grad), "zero" (set_to_none=False: zeroes them in place, which allocates
// and frees nothing) or "" (no zero_grad). With leak set, one activation of each step is never freed (a
// loss kept in a list keeps its graph). The model's weights are moved to the device before the first step
// (Module.to, whose frames are Module._apply's).
func torchLoop(t *testing.T, steps int, zeroGrad string, regions bool) *snapshot.Snapshot {
	t.Helper()
	return torchTrace(t, loopConfig{steps: steps, zeroGrad: zeroGrad, profilerSteps: regions, optimizerRegions: regions})
}

// loopConfig is the training loop torchTrace records.
type loopConfig struct {
	steps    int
	zeroGrad string
	// profilerSteps: ProfilerStep#N regions (torch.profiler's schedule); optimizerRegions: the
	// Optimizer.step# and Optimizer.zero_grad# regions torch.optim records around every step since 2.0.
	profilerSteps, optimizerRegions bool
	leak                            bool
}

func torchTrace(t *testing.T, cfg loopConfig) *snapshot.Snapshot {
	t.Helper()
	steps, zeroGrad := cfg.steps, cfg.zeroGrad
	type frame struct {
		Filename string `json:"filename"`
		Line     int    `json:"line"`
		Name     string `json:"name"`
	}
	const torchDir = "/usr/lib/python3/dist-packages/torch/"
	train := frame{"/work/train.py", 30, "<module>"}
	forward := []frame{{"/work/model.py", 12, "forward"}, {torchDir + "nn/modules/module.py", 1194, "_call_impl"}, train}
	backward := []frame{{torchDir + "autograd/__init__.py", 197, "backward"}, {torchDir + "_tensor.py", 487, "backward"}, train}
	adam := []frame{{torchDir + "optim/adam.py", 350, "_single_tensor_adam"}, {torchDir + "optim/optimizer.py", 140, "wrapper"}, train}
	zero := []frame{{torchDir + "optim/optimizer.py", 264, "zero_grad"}, train}
	toDevice := []frame{{torchDir + "nn/modules/module.py", 664, "_apply"}, {torchDir + "nn/modules/module.py", 987, "to"}, train}

	type entry struct {
		Action string  `json:"action"`
		Addr   uint64  `json:"addr"`
		Size   int64   `json:"size"`
		Stream int     `json:"stream"`
		Time   int64   `json:"time_us"`
		Frames []frame `json:"frames"`
	}
	type annotation struct {
		Stage  string `json:"stage"`
		Name   string `json:"name"`
		Device int    `json:"device"`
		Time   int64  `json:"time_us"`
	}
	var trace []entry
	var notes []annotation
	now := int64(1_700_000_000_000_000)
	const segment = 0x7f00_0000_0000
	next := uint64(segment)
	add := func(action string, addr uint64, size int64, frames []frame) {
		now++
		trace = append(trace, entry{action, addr, size, 0, now, frames})
	}
	alloc := func(size int64, frames []frame) uint64 {
		a := next
		next += uint64(size)
		add("alloc", a, size, frames)
		return a
	}
	free := func(a uint64, size int64, frames []frame) {
		add("free_requested", a, size, frames)
		add("free_completed", a, size, frames)
	}
	region := func(name string, start bool) {
		if strings.HasPrefix(name, "ProfilerStep#") && cfg.profilerSteps || !strings.HasPrefix(name, "ProfilerStep#") && cfg.optimizerRegions {
			now++
			stage := "END"
			if start {
				stage = "START"
			}
			notes = append(notes, annotation{stage, name, 0, now})
		}
	}
	add("segment_alloc", segment, 2<<20, forward)
	alloc(64<<10, toDevice) // the model's weights, before the first step
	alloc(16<<10, toDevice)
	var grads []uint64
	for step := range steps {
		region("ProfilerStep#"+itoa(step), true)
		acts := []uint64{alloc(8<<10, forward), alloc(8<<10, forward)}
		if cfg.leak {
			acts = acts[1:]
		}
		for _, a := range acts {
			free(a, 8<<10, backward)
		}
		if grads == nil {
			grads = []uint64{alloc(64<<10, backward), alloc(16<<10, backward)}
		} else { // AccumulateGrad adds each new gradient into .grad, then frees it
			free(alloc(64<<10, backward), 64<<10, backward)
			free(alloc(16<<10, backward), 16<<10, backward)
		}
		region("Optimizer.step#Adam.step", true)
		if step == 0 {
			alloc(64<<10, adam)
			alloc(64<<10, adam)
		}
		free(alloc(64<<10, adam), 64<<10, adam) // denom = exp_avg_sq.sqrt() / ...
		region("Optimizer.step#Adam.step", false)
		switch zeroGrad {
		case "none":
			free(grads[0], 64<<10, zero)
			free(grads[1], 16<<10, zero)
			grads = nil
		case "zero":
			region("Optimizer.zero_grad#Adam.zero_grad", true)
			region("Optimizer.zero_grad#Adam.zero_grad", false)
		}
		region("ProfilerStep#"+itoa(step), false)
	}
	snap := map[string]any{"segments": []any{}, "device_traces": [][]entry{trace}}
	if notes != nil {
		snap["external_annotations"] = notes
	}
	data, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	s, err := torch.Import(data)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestGradientsInPyTorchTraces: in a PyTorch trace, gradients never cleared show as blocks a backward
// allocated that are still allocated when the next backward begins, with no zero_grad between. A
// zero_grad that frees them, or a zero_grad region, clears them; without regions, a trace that never
// shows zero_grad cannot rule out zeroing in place, and the finding says so.
func TestGradientsInPyTorchTraces(t *testing.T) {
	const steps = 6
	tests := map[string]struct {
		zeroGrad string
		regions  bool
		found    bool
		certain  bool
		verdict  leaks.Verdict
	}{
		"set_to_none":                {zeroGrad: "none", regions: true, verdict: leaks.NoLeak},
		"set_to_none without region": {zeroGrad: "none", regions: false, verdict: leaks.NoLeak},
		"zeroed in place":            {zeroGrad: "zero", regions: true, verdict: leaks.NoLeak},
		"never":                      {zeroGrad: "", regions: true, found: true, verdict: leaks.Held},
		"never, no regions":          {zeroGrad: "", regions: false, found: true, verdict: leaks.Held},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := torchLoop(t, steps, tc.zeroGrad, tc.regions)
			r := leaks.Find(s)
			if r.Verdict != tc.verdict {
				t.Errorf("verdict %s, want %s: %s\n%s", r.Verdict, tc.verdict, r.Reason, r.Detail())
			}
			g := r.Gradients
			if (g != nil) != tc.found {
				t.Fatalf("gradients never cleared: %+v, want %v", g, tc.found)
			}
			if g == nil {
				if r.HeldBytes != 0 {
					t.Errorf("%d bytes held:\n%s", r.HeldBytes, r.Detail())
				}
				return
			}
			// Two gradients, 80 KiB, alive across each of the steps but the last, which no backward follows.
			if g.Steps != steps-1 || g.Of != steps-1 || g.Bytes != 80<<10 || g.Blocks != 2 {
				t.Errorf("finding %+v, want %d of %d steps, 80 KiB in 2 blocks", g, steps-1, steps-1)
			}
			caveat := strings.Contains(g.Reason, "unless zero_grad zeroes them in place")
			if g.Certain || !caveat {
				t.Errorf("a trace that never shows zero_grad cannot rule out zeroing in place: certain %v, %q", g.Certain, g.Reason)
			}
			// Without regions the optimizer's frames end each iteration: the same first iteration.
			if g.FirstIteration != 0 || r.HeldBytes != 80<<10 {
				t.Errorf("first iteration %d, %d bytes held, want 0 and the gradients' 80 KiB:\n%s", g.FirstIteration, r.HeldBytes, r.Detail())
			}
			for _, h := range r.Held {
				if h.Bytes == 128<<10 {
					t.Errorf("Adam's state (allocated by the optimizer step) held across iterations:\n%s", r.Detail())
				}
			}
		})
	}
}

// TestLeakInPyTorchTraces: a PyTorch training loop that keeps one activation of every step (a loss kept in a
// list, with its graph) fails the check whatever marks its iterations: ProfilerStep#N, only the
// Optimizer.step# regions torch.optim records, or nothing but the optimizer's frames; the clean loop passes.
// The suspect is the forward allocation, as an activation, at the model's forward. The trace is written
// here, entry by entry as PyTorch records one (frames as Python's traceback names them, torch's own files
// under dist-packages), since a CUDA trace cannot be recorded on this machine.
func TestLeakInPyTorchTraces(t *testing.T) {
	const steps = 8
	marks := map[string]loopConfig{
		"ProfilerStep":          {profilerSteps: true, optimizerRegions: true},
		"Optimizer.step region": {optimizerRegions: true},
		"optimizer frames":      {},
	}
	for name, m := range marks {
		for _, leak := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/leak=%v", name, leak), func(t *testing.T) {
				cfg := m
				cfg.steps, cfg.zeroGrad, cfg.leak = steps, "none", leak
				r := leaks.Find(torchTrace(t, cfg))
				if r.Iterations != steps {
					t.Errorf("%d complete iterations, want %d: %s", r.Iterations, steps, r.Reason)
				}
				if !leak {
					if r.Verdict != leaks.NoLeak {
						t.Errorf("verdict %s, want %s: %s\n%s", r.Verdict, leaks.NoLeak, r.Reason, r.Detail())
					}
					return
				}
				if r.Verdict != leaks.Leak || len(r.Suspects) != 1 {
					t.Fatalf("verdict %s with %d suspects, want one leak: %s\n%s", r.Verdict, len(r.Suspects), r.Reason, r.Detail())
				}
				sp := r.Suspects[0]
				if sp.BytesPerIteration != 8<<10 || sp.Category != snapshot.CategoryActivation || !strings.HasPrefix(sp.Site(), "forward model.py:12") {
					t.Errorf("suspect %d B/iteration of %s at %q, want 8 KiB of activation at forward model.py:12", sp.BytesPerIteration, sp.Category, sp.Site())
				}
			})
		}
	}
}

// TestGradientsThroughPyTorchExport: oomdbg's own runs, exported as PyTorch snapshots (categories per
// entry, ProfilerStep#N, Optimizer.step# and Optimizer.zero_grad# regions, no heap dumps) and imported
// back, read as the runs do: gradients never cleared only without zero_grad, with the same bytes, and
// cleared by a zero_grad that frees them or zeroes them in place.
func TestGradientsThroughPyTorchExport(t *testing.T) {
	tests := map[string]struct {
		bug      string
		zeroGrad knob.ZeroGrad
		found    bool
	}{
		"no-zero-grad":                {bug: train.BugNoZeroGrad, zeroGrad: knob.ZeroGradNone, found: true},
		"zero_grad set_to_none":       {zeroGrad: knob.ZeroGradNone},
		"zero_grad in place":          {zeroGrad: knob.ZeroGradZero},
		"no-zero-grad, accum 2":       {bug: train.BugNoZeroGrad, zeroGrad: knob.ZeroGradNone, found: true},
		"zero_grad in place, accum 2": {zeroGrad: knob.ZeroGradZero},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := mlp(tc.bug)
			cfg.ZeroGrad = tc.zeroGrad
			if strings.HasSuffix(name, "accum 2") {
				cfg.Batch, cfg.Accum = 32, 2
			}
			own := leaks.Find(leakstest.Record(t, cfg))
			var buf bytes.Buffer
			if err := export.Torch(&buf, timeline.New(leakstest.Record(t, cfg))); err != nil {
				t.Fatal(err)
			}
			s, err := torch.Import(buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			r := leaks.Find(s)
			if (own.Gradients != nil) != tc.found || (r.Gradients != nil) != tc.found {
				t.Fatalf("gradients never cleared: recorded %+v, imported %+v; want found %v", own.Gradients, r.Gradients, tc.found)
			}
			if !tc.found {
				return
			}
			g, o := r.Gradients, own.Gradients
			if g.Steps != o.Steps || g.Of != o.Of || g.FirstIteration != o.FirstIteration || g.Blocks != o.Blocks || g.Bytes != o.Bytes {
				t.Errorf("imported %+v, recorded %+v", g, o)
			}
			if r.Verdict != leaks.Held || r.HeldBytes != own.HeldBytes {
				t.Errorf("imported: %s, %d bytes held; recorded %s, %d:\n%s", r.Verdict, r.HeldBytes, own.Verdict, own.HeldBytes, r.Detail())
			}
		})
	}
}

// strippedImport records cfg, exports it as PyTorch's JSON snapshot, strips what PyTorch would not have
// recorded (torchtest.StripToPyTorch) and imports it: the recording and what the import inferred.
func strippedImport(t *testing.T, cfg train.Config) (recorded, imported *snapshot.Snapshot) {
	t.Helper()
	recorded = leakstest.Record(t, cfg)
	var buf bytes.Buffer
	if err := export.TorchJSON(&buf, timeline.New(recorded)); err != nil {
		t.Fatal(err)
	}
	imported, err := torch.Import(torchtest.StripToPyTorch(t, buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	return recorded, imported
}

// TestInferenceAgainstRecording: oomdbg's MLP and GPT workloads, exported to PyTorch's format and stripped
// of the categories, scopes, phase and ProfilerStep regions PyTorch does not record, import with the
// categories and iterations the recording knew. The truth is the recording's own tags, which the
// importer never sees. Accuracy is byte-weighted over every block (whole run) and over the blocks live
// at the peak; parameter, gradient, optimizer_state and activation must each be at least 95% right.
func TestInferenceAgainstRecording(t *testing.T) {
	gptCfg := gpt("")
	gptCfg.Steps = 6
	mlpCfg := mlp("")
	for name, cfg := range map[string]train.Config{"mlp": mlpCfg, "gpt": gptCfg} {
		t.Run(name, func(t *testing.T) {
			rec, imp := strippedImport(t, cfg)
			o, _ := torch.OriginOf(imp)
			if o.CategoriesRecorded || o.Annotations == 0 {
				t.Fatalf("stripped file: categories recorded %v, %d annotations; want none and the optimizer's regions", o.CategoriesRecorded, o.Annotations)
			}
			if o.Iterations != torch.IterationsOptimizerRegions.String() {
				t.Errorf("iterations %q, want %q", o.Iterations, torch.IterationsOptimizerRegions)
			}
			rtl, itl := timeline.New(rec), timeline.New(imp)
			if rtl.Stats().Blocks != itl.Stats().Blocks {
				t.Fatalf("%d blocks imported, %d recorded", itl.Stats().Blocks, rtl.Stats().Blocks)
			}
			// Every block in the same iteration as recorded.
			n := rtl.Stats().Blocks
			wrongIter := 0
			for id := range n {
				ra, ia := rtl.Allocation(id, rtl.Len()-1), itl.Allocation(id, itl.Len()-1)
				if rec.Events.At(ra.Alloc).Iteration != imp.Events.At(ia.Alloc).Iteration {
					wrongIter++
				}
			}
			if wrongIter != 0 {
				t.Errorf("%d of %d blocks in another iteration than recorded", wrongIter, n)
			}
			type tally struct{ right, all int64 }
			whole := map[snapshot.Category]*tally{}
			count := func(m map[snapshot.Category]*tally, want, got snapshot.Category, bytes int64) {
				if m[want] == nil {
					m[want] = &tally{}
				}
				m[want].all += bytes
				if got == want {
					m[want].right += bytes
				}
			}
			for id := range n {
				ra, ia := rtl.Allocation(id, rtl.Len()-1), itl.Allocation(id, itl.Len()-1)
				count(whole, ra.Category, ia.Category, ra.Size)
			}
			peak := map[snapshot.Category]*tally{}
			at := rtl.Peak(timeline.Allocated).Seq
			rlive := rtl.LiveAt(at, nil)
			ilive := itl.LiveAt(itl.Peak(timeline.Allocated).Seq, nil)
			if len(rlive) != len(ilive) {
				t.Fatalf("%d blocks live at the imported peak, %d at the recorded one", len(ilive), len(rlive))
			}
			for k := range rlive {
				count(peak, rlive[k].Category, ilive[k].Category, rlive[k].Size)
			}
			for _, part := range []struct {
				name string
				m    map[snapshot.Category]*tally
			}{{"whole run", whole}, {"at the peak", peak}} {
				for c, tl := range part.m {
					acc := float64(tl.right) / float64(tl.all)
					t.Logf("%s: %s %.1f%% of %d B", part.name, c, 100*acc, tl.all)
					switch c {
					case snapshot.CategoryParameter, snapshot.CategoryGradient, snapshot.CategoryOptimizerState, snapshot.CategoryActivation:
						if acc < 0.95 {
							t.Errorf("%s: %s %.1f%% right, want at least 95%%", part.name, c, 100*acc)
						}
					}
				}
			}
		})
	}
}

// TestLeakThroughStrippedExport: the leaking workloads, exported and stripped as PyTorch would have recorded
// them (no ProfilerStep, no categories), fail the check as their recordings do, with the same leak per
// iteration at the same site; the clean workload passes.
func TestLeakThroughStrippedExport(t *testing.T) {
	for _, bug := range []string{"", train.BugRetainGraph, train.BugStashActivations} {
		t.Run("bug="+bug, func(t *testing.T) {
			rec, imp := strippedImport(t, mlp(bug))
			own, r := leaks.Find(rec), leaks.Find(imp)
			if r.Verdict != own.Verdict {
				t.Fatalf("imported %s (%s), recorded %s (%s)", r.Verdict, r.Reason, own.Verdict, own.Reason)
			}
			if bug == "" {
				if r.Verdict != leaks.NoLeak {
					t.Errorf("clean workload: %s", r.Reason)
				}
				return
			}
			if r.Verdict != leaks.Leak || len(r.Suspects) == 0 {
				t.Fatalf("%s, want a leak:\n%s", r.Reason, r.Detail())
			}
			if r.LeakPerIteration != own.LeakPerIteration || r.Suspects[0].Site() != own.Suspects[0].Site() {
				t.Errorf("imported %d B/iteration at %q, recorded %d B at %q", r.LeakPerIteration, r.Suspects[0].Site(),
					own.LeakPerIteration, own.Suspects[0].Site())
			}
		})
	}
}

// TestPhasesAgainstRecording: the MLP and GPT workloads, exported to PyTorch's format, stripped to what
// PyTorch 2.x records (the optimizer's regions kept), to what PyTorch before 2.0 records (no regions at all),
// and to a snapshot recorded without stacks, import with the iterations the recording knew: every event of
// the trace in its recorded iteration, so every boundary where it was, whatever the source. Where frames
// remain, every event is in its recorded phase, or a neighbour of it is (a phase begins within one event
// of where it began). Events are compared in trace order, without the markers only the recording has.
func TestPhasesAgainstRecording(t *testing.T) {
	gptCfg := gpt("")
	gptCfg.Steps = 6
	strips := []struct {
		name   string
		strip  func(testing.TB, []byte) []byte
		source torch.IterationSource
		phases bool
	}{
		{"pytorch 2", torchtest.StripToPyTorch, torch.IterationsOptimizerRegions, true},
		{"no regions", torchtest.StripRegions, torch.IterationsOptimizerFrames, true},
		{"no stacks", torchtest.StripFrames, torch.IterationsPeriodic, false},
	}
	for name, cfg := range map[string]train.Config{"mlp": mlp(""), "gpt": gptCfg} {
		rec := leakstest.Record(t, cfg)
		var buf bytes.Buffer
		if err := export.TorchJSON(&buf, timeline.New(rec)); err != nil {
			t.Fatal(err)
		}
		for _, st := range strips {
			t.Run(name+"/"+st.name, func(t *testing.T) {
				imp, err := torch.Import(st.strip(t, buf.Bytes()))
				if err != nil {
					t.Fatal(err)
				}
				if o, _ := torch.OriginOf(imp); o.Iterations != st.source.String() {
					t.Errorf("iterations %q, want %q", o.Iterations, st.source)
				}
				re, ie := traceEvents(rec), traceEvents(imp)
				if len(re) != len(ie) {
					t.Fatalf("%d trace events imported, %d recorded", len(ie), len(re))
				}
				wrongIter, wrongPhase, offByOne := 0, 0, 0
				for i := range re {
					if re[i].Iteration != ie[i].Iteration {
						if wrongIter < 5 {
							t.Errorf("event %d (%s): iteration %d, recorded %d", i, re[i].Action, ie[i].Iteration, re[i].Iteration)
						}
						wrongIter++
					}
					if !st.phases || re[i].Phase == ie[i].Phase {
						continue
					}
					if i > 0 && re[i-1].Phase == ie[i].Phase || i+1 < len(re) && re[i+1].Phase == ie[i].Phase {
						offByOne++
						continue
					}
					if wrongPhase < 5 {
						t.Errorf("event %d (%s, iteration %d): %s, recorded %s", i, re[i].Action, re[i].Iteration, ie[i].Phase, re[i].Phase)
					}
					wrongPhase++
				}
				t.Logf("%d events: %d in another iteration, %d in another phase, %d a phase boundary off by one", len(re), wrongIter, wrongPhase, offByOne)
				if wrongIter+wrongPhase > 0 {
					t.Errorf("%d events in another iteration and %d in another phase than recorded", wrongIter, wrongPhase)
				}
			})
		}
	}
}

// traceEvents returns the events a PyTorch trace holds: the allocator's, without the runtime's markers.
func traceEvents(s *snapshot.Snapshot) []snapshot.Event {
	var out []snapshot.Event
	for _, e := range s.Events.All() {
		switch e.Action {
		case snapshot.ActionPhase, snapshot.ActionIteration, snapshot.ActionCategory, snapshot.ActionRetain,
			snapshot.ActionHeapDump, snapshot.ActionSample, snapshot.ActionAnnotation:
			continue
		}
		if !s.Reconstructed(&e) {
			out = append(out, e)
		}
	}
	return out
}
