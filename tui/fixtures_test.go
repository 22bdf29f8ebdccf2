package tui

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// The views are drawn from snapshots frozen in testdata/fixtures, so that the screens change when the TUI
// does, not when the workload runtime does; `go test ./tui -update` records them again from these
// configurations (leakstest.Encode makes the bytes reproducible).
var fixtureConfigs = map[string]func() train.Config{
	// tiny-oom is the tiny GPT with the retain-graph leak on a 40 MiB device: the leak runs it out of memory
	// in the backward pass of its third iteration.
	"tiny-oom": func() train.Config {
		cfg, _ := train.PresetConfig("tiny")
		cfg.Steps, cfg.GPUMemory, cfg.ContextReserve, cfg.Bug = 6, 40<<20, 4<<20, train.BugRetainGraph
		return cfg
	},
	// tiny-oom-fixed is tiny-oom re-run by the fixes pane with bf16 autocast, flash attention and the leak
	// fixed.
	"tiny-oom-fixed": func() train.Config {
		cfg, _ := train.PresetConfig("tiny")
		cfg.Steps, cfg.GPUMemory, cfg.ContextReserve = 6, 40<<20, 4<<20
		cfg.AMP, cfg.Attention, cfg.Device = knob.AMPBF16, knob.AttentionFlash, "meta"
		return cfg
	},
	// tiny-oom-leak-fixed is tiny-oom with its leak fixed, as the fixes pane applies its best fix.
	"tiny-oom-leak-fixed": func() train.Config {
		cfg, _ := train.PresetConfig("tiny")
		cfg.Steps, cfg.GPUMemory, cfg.ContextReserve, cfg.Device = 6, 40<<20, 4<<20, "meta"
		return cfg
	},
	// smollm-ft is a full fine-tune of SmolLM2-135M (its published shape and bf16 weights, 4 of its 30
	// layers, AdamW) on sequences of 64 tokens.
	"smollm-ft": smollmFineTune,
	// smollm-ft-qlora is smollm-ft re-run by the fixes pane as QLoRA of rank 16 on every projection,
	// checkpointing every layer, with the paged 8-bit AdamW.
	"smollm-ft-qlora": func() train.Config {
		cfg := smollmFineTune()
		cfg.LoRA, cfg.QLoRA, cfg.LoRATargets = 16, true, train.AllLoRATargets
		cfg.Checkpoint, cfg.Optimizer = knob.CheckpointAll, knob.PagedAdamW8bit
		return cfg
	},
	// leaky is the MLP with the retain-graph bug: a leak to find.
	"leaky": func() train.Config { return mlpBug(train.BugRetainGraph) },
	// leaky-fixed is leaky with its leak fixed, as the fixes pane applies its best fix.
	"leaky-fixed": func() train.Config { return mlpBug("") },
	// The leak patterns that hold memory without growing it: the MLP keeping its intermediates on its
	// modules, and never calling zero_grad.
	"module-attribute": func() train.Config { return mlpBug(train.BugModuleAttribute) },
	"no-zero-grad":     func() train.Config { return mlpBug(train.BugNoZeroGrad) },
	// gpt-retain-graph is the tiny GPT with the retain-graph leak under nanoGPT's loop, which keeps the
	// logits until the next forward: they hold the newest iteration's graph too, and are held across
	// iterations. Batch 8 tells it from tiny-oom for the playback Backend.
	"gpt-retain-graph": func() train.Config {
		cfg, _ := train.PresetConfig("tiny")
		cfg.Device, cfg.Steps, cfg.Batch, cfg.Bug = "meta", 4, 8, train.BugRetainGraph
		return cfg
	},
}

func smollmFineTune() train.Config {
	cfg, _ := train.PresetConfig("smollm2-135m")
	cfg.Steps, cfg.Batch, cfg.Seq, cfg.Layers = 2, 1, 64, 4
	return cfg
}

// mlpBug is the MLP for 6 steps with a leak bug.
func mlpBug(bug string) train.Config {
	cfg := train.DefaultMLP()
	cfg.Steps, cfg.Bug = 6, bug
	return cfg
}

// updating reports whether the golden files are being rewritten (the golden package's -update flag).
// recordFixtures re-records the frozen inputs in testdata/fixtures from today's runtime. Apart from -update,
// which regenerates golden files from those inputs: a change to the screens or reports never re-records what
// they are drawn from.
var recordFixtures = flag.Bool("record-fixtures", false, "re-record the frozen snapshots in testdata/fixtures")

func recordingFixtures() bool { return *recordFixtures }

var (
	fixtureMu    sync.Mutex
	fixtureBytes = map[string][]byte{}
	fixtureSnaps sync.Map
)

