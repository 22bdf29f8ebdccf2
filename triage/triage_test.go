package triage_test

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
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/charmbracelet/x/exp/golden"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/snapshot/torch"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/workloads/train"
)

func mlp(bug string) train.Config {
	cfg := train.DefaultMLP()
	cfg.Steps, cfg.Bug = 8, bug
	return cfg
}

func preset(name string, steps int) train.Config {
	cfg, err := train.PresetConfig(name)
	if err != nil {
		panic(err)
	}
	cfg.Device, cfg.Steps = "meta", steps
	return cfg
}

func recorded(cfg train.Config) func() ([]byte, error) {
	return func() ([]byte, error) {
		data, _, err := leakstest.Encode(context.Background(), cfg)
		return data, err
	}
}

// fixtures are the snapshots the golden reports are made from. They are files in testdata/fixtures, so
// that the reports do not change when the workload's code does; `go test ./triage/ -update` records them
// again.
var fixtures = map[string]func() ([]byte, error){
	"retain-graph": recorded(mlp(train.BugRetainGraph)),
	"fixed":        recorded(mlp("")),
	"oom":          recorded(preset("gpt2-medium", 2)),
	"fragmentation": func() ([]byte, error) {
		var buf bytes.Buffer
		err := leakstest.EncodeFragmentation(&buf, 6)
		return buf.Bytes(), err
	},
	"imported": imported,
}

// updating reports whether the golden files are being rewritten (the golden package's -update flag).
// recordFixtures re-records the frozen inputs in testdata/fixtures from today's runtime. Apart from -update,
// which regenerates golden files from those inputs: a change to the screens or reports never re-records what
// they are drawn from.
var recordFixtures = flag.Bool("record-fixtures", false, "re-record the frozen snapshots in testdata/fixtures")

func recordingFixtures() bool { return *recordFixtures }

