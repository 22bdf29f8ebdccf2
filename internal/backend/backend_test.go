package backend

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tui"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestTUIBackendAppliesTheFixes records a workload through the TUI's backend with other fixes and on the meta
// device, and reads the configuration back from the snapshot: what the TUI chose is what ran.
func TestTUIBackendAppliesTheFixes(t *testing.T) {
	cfg, err := train.PresetConfig("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Steps, cfg.Device = 1, "cpu"
	w, err := Workload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "tiny on cpu" || !w.GPT || w.Fixes.AMP != cfg.AMP || w.Fixes.Batch != cfg.Batch {
		t.Fatalf("workload %+v does not describe %+v", w, cfg)
	}
	w.Device = "meta"
	w.Fixes.AMP, w.Fixes.Attention, w.Fixes.Checkpoint = knob.AMPBF16, knob.AttentionFlash, knob.CheckpointAll
	w.Fixes.Batch, w.Fixes.Accum = cfg.Batch/2, 2
	s, ran := recordThrough(t, Backend{Version: "test"}, w)
	if ran.Device != "meta" || ran.AMP != knob.AMPBF16 || ran.Attention != knob.AttentionFlash || ran.Checkpoint != knob.CheckpointAll ||
		ran.Batch != cfg.Batch/2 || ran.Accum != 2 || ran.DModel != cfg.DModel || s.Meta.ToolVersion != "test" {
		t.Errorf("recorded %+v (tool %q), want the fixes applied to %+v", ran, s.Meta.ToolVersion, cfg)
	}
	back, err := (Backend{}).Parse(s.Meta.Workload)
	if err != nil {
		t.Fatal(err)
	}
	if back.Fixes != w.Fixes || back.Device != "meta" {
		t.Errorf("parsed back %+v, want %+v on meta", back.Fixes, w.Fixes)
	}
	if _, err := (Backend{}).Parse(json.RawMessage(`{"model":"gpt","amp":"fp8"}`)); err == nil {
		t.Error("a configuration that does not validate parsed")
	}
	var _ tui.Backend = Backend{}
}

// TestTUIBackendAppliesTheAdapterFixes turns a LoRA fine-tune into a full one and a full one into QLoRA with
// bf16 weights and fused AdamW through the TUI's backend: the adapter settings follow the choice, and a
// full fine-tune carries no LoRA alpha (which would not validate).
func TestTUIBackendAppliesTheAdapterFixes(t *testing.T) {
	cfg, err := train.PresetConfig("smollm2-135m")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Steps, cfg.Batch, cfg.Seq, cfg.Layers = 1, 1, 16, 2
	cfg.LoRA, cfg.LoRAAlpha, cfg.LoRATargets = 8, 16, train.DefaultLoRATargets
	w, err := Workload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !w.Llama || w.GPT || w.Fixes.LoRA != 8 || w.Fixes.LoRATargets != train.DefaultLoRATargets || w.Fixes.Weights != train.WeightsBF16 {
		t.Fatalf("workload %+v does not describe %+v", w, cfg)
	}
	record := func(f tui.Fixes) train.Config {
		t.Helper()
		w := w
		w.Fixes = f
		_, ran := recordThrough(t, Backend{}, w)
		return ran
	}
	full := w.Fixes
	full.LoRA, full.LoRATargets = 0, 0
	if ran := record(full); ran.LoRA != 0 || ran.LoRAAlpha != 0 || ran.LoRATargets != 0 || ran.Weights != train.WeightsBF16 {
		t.Errorf("full fine-tune ran %+v", ran)
	}
	qlora := w.Fixes
	qlora.LoRA, qlora.QLoRA, qlora.LoRATargets, qlora.Weights, qlora.OptimizerImpl = 16, true, train.AllLoRATargets, train.WeightsF32, knob.Fused
	if ran := record(qlora); ran.LoRA != 16 || !ran.QLoRA || ran.LoRATargets != train.AllLoRATargets || ran.LoRAAlpha != 16 ||
		ran.Weights != train.WeightsF32 || ran.OptimizerImpl != knob.Fused {
		t.Errorf("QLoRA ran %+v", ran)
	}
}

// recordThrough records w through the backend r and returns the snapshot and the configuration it stored.
func recordThrough(t *testing.T, r Backend, w tui.Workload) (*snapshot.Snapshot, train.Config) {
	t.Helper()
	var out bytes.Buffer
	if err := r.Record(context.Background(), w, &out); err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Read(&out)
	if err != nil {
		t.Fatal(err)
	}
	var ran train.Config
	if err := json.Unmarshal(s.Meta.Workload, &ran); err != nil {
		t.Fatal(err)
	}
	return s, ran
}

// TestTUIBackendAppliesTheStrategy turns a DDP rank into a ZeRO-3 rank that offloads through the TUI's backend.
func TestTUIBackendAppliesTheStrategy(t *testing.T) {
	cfg, err := train.PresetConfig("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Steps, cfg.Device, cfg.Optimizer = 1, "meta", knob.AdamW
	cfg.Parallel = dist.Settings{GPUs: 8, Strategy: dist.DDP}
	w, err := Workload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if w.GPUs != 8 || w.Fixes.Parallel != dist.DDP || w.Fixes.Offload != dist.OffloadNone {
		t.Fatalf("workload %+v does not describe a ddp rank of 8", w)
	}
	w.Fixes.Parallel, w.Fixes.Offload = dist.ZeRO3, dist.OffloadOptimizerParams
	s, ran := recordThrough(t, Backend{}, w)
	if ran.Parallel.Strategy != dist.ZeRO3 || ran.Parallel.Offload != dist.OffloadOptimizerParams || ran.Parallel.GPUs != 8 {
		t.Errorf("ran %+v", ran.Parallel)
	}
	if len(s.Meta.Devices) != 2 || s.Meta.Devices[1].Kind != snapshot.DeviceKindHost {
		t.Errorf("devices %+v, want the GPU and host memory", s.Meta.Devices)
	}
}

// TestTUIBackendMeasuresWhatItApplies measures the fixes of a workload through the TUI's backend: each row's
// settings, applied as the fixes pane applies them, are the configuration the sweep ran, and the figures
// are the sweep's; the first row is the workload without its leak bug.
func TestTUIBackendMeasuresWhatItApplies(t *testing.T) {
	cfg, err := train.PresetConfig("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Steps, cfg.Bug = 2, train.BugRetainGraph
	w, err := Workload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := Backend{}.MeasureFixes(context.Background(), w)
	if err != nil {
		t.Fatal(err)
	}
	sweep, err := train.Sweep(context.Background(), cfg, train.FixesFor(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(sweep) || rows[0].Fixes.Bug != "" {
		t.Fatalf("%d rows (the first with bug %q), the sweep has %d", len(rows), rows[0].Fixes.Bug, len(sweep))
	}
	for i, r := range rows {
		applied := w
		applied.Fixes, applied.Device = r.Fixes, "meta"
		got, err := configOf(applied)
		if err != nil {
			t.Fatal(err)
		}
		got.Steps = sweep[i].Config.Steps // the sweep runs its own number of steps
		if want := sweep[i].Config; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: applied, the settings run\n%+v\nthe sweep ran\n%+v", r.Fix, got, want)
		}
		if r.Fix != sweep[i].Fix || r.Needs != sweep[i].NeedsAllocated || r.Peak != sweep[i].PeakAllocated || r.OOM != (sweep[i].OOM != nil) {
			t.Errorf("%s: %+v, the sweep measured %+v", r.Fix, r, sweep[i])
		}
	}
}