// fixtureData returns the bytes of testdata/fixtures/name.oomdbg, recording it first under -update. It
// returns errors rather than fail a test: Backend.Record calls it from the recording goroutine.
func fixtureData(name string) ([]byte, error) {
	fixtureMu.Lock()
	defer fixtureMu.Unlock()
	if data, ok := fixtureBytes[name]; ok {
		return data, nil
	}
	path := filepath.Join("testdata", "fixtures", name+".oomdbg")
	if recordingFixtures() {
		data, _, err := leakstest.Encode(context.Background(), fixtureConfigs[name]())
		if err != nil {
			return nil, fmt.Errorf("recording %s: %w", name, err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return nil, err
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	fixtureBytes[name] = data
	return data, nil
}

// readFixture returns the snapshot of testdata/fixtures/name.oomdbg.
func readFixture(name string) (*snapshot.Snapshot, error) {
	if s, ok := fixtureSnaps.Load(name); ok {
		return s.(*snapshot.Snapshot), nil
	}
	data, err := fixtureData(name)
	if err != nil {
		return nil, err
	}
	s, err := snapshot.Read(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	fixtureSnaps.Store(name, s)
	return s, nil
}

// fixture returns the snapshot of testdata/fixtures/name.oomdbg.
func fixture(t testing.TB, name string) *snapshot.Snapshot {
	t.Helper()
	s, err := readFixture(name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// playback is a Backend that plays back the frozen recordings: the workload of a fixture, and the re-run
// with other fixes when one was recorded.
type playback struct{}

// workloadSpec is the part of a recorded configuration (Meta.Workload) the TUI sees.
type workloadSpec struct {
	Model      string             `json:"model"`
	Preset     string             `json:"preset"`
	Device     device.Kind        `json:"device"`
	AMP        knob.AMP           `json:"amp"`
	Attention  knob.Attention     `json:"attention"`
	Checkpoint knob.Checkpoint    `json:"checkpoint"`
	Optimizer  knob.Optimizer     `json:"optimizer"`
	ZeroGrad   knob.ZeroGrad      `json:"zero_grad"`
	Batch      int                `json:"batch"`
	Accum      int                `json:"accum"`
	Bug        string             `json:"bug"`
	Impl       knob.OptimizerImpl `json:"optimizer_impl"`
	Weights    train.Weights      `json:"weights"`
	LoRA       int                `json:"lora"`
	QLoRA      bool               `json:"qlora"`
	Targets    train.LoRATargets  `json:"lora_targets"`
}

func (p playback) Parse(spec json.RawMessage) (Workload, error) {
	var c workloadSpec
	if err := json.Unmarshal(spec, &c); err != nil {
		return Workload{}, err
	}
	name := c.Preset
	if name == "" {
		name = c.Model
	}
	return Workload{Name: name + " on " + string(c.Device), GPT: c.Model == "gpt", Llama: c.Model == "llama", Device: c.Device, Spec: spec,
		Fixes: Fixes{AMP: c.AMP, Attention: c.Attention, Checkpoint: c.Checkpoint, Batch: c.Batch, Accum: c.Accum,
			Optimizer: c.Optimizer, OptimizerImpl: c.Impl, ZeroGrad: c.ZeroGrad, Bug: c.Bug,
			Weights: c.Weights, LoRA: c.LoRA, QLoRA: c.QLoRA, LoRATargets: c.Targets}}, nil
}

func (p playback) Record(ctx context.Context, w Workload, out io.Writer) error {
	for name := range fixtureConfigs {
		s, err := readFixture(name)
		if err != nil {
			return err
		}
		got, err := p.Parse(s.Meta.Workload)
		if err == nil && got.Name == w.Name && got.Device == w.Device && got.Fixes == w.Fixes {
			data, err := fixtureData(name)
			if err != nil {
				return err
			}
			_, err = out.Write(data)
			return err
		}
	}
	return fmt.Errorf("no recording of %s with %+v", w.Name, w.Fixes)
}

// workload returns the fixture's workload as the command line would hand it to the TUI.
func workload(t testing.TB, name string) *Workload {
	w, err := playback{}.Parse(fixture(t, name).Meta.Workload)
	if err != nil {
		t.Fatal(err)
	}
	return &w
}

// MeasureFixes plays back the measurements frozen beside a fixture (name.fixes.json), measured again from
// its configuration under -record-fixtures with train.Sweep and the planner's step time, as the command
// line's backend measures.
func (p playback) MeasureFixes(ctx context.Context, w Workload) ([]Measured, error) {
	for name := range fixtureConfigs {
		s, err := readFixture(name)
		if err != nil {
			return nil, err
		}
		got, err := p.Parse(s.Meta.Workload)
		if err != nil || got.Name != w.Name || got.Fixes != w.Fixes {
			continue
		}
		path := filepath.Join("testdata", "fixtures", name+".fixes.json")
		if recordingFixtures() {
			cfg := fixtureConfigs[name]()
			rows, err := train.Sweep(ctx, cfg, train.AdviceFixesFor(cfg))
			if err != nil {
				return nil, err
			}
			gpu, err := fit.LookupGPU(fit.DefaultGPU)
			if err != nil {
				return nil, err
			}
			var out []Measured
			for _, r := range rows {
				spec, err := json.Marshal(r.Config)
				if err != nil {
					return nil, err
				}
				fw, err := p.Parse(spec)
				if err != nil {
					return nil, err
				}
				m := Measured{Fix: r.Fix, Fixes: fw.Fixes, Needs: r.NeedsAllocated, Peak: r.PeakAllocated, OOM: r.OOM != nil,
					Reserved: r.PeakReserved, Usable: fit.Usable(r.Config), StepTime: fit.Measure(fit.Estimate(r.Config, gpu), r.Result, gpu).Total()}
				if r.OOM != nil {
					m.OOMPhase = r.OOM.Phase.String()
				}
				out = append(out, m)
			}
			data, err := json.MarshalIndent(out, "", "  ")
			if err != nil {
				return nil, err
			}
			if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
				return nil, err
			}
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var out []Measured
		return out, json.Unmarshal(data, &out)
	}
	return nil, fmt.Errorf("no measurement of %s with %+v", w.Name, w.Fixes)
}

// Plans says that playback has no plans: none were recorded.
func (playback) Plans(context.Context, Workload) ([]FitPlan, error) {
	return nil, errors.New("the recordings played back hold no plans")
}

// CanPlan reports that playback does not plan.
func (playback) CanPlan() bool { return false }