func fixture(t *testing.T, name string) *snapshot.Snapshot {
	t.Helper()
	path := filepath.Join("testdata", "fixtures", name+".oomdbg")
	if recordingFixtures() {
		data, err := fixtures[name]()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := snapshot.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// imported is a snapshot shaped like one imported from PyTorch: no phases, no iterations, no categories or
// labels, no heap dumps, event indices for time, frees of blocks allocated before the trace began, no
// device capacity, Python stacks, and an OOM.
func imported() ([]byte, error) {
	var buf bytes.Buffer
	meta := snapshot.Meta{Tool: "pytorch", Source: "pytorch", TimeUnit: "index",
		Devices: []snapshot.DeviceInfo{{Index: 0, Name: "cuda:0", Kind: "unknown"}}}
	w, err := snapshot.NewWriter(&buf, meta)
	if err != nil {
		return nil, err
	}
	frame := func(fn, file string, line int) snapshot.FrameID { return w.InternFrame(fn, file, line) }
	alloc := w.InternFrame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long, CUstream_st*)", "??", 0)
	stacks := []snapshot.StackID{
		w.InternStack([]snapshot.FrameID{alloc, frame("forward", "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py", 125), frame("train_step", "train.py", 42)}),
		w.InternStack([]snapshot.FrameID{alloc, frame("_conv_forward", "/usr/lib/python3/dist-packages/torch/nn/modules/conv.py", 549), frame("train_step", "train.py", 41)}),
	}
	var evs []snapshot.Event
	add := func(e snapshot.Event) { e.Time = int64(len(evs)); evs = append(evs, e) }
	// Blocks from before the trace began are freed first.
	for i := range 3 {
		addr := uint64(0x7f00_0000_0000 + i*0x100000)
		add(snapshot.Event{Action: snapshot.ActionFreeRequested, Addr: addr, Size: 1 << 20, BlockSize: 1 << 20})
		add(snapshot.Event{Action: snapshot.ActionFreeCompleted, Addr: addr, Size: 1 << 20, BlockSize: 1 << 20})
	}
	add(snapshot.Event{Action: snapshot.ActionSegmentAlloc, Addr: 0x7f10_0000_0000, Size: 20 << 20, Stack: stacks[0]})
	next := uint64(0x7f10_0000_0000)
	for i := range 12 {
		size := int64(1+i%3) << 20
		add(snapshot.Event{Action: snapshot.ActionAlloc, Addr: next, Size: size - 100, BlockSize: size, Stack: stacks[i%2]})
		next += uint64(size)
	}
	add(snapshot.Event{Action: snapshot.ActionOOM, Size: 40 << 20, BlockSize: 40 << 20, DeviceFree: 12 << 20, Stack: stacks[0]})
	for i := range evs {
		if err := w.Write(&evs[i]); err != nil {
			return nil, err
		}
	}
	if err := w.Close(&snapshot.Footer{}); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// sweep is a Measurer that returns fixed measurements, as the command line's sweep would.
type sweep struct {
	m   *triage.Measurements
	err error
}

func (s sweep) Measure(context.Context, *snapshot.Snapshot) (*triage.Measurements, error) {
	return s.m, s.err
}

// gptSweep is a measurement of the GPT fixture's fixes in round figures, after README.md's table of the
// default workload on a 24 GiB card (23.50 GiB for the allocator): "bf16 + flash + checkpoint every 2nd block"
// ran without an OOM but reserved 23.49 GiB, inside the headroom rule's margin.
var gptSweep = sweep{m: &triage.Measurements{Note: "re-run on the meta device, 2 steps per fix", Rows: []triage.Measurement{
	{Fix: "as configured", PeakAllocated: 22 << 30, PeakReserved: 23 << 30, OOM: true, OOMPhase: "forward", NeedsAllocated: 61 << 30},
	{Fix: "flash attention", PeakAllocated: 23 << 30, PeakReserved: 23<<30 + 512<<20, OOM: true, OOMPhase: "forward", NeedsAllocated: 37 << 30},
	{Fix: "bf16 autocast", PeakAllocated: 22 << 30, PeakReserved: 23 << 30, OOM: true, OOMPhase: "forward", NeedsAllocated: 63 << 30},
	{Fix: "checkpoint every block", PeakAllocated: 15 << 30, PeakReserved: 21 << 30, NeedsAllocated: 15 << 30},
	{Fix: "bf16 + flash + checkpoint every 2nd block", PeakAllocated: 21 << 30, PeakReserved: 23<<30 + 500<<20, NeedsAllocated: 21 << 30},
	{Fix: "bf16 + flash + checkpoint every block + SGD", PeakAllocated: 12 << 30, PeakReserved: 16 << 30, NeedsAllocated: 12 << 30},
}}}

// reports are the golden reports: each fixture, with a measurer where the workload could be re-run.
var reports = map[string]triage.Measurer{
	"retain-graph":  nil,
	"oom":           gptSweep,
	"fragmentation": nil,
	"imported":      sweep{err: fmt.Errorf("%w: it was imported from PyTorch", triage.ErrNotMeasurable)},
}

func report(t *testing.T, name string, m triage.Measurer) *triage.Report {
	t.Helper()
	return triage.Analyze(context.Background(), timeline.New(fixture(t, name)), triage.Options{File: name + ".oomdbg", Measurer: m})
}

// TestGolden pins the text, markdown and JSON reports of the fixtures. After an intended change, run
// `go test ./triage/ -update` and review the diff of testdata.
func TestGolden(t *testing.T) {
	for name, m := range reports {
		t.Run(name, func(t *testing.T) {
			r := report(t, name, m)
			for format, write := range map[string]func(*bytes.Buffer) error{
				"text":     func(b *bytes.Buffer) error { return r.WriteText(b) },
				"markdown": func(b *bytes.Buffer) error { return r.WriteMarkdown(b) },
				"json":     func(b *bytes.Buffer) error { return r.WriteJSON(b) },
			} {
				t.Run(format, func(t *testing.T) {
					var buf bytes.Buffer
					if err := write(&buf); err != nil {
						t.Fatal(err)
					}
					golden.RequireEqual(t, buf.Bytes())
				})
			}
		})
	}
}

func TestGoldenDiff(t *testing.T) {
	c := triage.Diff(report(t, "retain-graph", nil), report(t, "fixed", nil))
	for format, write := range map[string]func(*bytes.Buffer) error{
		"text":     func(b *bytes.Buffer) error { return c.WriteText(b) },
		"markdown": func(b *bytes.Buffer) error { return c.WriteMarkdown(b) },
	} {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			if err := write(&buf); err != nil {
				t.Fatal(err)
			}
			golden.RequireEqual(t, buf.Bytes())
		})
	}
}

