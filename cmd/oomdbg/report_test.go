package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// files are the command tests' snapshots, copied with a few made from them into a directory of their own.
var (
	filesOnce sync.Once
	filesDir  string
	filesErr  error
)

func mlpConfig(bug string) train.Config {
	cfg := train.DefaultMLP()
	cfg.Steps, cfg.Bug = 8, bug
	return cfg
}

func mediumConfig() train.Config {
	cfg, _ := train.PresetConfig("gpt2-medium")
	cfg.Steps = 2
	return cfg
}

// fixtures are the snapshots the command tests read, frozen in testdata/fixtures so that what the tests pin
// changes when the commands do, not when the workload runtime does. `go test ./cmd/oomdbg -update` records
// them again with these recipes: the MLP with the retain-graph bug and fixed, without zero_grad and keeping
// its intermediates on its modules, GPT-2 medium running out of memory, a fragmenting loop, a variable-length
// GPT whose OOM is fragmentation's, and a generated trace (not a workload oomdbg can re-run).
var fixtures = map[string]func() ([]byte, error){
	"leak":       recorded(mlpConfig(train.BugRetainGraph)),
	"fixed":      recorded(mlpConfig("")),
	"oom":        recorded(mediumConfig()),
	"nozerograd": recorded(mlpConfig(train.BugNoZeroGrad)),
	"attribute":  recorded(mlpConfig(train.BugModuleAttribute)),
	// The variable-length run that runs out of memory from fragmentation (varlenConfig).
	"varlen": recorded(varlenConfig()),
	"frag": func() ([]byte, error) {
		var b bytes.Buffer
		err := leakstest.EncodeFragmentation(&b, 6)
		return b.Bytes(), err
	},
	"generated": func() ([]byte, error) {
		var b bytes.Buffer
		err := snapshottest.Encode(&b, snapshottest.Tiny())
		return b.Bytes(), err
	},
}

func recorded(cfg train.Config) func() ([]byte, error) {
	return func() ([]byte, error) {
		data, _, err := leakstest.Encode(context.Background(), cfg)
		return data, err
	}
}

// updating reports whether the golden package's -update flag is set: then the fixtures are recorded again.
// recordFixtures re-records the frozen inputs in testdata/fixtures from today's runtime. Apart from -update,
// which regenerates golden files from those inputs: a change to the screens or reports never re-records what
// they are drawn from.
var recordFixtures = flag.Bool("record-fixtures", false, "re-record the frozen snapshots in testdata/fixtures")

func recordingFixtures() bool { return *recordFixtures }

