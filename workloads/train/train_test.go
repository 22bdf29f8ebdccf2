package train

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tracer"
)

// fixedClock makes recorded times reproducible.
func fixedClock() tracer.Option {
	var t int64
	return tracer.WithClock(func() int64 { t += 100; return t })
}

func record(t *testing.T, cfg Config) (*Result, *snapshot.Snapshot) {
	t.Helper()
	var buf bytes.Buffer
	res, err := Record(context.Background(), cfg, &buf, RecordOptions{ToolVersion: "test", Tracer: []tracer.Option{fixedClock()}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if s.Warning != nil || s.Footer == nil {
		t.Fatalf("snapshot incomplete: warning %v, footer %v", s.Warning, s.Footer)
	}
	return res, s
}

func TestMLPLearnsOnCPU(t *testing.T) {
	cfg := DefaultMLP()
	cfg.Device, cfg.Steps, cfg.EvalEvery = "cpu", 150, 50
	res, _, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := mean(res.Losses[:10])
	last := mean(res.Losses[len(res.Losses)-10:])
	if last > first/4 {
		t.Errorf("loss went from %.3f to %.3f; want it to fall at least fourfold", first, last)
	}
	if chance := 1 / float32(cfg.Classes); res.Accuracy < 0.9 {
		t.Errorf("accuracy %.2f after %d steps (chance %.2f); want >= 0.9", res.Accuracy, res.Steps, chance)
	}
}

func mean(x []float32) float32 {
	var s float32
	for _, v := range x {
		s += v
	}
	return s / float32(len(x))
}

func TestMetaAndCPURecordTheSameAllocations(t *testing.T) {
	cfg := DefaultMLP()
	cfg.Steps, cfg.EvalEvery = 3, 2
	cfg.Device = "meta"
	_, meta := record(t, cfg)
	cfg.Device = "cpu"
	_, cpu := record(t, cfg)
	if meta.Events.Len() != cpu.Events.Len() {
		t.Fatalf("meta recorded %d events, cpu %d", meta.Events.Len(), cpu.Events.Len())
	}
	for i := range meta.Events.Len() {
		m, c := meta.Events.At(i), cpu.Events.At(i)
		if m.Action != c.Action || m.Addr != c.Addr || m.Size != c.Size || m.BlockSize != c.BlockSize ||
			m.Phase != c.Phase || m.Iteration != c.Iteration || m.Category != c.Category ||
			meta.String(m.Scope) != cpu.String(c.Scope) || meta.String(m.Label) != cpu.String(c.Label) ||
			meta.String(m.Text) != cpu.String(c.Text) || m.Holder != c.Holder || m.Parent != c.Parent {
			t.Fatalf("event %d differs:\nmeta %+v\n cpu %+v", i, m, c)
		}
	}
	if meta.Footer.Summary.PeakAllocated != cpu.Footer.Summary.PeakAllocated {
		t.Errorf("peaks differ: meta %d, cpu %d", meta.Footer.Summary.PeakAllocated, cpu.Footer.Summary.PeakAllocated)
	}
}

// iterationEnds returns allocated bytes at the end of each iteration.
func iterationEnds(res *Result) []int64 {
	var ends []int64
	for i, p := range res.Phases {
		if p.Iteration >= 0 && (i+1 == len(res.Phases) || res.Phases[i+1].Iteration != p.Iteration) {
			ends = append(ends, p.End)
		}
	}
	return ends
}

func TestLeakBugsGrowAndFixedPathsStayFlat(t *testing.T) {
	const steps, warmup = 8, 2
	tests := map[string]struct {
		bug    string
		leaks  bool
		holder string // a retainer the last heap dump must name
	}{
		"fixed":             {bug: "", leaks: false},
		"eval-no-grad":      {bug: BugEvalNoGrad, leaks: true, holder: "eval_outputs[7]"},
		"retain-graph":      {bug: BugRetainGraph, leaks: true, holder: "loss_history[7]"},
		"stash-activations": {bug: BugStashActivations, leaks: true, holder: "activation_stash[15]"},
		"tensor-loss-sum":   {bug: BugTensorLossSum, leaks: false, holder: "total_loss"},
		"no-zero-grad":      {bug: BugNoZeroGrad, leaks: false, holder: "net.0.weight.grad"},
		"module-attribute":  {bug: BugModuleAttribute, leaks: false, holder: "net.0.intermediate"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := DefaultMLP()
			cfg.Steps, cfg.Bug = steps, tc.bug
			res, s := record(t, cfg)
			ends := iterationEnds(res)
			if len(ends) != steps {
				t.Fatalf("%d iteration ends, want %d", len(ends), steps)
			}
			growth := ends[warmup+1] - ends[warmup]
			for i := warmup + 1; i < steps; i++ {
				if d := ends[i] - ends[i-1]; d != growth {
					t.Errorf("iteration %d grew %d bytes, iteration %d grew %d: growth is not constant", i, d, warmup+1, growth)
				}
			}
			if tc.leaks && growth <= 0 {
				t.Errorf("bug %q: allocated memory does not grow (%v)", tc.bug, ends)
			}
			if !tc.leaks && growth != 0 {
				t.Errorf("%q: allocated memory grows %d bytes per iteration (%v); want flat", name, growth, ends)
			}
			if tc.holder != "" && !lastDumpNames(s, tc.holder) {
				t.Errorf("the last heap dump names no holder %q", tc.holder)
			}
		})
	}
}

// lastDumpNames reports whether the last heap dump has a retainer described as holder.
func lastDumpNames(s *snapshot.Snapshot, holder string) bool {
	last := -1
	for i, e := range s.Events.All() {
		if e.Action == snapshot.ActionHeapDump {
			last = i
		}
	}
	for _, e := range s.Events.Slice(last+1, s.Events.Len()) {
		if e.Action == snapshot.ActionRetain && s.String(e.Text) == holder {
			return true
		}
	}
	return false
}

func TestOOMInEachPhaseLeavesAWholeSnapshot(t *testing.T) {
	// A wide MLP with Adam: growing the device from too small to enough moves the OOM from the forward pass
	// to backward to the first optimizer step (where Adam allocates its state).
	cfg := DefaultMLP()
	cfg.InFeatures, cfg.Hidden, cfg.Layers, cfg.Classes, cfg.Batch, cfg.Steps = 1024, 2048, 3, 16, 2048, 2
	cfg.ContextReserve = 0
	seen := map[snapshot.Phase]bool{}
	for mem := uint64(64 << 20); mem <= 512<<20 && len(seen) < 3; mem += 4 << 20 {
		cfg.GPUMemory = mem
		res, s := record(t, cfg)
		if res.OOM == nil {
			continue
		}
		p := res.OOM.Phase
		if p != snapshot.PhaseForward && p != snapshot.PhaseBackward && p != snapshot.PhaseOptimizer {
			continue
		}
		if seen[p] {
			continue
		}
		seen[p] = true
		t.Run(fmt.Sprintf("%s at %d MiB", p, mem>>20), func(t *testing.T) {
			var oom, dump int
			for _, e := range s.Events.All() {
				switch {
				case e.Action == snapshot.ActionOOM:
					oom++
					if e.Phase != p {
						t.Errorf("oom event in phase %v, want %v", e.Phase, p)
					}
				case e.Action == snapshot.ActionHeapDump && s.String(e.Text) == "oom":
					dump++
				}
			}
			if oom != 1 || dump != 1 {
				t.Errorf("%d oom events and %d oom heap dumps, want 1 and 1", oom, dump)
			}
			if s.Footer.Summary.ByAction["oom"] != 1 || len(s.Footer.Segments) == 0 {
				t.Errorf("footer summary %+v with %d segments", s.Footer.Summary, len(s.Footer.Segments))
			}
			if p == snapshot.PhaseOptimizer && res.OOM.Iteration != 0 {
				t.Errorf("optimizer OOM at iteration %d, want the first step", res.OOM.Iteration)
			}
		})
	}
	for _, p := range []snapshot.Phase{snapshot.PhaseForward, snapshot.PhaseBackward, snapshot.PhaseOptimizer} {
		if !seen[p] {
			t.Errorf("no device size between 64 and 512 MiB made the run OOM in %v", p)
		}
	}
}

func TestInterruptedRunLeavesAWholeSnapshot(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var buf bytes.Buffer
	cfg := DefaultMLP()
	res, err := Record(ctx, cfg, &buf, RecordOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Interrupted || res.Steps != 0 {
		t.Errorf("result %+v, want interrupted before the first step", res)
	}
	s, err := snapshot.Read(&buf)
	if err != nil || s.Footer == nil {
		t.Fatalf("snapshot after interrupt: %v, footer %v", err, s.Footer)
	}
	if !slices.ContainsFunc(s.Events.Slice(0, s.Events.Len()), func(e snapshot.Event) bool {
		return e.Action == snapshot.ActionHeapDump && s.String(e.Text) == "interrupted"
	}) {
		t.Error("no heap dump at the interruption")
	}
}

func TestTinyGPTLearnsOnCPU(t *testing.T) {
	cfg, err := PresetConfig("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Device, cfg.Steps, cfg.Batch = "cpu", 100, 8
	res, _, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, last := mean(res.Losses[:5]), mean(res.Losses[len(res.Losses)-5:])
	if uniform := float32(math.Log(float64(cfg.Vocab))); first < 0.8*uniform || last > first*0.6 {
		t.Errorf("loss %.3f -> %.3f over %d steps (uniform guessing %.3f); want it to fall by 40%%", first, last, res.Steps, uniform)
	}
}

// peakWith returns what base peaks at with a fix applied, failing the test when the run errs or runs out.
func peakWith(t *testing.T, base Config) func(mod func(c *Config)) int64 {
	return func(mod func(c *Config)) int64 {
		t.Helper()
		c := base
		mod(&c)
		res, _, err := Run(context.Background(), c, nil)
		if err != nil || res.OOM != nil {
			t.Fatalf("run %+v: %v %v", c, err, res.OOM)
		}
		return res.PeakAllocated
	}
}

// TestFixesLowerThePeak runs a GPT-2-small-shaped model on a device too big to run out, once per fix, and
// checks each fix lowers the peak the way PyTorch users see it move.
func TestFixesLowerThePeak(t *testing.T) {
	base, _ := PresetConfig("gpt2-small")
	base.Layers, base.Seq, base.Batch, base.Steps, base.GPUMemory = 4, 512, 8, 2, 1<<40
	peak := peakWith(t, base)
	none := peak(func(*Config) {})
	for name, mod := range map[string]func(c *Config){
		"flash attention":        func(c *Config) { c.Attention = knob.AttentionFlash },
		"bf16 autocast":          func(c *Config) { c.AMP = knob.AMPBF16 },
		"fp16 autocast":          func(c *Config) { c.AMP = knob.AMPFP16 },
		"checkpoint every block": func(c *Config) { c.Checkpoint = knob.CheckpointAll },
		"checkpoint attention":   func(c *Config) { c.Checkpoint = knob.CheckpointAttention },
		"checkpoint every 2nd":   func(c *Config) { c.Checkpoint = knob.CheckpointEvery(2) },
		"quarter batch x4":       func(c *Config) { c.Batch, c.Accum = 2, 4 },
		"sgd instead of adamw":   func(c *Config) { c.Optimizer = "sgd" },
	} {
		t.Run(name, func(t *testing.T) {
			if p := peak(mod); p >= none {
				t.Errorf("peak %s with the fix, %s without", units.FormatSize(p), units.FormatSize(none))
			}
		})
	}
	all := peak(func(c *Config) {
		c.Checkpoint, c.AMP, c.Attention = knob.CheckpointEvery(2), knob.AMPBF16, knob.AttentionFlash
	})
	some := peak(func(c *Config) { c.AMP, c.Attention = knob.AMPBF16, knob.AttentionFlash })
	if all >= some {
		t.Errorf("adding checkpointing to bf16 and flash does not lower the peak (%d >= %d)", all, some)
	}
}

func TestDefaultWorkloadOOMsAndFixesMakeItFit(t *testing.T) {
	cfg, _ := PresetConfig(DefaultPreset)
	cfg.Steps = 2
	res, _, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.OOM == nil {
		t.Fatalf("the default workload fits in %s (peak %s); it must OOM as configured",
			units.FormatSize(int64(cfg.GPUMemory)), units.FormatSize(res.PeakAllocated))
	}
	cfg.AMP, cfg.Attention, cfg.Checkpoint = knob.AMPBF16, knob.AttentionFlash, knob.CheckpointAll
	res, _, err = Run(context.Background(), cfg, nil)
	if err != nil || res.OOM != nil {
		t.Fatalf("with bf16, flash attention and checkpointing: %v %+v", err, res.OOM)
	}
}

func TestRecordFeedsTheRecorderFromOnStart(t *testing.T) {
	cfg := DefaultMLP()
	cfg.Steps = 2
	var stopped bool
	var buf bytes.Buffer
	_, err := Record(context.Background(), cfg, &buf, RecordOptions{OnStart: func(rec *tracer.Recorder) func() {
		rec.Sample(0, "nvml.used", 3<<30)
		return func() { stopped = true; rec.Sample(0, "nvml.used", 4<<30) }
	}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var samples []int64
	for _, e := range s.Events.All() {
		if e.Action == snapshot.ActionSample && s.String(e.Text) == "nvml.used" {
			samples = append(samples, e.Size)
		}
	}
	if !stopped || !slices.Equal(samples, []int64{3 << 30, 4 << 30}) {
		t.Errorf("stopped %v, samples %v; want the start and the stop readings recorded", stopped, samples)
	}
}