// loadSchema compiles docs/report-json.schema.json (JSON Schema draft 2020-12).
func loadSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	s, err := jsonschema.NewCompiler().Compile(filepath.Join("..", "docs", "report-json.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// validate checks the JSON document doc against s.
func validate(s *jsonschema.Schema, doc []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return err
	}
	return s.Validate(v)
}

// TestSchema validates the JSON report of recordings of every kind against the documented schema.
func TestSchema(t *testing.T) {
	schema := loadSchema(t)
	evalEvery := mlp("")
	evalEvery.EvalEvery = 2
	accum := preset("tiny", 3)
	accum.Accum, accum.Batch = 2, 8
	snaps := map[string]func(t *testing.T) *snapshot.Snapshot{
		"retain-graph":     func(t *testing.T) *snapshot.Snapshot { return fixture(t, "retain-graph") },
		"oom":              func(t *testing.T) *snapshot.Snapshot { return fixture(t, "oom") },
		"fragmentation":    func(t *testing.T) *snapshot.Snapshot { return fixture(t, "fragmentation") },
		"imported":         func(t *testing.T) *snapshot.Snapshot { return fixture(t, "imported") },
		"eval":             func(t *testing.T) *snapshot.Snapshot { return leakstest.Record(t, evalEvery) },
		"tiny accumulated": func(t *testing.T) *snapshot.Snapshot { return leakstest.Record(t, accum) },
		"stash":            func(t *testing.T) *snapshot.Snapshot { return leakstest.Record(t, mlp(train.BugStashActivations)) },
		"generated":        func(t *testing.T) *snapshot.Snapshot { return snapshottest.Trace(snapshottest.Tiny()) },
		"empty":            func(t *testing.T) *snapshot.Snapshot { return &snapshot.Snapshot{Strings: []string{""}} },
	}
	for name, snap := range snaps {
		t.Run(name, func(t *testing.T) {
			for _, m := range []triage.Measurer{nil, gptSweep} {
				r := triage.Analyze(context.Background(), timeline.New(snap(t)), triage.Options{Measurer: m})
				var buf bytes.Buffer
				if err := r.WriteJSON(&buf); err != nil {
					t.Fatal(err)
				}
				if err := validate(schema, buf.Bytes()); err != nil {
					t.Fatalf("the report does not match docs/report-json.schema.json:\n%v", err)
				}
			}
		})
	}
}

// pytorchFixtures returns the PyTorch snapshots of the repository (snapshot/torch/testdata, one per schema
// generation) and the real ones (torchtest).
func pytorchFixtures(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "snapshot", "torch", "testdata", "snapshots", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no generated PyTorch snapshots in snapshot/torch/testdata (%v)", err)
	}
	for _, name := range torchtest.Fixtures {
		files = append(files, torchtest.FixturePath(t, name))
	}
	return files
}

// TestSchemaPyTorch validates the report of every PyTorch snapshot fixture, imported by snapshot/torch,
// against the schema, and renders it in every format.
func TestSchemaPyTorch(t *testing.T) {
	files := pytorchFixtures(t)
	schema := loadSchema(t)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			s, err := torch.ImportFile(file)
			if err != nil {
				t.Fatal(err)
			}
			r := triage.Analyze(context.Background(), timeline.New(s), triage.Options{File: filepath.Base(file)})
			var buf bytes.Buffer
			if err := r.WriteJSON(&buf); err != nil {
				t.Fatal(err)
			}
			if err := validate(schema, buf.Bytes()); err != nil {
				t.Fatalf("the report does not match docs/report-json.schema.json:\n%v", err)
			}
			if r.Source.Origin != "pytorch" || r.Peak.Allocated <= 0 || len(r.Iterations) == 0 {
				t.Errorf("origin %q, peak %d, %d iterations", r.Source.Origin, r.Peak.Allocated, len(r.Iterations))
			}
			if err := r.WriteText(io.Discard); err != nil {
				t.Fatal(err)
			}
			if err := r.WriteMarkdown(io.Discard); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSchemaBites checks that the schema test would notice a report that drifted from it.
func TestSchemaBites(t *testing.T) {
	schema := loadSchema(t)
	var buf bytes.Buffer
	if err := report(t, "oom", gptSweep).WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	drifts := map[string]func(m map[string]any){
		"field added":   func(m map[string]any) { m["peak"].(map[string]any)["peak_active"] = 1 },
		"field removed": func(m map[string]any) { delete(m["oom"].(map[string]any), "free") },
		"renamed":       func(m map[string]any) { m["iteration_list"] = m["iterations"]; delete(m, "iterations") },
		"wrong type":    func(m map[string]any) { m["leaks"].(map[string]any)["verdict"] = true },
		"bad category":  func(m map[string]any) { m["peak"].(map[string]any)["by_category"].(map[string]any)["weights"] = 0 },
		"old format":    func(m map[string]any) { m["format"] = "oomdbg-report/0" },
	}
	for name, drift := range drifts {
		t.Run(name, func(t *testing.T) {
			var m map[string]any
			if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
				t.Fatal(err)
			}
			drift(m)
			data, _ := json.Marshal(m)
			if err := validate(schema, data); err == nil {
				t.Error("the schema accepts a drifted report")
			}
		})
	}
}