// testFiles returns a directory holding the fixtures (name.oomdbg), a file cut short (cut.oomdbg), one
// damaged part-way (damaged.oomdbg) and one that is not a snapshot (text.txt).
func testFiles(t *testing.T) string {
	t.Helper()
	filesOnce.Do(func() {
		files := map[string][]byte{}
		for name, record := range fixtures {
			path := filepath.Join("testdata", "fixtures", name+".oomdbg")
			if recordingFixtures() {
				data, err := record()
				if err == nil {
					err = os.WriteFile(path, data, 0o644)
				}
				if err != nil {
					filesErr = fmt.Errorf("recording %s: %w", name, err)
					return
				}
			}
			data, err := os.ReadFile(path)
			if err != nil {
				filesErr = err
				return
			}
			files[name+".oomdbg"] = data
		}
		fixed := files["fixed.oomdbg"]
		damaged := bytes.Clone(fixed)
		damaged[len(damaged)*3/5] ^= 0xff
		files["cut.oomdbg"], files["damaged.oomdbg"], files["text.txt"] = fixed[:len(fixed)/2], damaged, []byte("not a snapshot\n")
		if filesDir, filesErr = os.MkdirTemp("", "oomdbg-cmd-test-"); filesErr != nil {
			return
		}
		for name, data := range files {
			if filesErr = os.WriteFile(filepath.Join(filesDir, name), data, 0o644); filesErr != nil {
				return
			}
		}
	})
	if filesErr != nil {
		t.Fatal(filesErr)
	}
	return filesDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if filesDir != "" {
		os.RemoveAll(filesDir)
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// runCmd runs the command line and returns the exit code, stdout and stderr.
func runCmd(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// loadSchemaFile compiles the schema docs/name (JSON Schema draft 2020-12), or the part of it at ref (a JSON
// pointer such as "#/$defs/leaks"; "" for all of it).
func loadSchemaFile(t *testing.T, name, ref string) *jsonschema.Schema {
	t.Helper()
	s, err := jsonschema.NewCompiler().Compile(filepath.Join("..", "..", "docs", name) + ref)
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

func TestReportCommand(t *testing.T) {
	dir := testFiles(t)
	f := func(name string) string { return filepath.Join(dir, name) }
	tests := map[string]struct {
		args   []string
		code   int
		stdout []string // substrings
		stderr string   // the one line stderr holds, "" for none
	}{
		"text": {args: []string{f("leak.oomdbg")}, code: exitProblem, stderr: "oomdbg: " + f("leak.oomdbg") + " leaks: " + strings.TrimPrefix(strings.Split(leakVerdict, " (")[0], "leak: "),
			stdout: []string{"oomdbg report: " + f("leak.oomdbg"), "\nPEAK  " + mib(leakPeak) + " allocated at event", "\nPHASES", "\nGAPS", "\nLEAKS\n  " + strings.Split(leakVerdict, ".go:")[0], ", retained by loss_history[6])\n",
				"retained by loss_history[6] >", "\nFIXES (estimated from what was alive at the peak; no measurement was asked for)"}},
		"markdown": {args: []string{f("oom.oomdbg"), "--format", "markdown"}, code: exitProblem,
			stderr: "oomdbg: " + f("oom.oomdbg") + ": the run ran out of memory in iteration 0, forward",
			stdout: []string{"## oomdbg report: `", "### Out of memory\n\n```\nCUDA out of memory. Tried to allocate " + mib(oomTried) + ".", "| iteration | phase | peak | at end | change |"}},
		"generated: not measurable": {args: []string{f("generated.oomdbg"), "--measure-fixes"}, code: exitOK,
			stdout: []string{"FIXES (estimated from what was alive at the peak; not measured: the snapshot does not describe a workload oomdbg can re-run: its workload configuration is not one oomdbg runs"}},
		"cut short": {args: []string{f("cut.oomdbg")}, code: exitOK, stdout: []string{"cut short"}},
		"damaged": {args: []string{f("damaged.oomdbg")}, code: exitOK, stdout: []string{"cut short: " + f("damaged.oomdbg") + ": snapshot:"},
			stderr: "prefix:oomdbg: warning: " + f("damaged.oomdbg") + ": snapshot: "},
		"fixed":   {args: []string{f("fixed.oomdbg")}, code: exitOK, stdout: []string{"no leak"}},
		"held":    {args: []string{f("attribute.oomdbg")}, code: exitOK, stdout: []string{"held across iterations"}},
		"warm-up": {args: []string{f("leak.oomdbg"), "--warmup", "7"}, code: exitOK, stdout: []string{"inconclusive: 8 complete iterations with a warm-up of 7"}},
		"bad format": {args: []string{f("leak.oomdbg"), "--format", "yaml"}, code: exitUsage,
			stderr: `oomdbg: unknown format "yaml" (want text, markdown or json)`},
		"missing":      {args: []string{f("nothere.oomdbg")}, code: exitUsage, stderr: "oomdbg: open " + f("nothere.oomdbg") + ": no such file or directory"},
		"not snapshot": {args: []string{f("text.txt")}, code: exitUsage, stderr: "oomdbg: " + f("text.txt") + " is neither an oomdbg snapshot nor a PyTorch memory snapshot (pickle or JSON)"},
		"no file":      {args: nil, code: exitUsage, stderr: "oomdbg: give a snapshot file, or several: the ranks of a job"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runCmd(append([]string{"report"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, stderr)
			}
			for _, s := range tc.stdout {
				if !strings.Contains(stdout, s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout)
				}
			}
			if prefix, ok := strings.CutPrefix(tc.stderr, "prefix:"); ok {
				if !strings.HasPrefix(stderr, prefix) || strings.Count(stderr, "\n") != 1 {
					t.Errorf("stderr %q, want one line starting %q", stderr, prefix)
				}
			} else if tc.stderr != "" && stderr != tc.stderr+"\n" {
				t.Errorf("stderr %q, want the one line %q", stderr, tc.stderr)
			}
		})
	}
}

// TestReportMeasures checks the measured savings against a sweep of the workload the snapshot recorded.
func TestReportMeasures(t *testing.T) {
	dir := testFiles(t)
	code, stdout, stderr := runCmd("report", filepath.Join(dir, "oom.oomdbg"), "--format", "json", "--measure-fixes")
	if code != exitProblem {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if err := validate(loadSchemaFile(t, "report-json.schema.json", ""), []byte(stdout)); err != nil {
		t.Fatalf("the report does not match the schema: %v", err)
	}
	var r triage.Report
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	// The workload the snapshot recorded, which the report re-runs: the frozen file's, not today's preset.
	var recorded train.Config
	if err := json.Unmarshal(readFixture(t, "oom").Meta.Workload, &recorded); err != nil {
		t.Fatal(err)
	}
	rows, err := train.Sweep(context.Background(), recorded, train.Fixes)
	if err != nil {
		t.Fatal(err)
	}
	measured := map[string]triage.Advice{}
	settings := map[string]triage.Advice{}
	for _, a := range r.Advice {
		switch {
		case a.Measured && a.Metric == "allocated":
			measured[a.Fix] = a
		case a.Measured:
			settings[a.Fix] = a
		}
	}
	if len(measured) != len(rows)-1 || !strings.HasPrefix(r.AdviceNote, "measured: the workload re-run with each fix on the meta device, 2 steps each") {
		t.Fatalf("%d measured fixes, the sweep has %d; note %q", len(measured), len(rows)-1, r.AdviceNote)
	}
	for _, row := range rows[1:] {
		a, ok := measured[row.Fix]
		if !ok {
			t.Errorf("no advice for %q", row.Fix)
			continue
		}
		if a.Saving != rows[0].NeedsAllocated-row.NeedsAllocated || *a.PeakAfter != row.NeedsAllocated || *a.Fits != (row.OOM == nil) {
			t.Errorf("%s: saving %d, needs %d, fits %v; the sweep: %d, %d, %v", row.Fix, a.Saving, *a.PeakAfter, *a.Fits,
				rows[0].NeedsAllocated-row.NeedsAllocated, row.NeedsAllocated, row.OOM == nil)
		}
	}
	// The allocator settings and empty_cache, over the recorded steps, on the configured device.
	srows, err := train.SweepSettings(context.Background(), recorded, train.SettingsFixesFor(recorded))
	if err != nil {
		t.Fatal(err)
	}
	if len(settings) != len(srows)-1 || r.FragmentationRule == nil {
		t.Fatalf("%d measured settings, the sweep has %d; rule %+v", len(settings), len(srows)-1, r.FragmentationRule)
	}
	for _, row := range srows[1:] {
		a, ok := settings[row.Fix]
		if !ok {
			t.Errorf("no advice for %q", row.Fix)
			continue
		}
		if a.Saving != srows[0].PeakReserved-row.PeakReserved || *a.PeakAfter != row.PeakReserved || *a.Fits != (row.OOM == nil) {
			t.Errorf("%s: saving %d, peak reserved %d, fits %v; the sweep: %d, %d, %v", row.Fix, a.Saving, *a.PeakAfter, *a.Fits,
				srows[0].PeakReserved-row.PeakReserved, row.PeakReserved, row.OOM == nil)
		}
	}
}

// TestReportJSONSchema validates the JSON report of every kind of snapshot the command reads, PyTorch
// snapshots included, against docs/report-json.schema.json.
func TestReportJSONSchema(t *testing.T) {
	dir := testFiles(t)
	schema := loadSchemaFile(t, "report-json.schema.json", "")
	files := []string{"leak.oomdbg", "fixed.oomdbg", "oom.oomdbg", "frag.oomdbg", "generated.oomdbg", "cut.oomdbg"}
	for i := range files {
		files[i] = filepath.Join(dir, files[i])
	}
	torch, _ := filepath.Glob(filepath.Join("..", "..", "snapshot", "torch", "testdata", "snapshots", "*"))
	if len(torch) == 0 {
		t.Error("no PyTorch snapshots in snapshot/torch/testdata/snapshots")
	}
	for _, file := range append(files, torch...) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			code, stdout, stderr := runCmd("report", file, "--format", "json")
			// report finds a problem where check does: an OOM, or a leak.
			if checked, _, _ := runCmd("check", file, "--allow-truncated"); code != checked {
				t.Fatalf("exit %d, where check exits %d: %s", code, checked, stderr)
			}
			if err := validate(schema, []byte(stdout)); err != nil {
				t.Fatalf("the report does not match the schema: %v", err)
			}
		})
	}
}

func TestOpenSnapshot(t *testing.T) {
	dir := testFiles(t)
	s, _, err := app.Open(filepath.Join(dir, "cut.oomdbg"), &hostmem.Limit{}, load.CostAnalyse)
	var trunc *snapshot.TruncatedError
	if err != nil || !errors.As(s.Warning, &trunc) {
		t.Errorf("a file cut short: %v, warning %v", err, s.Warning)
	}
	pickles, _ := filepath.Glob(filepath.Join("..", "..", "snapshot", "torch", "testdata", "snapshots", "*.pickle"))
	for _, p := range pickles {
		s, _, err := app.Open(p, &hostmem.Limit{}, load.CostAnalyse)
		if err != nil || s.Meta.Source != "pytorch" {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// TestReportRunsNothingUnasked reads files whose metadata describes a workload that would run for hours:
// report never re-runs what a file says unless --measure-fixes asks, and then within --measure-timeout.
func TestReportRunsNothingUnasked(t *testing.T) {
	dir := testFiles(t)
	fixed, err := os.ReadFile(filepath.Join(dir, "fixed.oomdbg"))
	if err != nil {
		t.Fatal(err)
	}
	withWorkload := func(name string, cfg train.Config) string {
		meta, err := json.Marshal(train.Meta(cfg, "test"))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, snapshottest.WithMeta(fixed, meta), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	endless := mlpConfig("")
	endless.Accum = 1_000_000_000
	slow, _ := train.PresetConfig("gpt2-large")
	slow.Accum = train.MaxAccum
	tests := map[string]struct {
		args []string
		note string
	}{
		"endless, not asked": {[]string{withWorkload("endless.oomdbg", endless)}, "no measurement was asked for"},
		"endless, asked": {[]string{withWorkload("endless.oomdbg", endless), "--measure-fixes"},
			"not measured: the snapshot does not describe a workload oomdbg can re-run: its workload configuration is not one oomdbg runs: accum 1000000000: is more micro-batches per step than any run takes"},
		"slow, asked with a budget": {[]string{withWorkload("slow.oomdbg", slow), "--measure-fixes", "--measure-timeout", "300ms"},
			"measuring failed: the re-runs took longer than the 300ms --measure-timeout allows"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			type result struct {
				code           int
				stdout, stderr string
			}
			done := make(chan result, 1)
			go func() {
				code, stdout, stderr := runCmd(append([]string{"report", "--format", "json"}, tc.args...)...)
				done <- result{code, stdout, stderr}
			}()
			select {
			case r := <-done:
				if r.code != exitOK {
					t.Fatalf("exit %d: %s", r.code, r.stderr)
				}
				var rep triage.Report
				if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(rep.AdviceNote, tc.note) {
					t.Errorf("advice note %q, want it to say %q", rep.AdviceNote, tc.note)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("report is still running after a minute")
			}
		})
	}
}

// TestReportRanks reports a job's ranks side by side: two ranks recorded by oomdbg, one of them on a card too
// small for it, a real PyTorch snapshot, and a file that is not there.
func TestReportRanks(t *testing.T) {
	dir := t.TempDir()
	record := func(name string, rank int, gpuMem string) string {
		path := filepath.Join(dir, name)
		code, _, stderr := runCmd("run", "--preset", "tiny", "--steps", "2", "--gpus", "2", "--dp", "zero2", "--optimizer", "adamw",
			"--rank", fmt.Sprint(rank), "--gpu-mem", gpuMem, "--context-reserve", "1MiB", "-o", path)
		if code != exitOK && code != exitProblem {
			t.Fatalf("run rank %d: exit %d, %s", rank, code, stderr)
		}
		return path
	}
	r0, r1 := record("job_0.oomdbg", 0, "24GiB"), record("job_1.oomdbg", 1, "30MiB")
	missing := filepath.Join(dir, "job_2.oomdbg")
	pickle := torchtest.FixturePath(t, "f4_2024_time_us_no_settings_2dev.pickle")
	code, stdout, stderr := runCmd("report", r0, r1, pickle, missing)
	if code != exitUsage || !strings.Contains(stderr, "1 of the 4 files could not be read") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"\n   0 ", "\n  *1 ", "f4_2024_time_us_no_settings_2dev.pickle", "unreadable",
		"* rank 1 ran out of memory in iteration 0", "; 1 of 3 ranks did"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	code, stdout, stderr = runCmd("report", r0, r1, "--format", "json")
	if code != exitProblem || stderr != "oomdbg: 1 of the 2 ranks read to the end ran out of memory ("+r1+")\n" {
		t.Errorf("a job one of whose ranks ran out of memory: exit %d, stderr %q", code, stderr)
	}
	var tab struct {
		Format string
		Worst  int
		Ranks  []struct {
			Rank int
			OOM  bool
		}
	}
	if json.Unmarshal([]byte(stdout), &tab) != nil || tab.Format != "oomdbg-ranks/1" || tab.Worst != 1 ||
		len(tab.Ranks) != 2 || tab.Ranks[1].Rank != 1 || !tab.Ranks[1].OOM {
		t.Errorf("json (exit %d): %s", code, stdout)
	}
	if code, _, stderr := runCmd("report", r0, r1, "--measure-fixes"); code != exitUsage || !strings.Contains(stderr, "give one file") {
		t.Errorf("--measure-fixes with two files: exit %d, %q", code, stderr)
	}
}