// TestSchemaDocumented checks that docs/report-json.md documents every field of the schema.
func TestSchemaDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "report-json.md"))
	if err != nil {
		t.Fatal(err)
	}
	var walk func(v any)
	missing := map[string]bool{}
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if props, ok := v["properties"].(map[string]any); ok {
				for name := range props {
					if !bytes.Contains(doc, []byte("`"+name+"`")) {
						missing[name] = true
					}
				}
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	for _, file := range []string{"report-json.schema.json", "report-json-check.schema.json"} {
		data, err := os.ReadFile(filepath.Join("..", "docs", file))
		if err != nil {
			t.Fatal(err)
		}
		var schema any
		if err := json.Unmarshal(data, &schema); err != nil {
			t.Fatal(err)
		}
		walk(schema)
	}
	if len(missing) > 0 {
		t.Errorf("docs/report-json.md does not document %v", missing)
	}
}

// TestAgainstTheAllocator compares the report with what the run itself measured: the allocator's peak per
// phase, the footer's summary and PyTorch's OOM message as the runtime raised it.
func TestAgainstTheAllocator(t *testing.T) {
	small := mlp("")
	small.Batch, small.GPUMemory, small.ContextReserve = 4096, 40<<20, 8<<20 // runs out of memory in its first steps
	accum := preset("tiny", 3)
	accum.Accum, accum.Batch = 2, 8
	tests := map[string]train.Config{
		"mlp retain-graph":  mlp(train.BugRetainGraph),
		"mlp eval":          func() train.Config { c := mlp(""); c.EvalEvery = 3; return c }(),
		"mlp small card":    small,
		"tiny accumulated":  accum,
		"gpt2-medium (OOM)": preset("gpt2-medium", 2),
		"tiny bf16 flash": func() train.Config {
			c := preset("tiny", 3)
			c.AMP, c.Attention, c.Checkpoint = knob.AMPBF16, knob.AttentionFlash, knob.CheckpointAll
			return c
		}(),
	}
	for name, cfg := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			data, res, err := leakstest.Encode(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			s, err := snapshot.Read(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			r := triage.Analyze(context.Background(), timeline.New(s), triage.Options{})
			sum := s.Footer.Summary
			if r.Peak.Allocated != sum.PeakAllocated || r.Peak.Event != int(sum.PeakAllocatedSeq) || r.Peak.Reserved != sum.PeakReserved {
				t.Errorf("peak %d at %d, reserved %d; the recorder's summary %d at %d, reserved %d",
					r.Peak.Allocated, r.Peak.Event, r.Peak.Reserved, sum.PeakAllocated, sum.PeakAllocatedSeq, sum.PeakReserved)
			}
			if r.Peak.Allocated != res.PeakAllocated {
				t.Errorf("peak %d, the allocator's %d", r.Peak.Allocated, res.PeakAllocated)
			}
			var byCat int64
			for _, n := range r.Peak.ByCategory {
				byCat += n
			}
			if byCat != r.Peak.Allocated {
				t.Errorf("categories at the peak sum to %d, the peak is %d", byCat, r.Peak.Allocated)
			}
			// Every phase of every iteration, against the allocator's statistics of that phase.
			var phases []triage.Phase
			var its []int32
			for _, it := range r.Iterations {
				for _, p := range it.Phases {
					if p.Name == "recompute" { // inside backward: the run's statistics count it there
						continue
					}
					phases = append(phases, p)
					its = append(its, it.Iteration)
				}
			}
			if len(phases) != len(res.Phases) {
				t.Fatalf("%d phases, the run had %d", len(phases), len(res.Phases))
			}
			if cfg.Checkpoint != knob.CheckpointOff {
				for _, it := range r.Iterations[1:] {
					i := slices.IndexFunc(it.Phases, func(p triage.Phase) bool { return p.Name == "backward" })
					if i < 0 || i+1 >= len(it.Phases) || it.Phases[i+1].Name != "recompute" ||
						it.Phases[i+1].PeakAllocated > it.Phases[i].PeakAllocated || it.Phases[i+1].EndEvent > it.Phases[i].EndEvent {
						t.Errorf("iteration %d: no recompute summary inside backward: %+v", it.Iteration, it.Phases)
					}
				}
			}
			for i, want := range res.Phases {
				got := phases[i]
				if its[i] != int32(want.Iteration) || got.Name != want.Phase.String() || got.PeakAllocated != want.Peak || got.EndAllocated != want.End {
					t.Errorf("phase %d: iteration %d %s peak %d end %d; the allocator: iteration %d %s peak %d end %d",
						i, its[i], got.Name, got.PeakAllocated, got.EndAllocated, want.Iteration, want.Phase, want.Peak, want.End)
				}
			}
			switch {
			case res.OOM == nil && r.OOM != nil:
				t.Errorf("an OOM the run did not have: %s", r.OOM.Message)
			case res.OOM != nil && r.OOM == nil:
				t.Errorf("the run ran out of memory, the report says nothing")
			case res.OOM != nil:
				if r.OOM.Message != res.OOM.Message || !r.OOM.Exact {
					t.Errorf("OOM message\n%q\nthe runtime raised\n%q", r.OOM.Message, res.OOM.Message)
				}
				if r.OOM.Phase != res.OOM.Phase.String() || r.OOM.Iteration != int32(res.OOM.Iteration) || r.OOM.Label != res.OOM.Tensor {
					t.Errorf("OOM in %d %s allocating %q; the run: %d %s %q", r.OOM.Iteration, r.OOM.Phase, r.OOM.Label,
						res.OOM.Iteration, res.OOM.Phase, res.OOM.Tensor)
				}
			}
		})
	}
}

func TestAdvice(t *testing.T) {
	oom := fixture(t, "oom")
	tests := map[string]struct {
		m        triage.Measurer
		measured bool
		note     string // a regular expression
		first    string // the fix of the largest saving
	}{
		"no measurer":    {nil, false, `^estimated from what was alive at the peak; no measurement was asked for$`, "checkpoint every block"},
		"measured":       {gptSweep, true, `^measured: re-run on the meta device, 2 steps per fix; `, "bf16 + flash + checkpoint every block + SGD"},
		"not measurable": {sweep{err: fmt.Errorf("%w: imported", triage.ErrNotMeasurable)}, false, `; not measured: .*imported$`, "checkpoint every block"},
		"failed":         {sweep{err: errors.New("disk full")}, false, `; measuring failed: disk full$`, "checkpoint every block"},
		"empty":          {sweep{m: &triage.Measurements{}}, false, `; the measurement returned nothing$`, "checkpoint every block"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := triage.Analyze(context.Background(), timeline.New(oom), triage.Options{Measurer: tc.m})
			if !regexp.MustCompile(tc.note).MatchString(r.AdviceNote) {
				t.Errorf("note %q", r.AdviceNote)
			}
			if len(r.Advice) == 0 || r.Advice[0].Fix != tc.first {
				t.Fatalf("advice %+v, want %q first", r.Advice, tc.first)
			}
			for i, a := range r.Advice {
				if i > 0 && a.Saving > r.Advice[i-1].Saving {
					t.Errorf("advice not sorted by saving: %q after %q", a.Fix, r.Advice[i-1].Fix)
				}
				if a.Metric == "allocated" && a.Measured != tc.measured {
					t.Errorf("%s: measured %v", a.Fix, a.Measured)
				}
				if a.Measured != (a.PeakAfter != nil && a.Fits != nil) {
					t.Errorf("%s: measured %v with peak after %v, fits %v", a.Fix, a.Measured, a.PeakAfter, a.Fits)
				}
			}
		})
	}
	// Measured savings are the drop in what the run needs; bf16 alone needs more here, a negative saving.
	r := triage.Analyze(context.Background(), timeline.New(oom), triage.Options{Measurer: gptSweep})
	for _, a := range r.Advice {
		if a.Fix == "bf16 autocast" && a.Saving != -(2<<30) {
			t.Errorf("bf16 autocast saves %d, want -2 GiB", a.Saving)
		}
		if a.Fix == "checkpoint every block" && (a.Saving != 46<<30 || !*a.Fits || *a.PeakAfter != 15<<30) {
			t.Errorf("checkpointing: %+v", a)
		}
	}
}

// TestImported checks that a snapshot without phases, categories, heap dumps or device capacity is
// explained with what it has.
func TestImported(t *testing.T) {
	r := report(t, "imported", nil)
	if len(r.Iterations) != 1 || len(r.Iterations[0].Phases) != 1 || r.Iterations[0].Phases[0].Name != "none" {
		t.Errorf("iterations %+v, want one pseudo-iteration of one phase", r.Iterations)
	}
	if r.Leaks.Verdict != "inconclusive" || r.Source.UnmatchedFrees != 3 || r.Source.Origin != "pytorch" {
		t.Errorf("leaks %s, unmatched frees %d, origin %s", r.Leaks.Verdict, r.Source.UnmatchedFrees, r.Source.Origin)
	}
	if r.OOM == nil || r.OOM.Exact || !strings.HasPrefix(r.OOM.Message, "CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 had 12.00 MiB free.") {
		t.Errorf("OOM %+v", r.OOM)
	}
	if r.Peak.Allocated != 24<<20 || r.Peak.ByCategory["unknown"] != 24<<20 {
		t.Errorf("peak %d, unknown %d", r.Peak.Allocated, r.Peak.ByCategory["unknown"])
	}
	if got := r.Peak.ByStack[0].Frames; len(got) != 2 || got[0] != "forward linear.py:125" {
		t.Errorf("the largest stack starts %q, want the Python frames", got)
	}
}

func TestTorchSizeInMessage(t *testing.T) {
	// PyTorch's format_size bounds are inclusive: exactly 1 MiB prints as 1024.00 KiB.
	s := &snapshot.Snapshot{
		Meta: snapshot.Meta{Source: "oomdbg", Devices: []snapshot.DeviceInfo{{Kind: "cuda", Capacity: 1 << 30}}},
		Events: snapshot.EventsOf([]snapshot.Event{
			{Action: snapshot.ActionAlloc, Addr: 0x1000, Size: 1024, BlockSize: 1024},
			{Seq: 1, Action: snapshot.ActionSegmentAlloc, Addr: 0x1000, Size: 1 << 20},
			{Seq: 2, Action: snapshot.ActionOOM, Size: 1 << 20, BlockSize: 1 << 20, DeviceFree: 1 << 30},
		}...),
	}
	r := triage.Analyze(context.Background(), timeline.New(s), triage.Options{})
	want := "CUDA out of memory. Tried to allocate 1024.00 KiB. GPU 0 has a total capacity of 1024.00 MiB of which 1024.00 MiB is free. " +
		"Of the allocated memory 1024 bytes is allocated by PyTorch, and 1023.00 KiB is reserved by PyTorch but unallocated."
	if !strings.HasPrefix(r.OOM.Message, want) {
		t.Errorf("message\n%q\nwant it to start\n%q", r.OOM.Message, want)
	}
}

// TestLeakFixComesFirst: a leaky run's fixes begin with fixing the leak, with the code change; measured, it
// saves what the run's peak holds above the run without its leak bug.
func TestLeakFixComesFirst(t *testing.T) {
	withoutLeak := int64(400 << 10)
	m := sweep{m: &triage.Measurements{Note: "re-run", Rows: []triage.Measurement{
		{Fix: "as configured", PeakAllocated: withoutLeak, NeedsAllocated: withoutLeak},
		{Fix: "bf16 autocast", PeakAllocated: 300 << 10, NeedsAllocated: 300 << 10},
	}}}
	for name, ms := range map[string]triage.Measurer{"estimated": nil, "measured": m} {
		r := report(t, "retain-graph", ms)
		a := r.Advice[0]
		if a.Fix != "fix the leak" || !strings.Contains(a.Why, "loss_history.append(loss.item())") {
			t.Errorf("%s: the first fix is %q: %s", name, a.Fix, a.Why)
		}
		if name == "measured" && (!a.Measured || a.Saving != r.Peak.Allocated-withoutLeak || *a.PeakAfter != withoutLeak) {
			t.Errorf("measured: saving %d, needs %v; want %d and %d", a.Saving, a.PeakAfter, r.Peak.Allocated-withoutLeak, withoutLeak)
		}
	}
	if r := report(t, "fixed", nil); len(r.Advice) > 0 && r.Advice[0].Fix == "fix the leak" {
		t.Error("a run without a leak is told to fix one")
	}
}
