package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"

	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

var goLine = regexp.MustCompile(`\.go:\d+`)

// attributeVerdict is what check says of the fixture whose modules keep their outputs, its figures derived
// in TestPinnedFigures.
var attributeVerdict = "held across iterations, not a leak: " + kib(attributeHeld) +
	" allocated during training outlives its iteration without growing over iterations 2-7 (3 groups, the largest " + kib(attributeLargest) +
	" of temporary in net.0 at nn.(*Linear).Forward module.go:129, retained by net.0.intermediate)"

// leakVerdict is what check says of the leak fixture, its figures derived in TestPinnedFigures.
var leakVerdict = fmt.Sprintf("leak: allocated memory grows %s per iteration over iterations 2-7 (retained autograd graph: %d suspects, the largest %s per iteration of activation in net.1 at nn.(*ReLU).Forward module.go:132, retained by loss_history[6])",
	kib(leakPerIteration), leakSuspects, kib(leakLargest))

func TestCheckCommand(t *testing.T) {
	dir := testFiles(t)
	f := func(name string) string { return filepath.Join(dir, name) }
	// A real PyTorch snapshot of the allocator's state alone: no trace, so no iterations to check.
	noIterations := torchtest.FixturePath(t, "f2_2024_segments_list_only.pkl")
	tests := map[string]struct {
		args   []string
		code   int
		first  string   // the first line of stdout, "" when stdout is not checked
		stdout []string // substrings of the detail
		stderr string   // the one line stderr holds, "" for none
	}{
		"fixed passes": {args: []string{f("fixed.oomdbg")}, code: exitOK,
			first: "PASS: no leak: allocated memory at the end of iterations 2-7 changes by 0 B per iteration after a warm-up of 2"},
		"leak fails": {args: []string{f("leak.oomdbg")}, code: exitProblem,
			first:  "FAIL: " + leakVerdict,
			stdout: []string{fmt.Sprintf("\n          7    %s      %s\n", kib(leakAtEnd7), mib(leakReservedAtEnd7)), "retained by loss_history[6] >", "allocated at:\n      nn.(*ReLU).Forward"},
			stderr: "oomdbg: check failed: leak: allocated memory grows " + kib(leakPerIteration) + " per iteration"},
		"leak within max growth": {args: []string{f("leak.oomdbg"), "--max-growth", "76KiB"}, code: exitOK,
			first: "PASS: " + leakVerdict + ", within the limit of 76.00 KiB per iteration"},
		"leak over max growth": {args: []string{f("leak.oomdbg"), "--max-growth", "75KB"}, code: exitProblem,
			stderr: "oomdbg: check failed: leak: "},
		"peak over": {args: []string{f("fixed.oomdbg"), "--max-peak", "400KiB"}, code: exitProblem,
			first: "FAIL: peak: allocated memory peaked at " + kib(fixedPeak) + ", over the limit of 400.00 KiB"},
		"peak under, GB is binary": {args: []string{f("fixed.oomdbg"), "--max-peak", "1GB"}, code: exitOK,
			first: "PASS: no leak: allocated memory at the end of iterations 2-7 changes by 0 B per iteration after a warm-up of 2; peak " + kib(fixedPeak) + " is within the limit of 1.00 GiB"},
		"scope ignored": {args: []string{f("leak.oomdbg"), "--ignore-scope", "net", "--ignore-function", "train.(*blobs).batch,nn.(*MLP).Loss"}, code: exitOK,
			first: "PASS: no leak: allocated memory at the end of iterations 2-7 changes by +" + kib(leakPerIteration) + " per iteration after a warm-up of 2"},
		"fragmentation passes": {args: []string{f("frag.oomdbg")}, code: exitOK,
			first: "PASS: fragmentation, not a leak: reserved memory grows " + mib(fragPerIteration) + " per iteration over iterations 2-5 while allocated memory does not (0 B per iteration)"},
		"a run out of memory fails": {args: []string{f("oom.oomdbg")}, code: exitProblem,
			stderr: "oomdbg: check failed: oom: the run ran out of memory at event "},
		"held passes": {args: []string{f("attribute.oomdbg")}, code: exitOK,
			first:  "PASS: " + attributeVerdict,
			stdout: []string{"held across iterations, by bytes (3 of 3 shown, " + kib(attributeHeld) + " in all):\n", "    retained by net.2.intermediate\n"}},
		"held within max held": {args: []string{f("attribute.oomdbg"), "--max-held", "66KiB"}, code: exitOK,
			first: "PASS: " + attributeVerdict + "; " + kib(attributeHeld) + " held across iterations is within the limit of 66.00 KiB"},
		"held over max held": {args: []string{f("attribute.oomdbg"), "--max-held", "0"}, code: exitProblem,
			first:  "FAIL: held: " + kib(attributeHeld) + " held across iterations, over the limit of 0 B",
			stderr: "oomdbg: check failed: held: " + kib(attributeHeld) + " held across iterations, over the limit of 0 B"},
		"gradients never cleared pass": {args: []string{f("nozerograd.oomdbg")}, code: exitOK,
			first: "PASS: held across iterations, not a leak: " + kib(gradientsHeld) + " allocated during training outlives its iteration without growing over iterations 2-7 (4 groups, the largest 84.00 KiB of gradient at train.(*run).microStep run.go:267, retained by net.0.weight > net.0.weight.grad)",
			stdout: []string{"\ngradients never cleared: after 7 of 7 optimizer steps, from iteration 0, backward adds to the step's gradients with no zero_grad between, so each step applies the sum of every earlier step's gradients; " +
				kib(gradientsHeld) + " of gradients (6 blocks) stay allocated between steps\n"}},
		"gradients never cleared over max held": {args: []string{f("nozerograd.oomdbg"), "--max-held", "85KiB"}, code: exitProblem,
			first: "FAIL: held: " + kib(gradientsHeld) + " held across iterations, over the limit of 85.00 KiB"},
		"fixed within max held": {args: []string{f("fixed.oomdbg"), "--max-held", "0"}, code: exitOK,
			first: "PASS: no leak: allocated memory at the end of iterations 2-7 changes by 0 B per iteration after a warm-up of 2; 0 B held across iterations is within the limit of 0 B"},
		"bad size":  {args: []string{f("fixed.oomdbg"), "--max-peak", "big"}, code: exitUsage, stderr: `oomdbg: invalid argument "big" for "--max-peak" flag: invalid size "big"`},
		"bad input": {args: []string{f("text.txt")}, code: exitUsage, stderr: "oomdbg: " + f("text.txt") + " is neither an oomdbg snapshot nor a PyTorch memory snapshot (pickle or JSON)"},
		"damaged":   {args: []string{f("damaged.oomdbg")}, code: exitUsage, stderr: "oomdbg: " + f("damaged.oomdbg") + ": snapshot: "},
		"two files": {args: []string{f("fixed.oomdbg"), f("leak.oomdbg")}, code: exitUsage, stderr: "oomdbg: accepts 1 arg(s), received 2"},
		"cut short": {args: []string{f("cut.oomdbg")}, code: exitUsage,
			stderr: "oomdbg: " + f("cut.oomdbg") + " is incomplete: snapshot cut short at byte "},
		"cut short allowed": {args: []string{f("cut.oomdbg"), "--allow-truncated"}, code: exitOK,
			first:  "PASS: inconclusive: 0 complete iterations with a warm-up of 2; need 2 or more after it",
			stderr: "oomdbg: warning: snapshot cut short at byte "},
		"no iterations passes as inconclusive": {args: []string{noIterations}, code: exitOK,
			first: "PASS: inconclusive: 0 complete iterations with a warm-up of 2; need 2 or more after it (the snapshot has no iteration markers)"},
		"no iterations fails when a verdict is required": {args: []string{noIterations, "--require-conclusive"}, code: exitProblem,
			first:  "FAIL: inconclusive: 0 complete iterations with a warm-up of 2; need 2 or more after it (the snapshot has no iteration markers), and a conclusive verdict is required",
			stderr: "oomdbg: check failed: inconclusive: "},
		"a short run fails when a verdict is required": {args: []string{f("leak.oomdbg"), "--warmup", "7", "--require-conclusive"}, code: exitProblem,
			first: "FAIL: inconclusive: 8 complete iterations with a warm-up of 7; need 2 or more after it, and a conclusive verdict is required"},
		"a verdict required and given": {args: []string{f("fixed.oomdbg"), "--require-conclusive"}, code: exitOK,
			first: "PASS: no leak: allocated memory at the end of iterations 2-7 changes by 0 B per iteration after a warm-up of 2"},
		"damaged allowed": {args: []string{f("damaged.oomdbg"), "--allow-truncated"}, code: exitOK,
			stderr: "oomdbg: warning: " + f("damaged.oomdbg") + ": snapshot: read chunk at byte "},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runCmd(append([]string{"check"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, stderr)
			}
			// Line numbers of the workload's source are not what a check's wording pins.
			if first, _, _ := strings.Cut(stdout, "\n"); tc.first != "" && goLine.ReplaceAllString(first, ".go:N") != goLine.ReplaceAllString(tc.first, ".go:N") {
				t.Errorf("first line\n%q\nwant\n%q", first, tc.first)
			}
			for _, s := range tc.stdout {
				if !strings.Contains(stdout, s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout)
				}
			}
			if tc.stderr != "" && (!strings.HasPrefix(stderr, tc.stderr) || strings.Count(stderr, "\n") != 1) {
				t.Errorf("stderr %q, want one line starting %q", stderr, tc.stderr)
			}
			if tc.code == exitOK && tc.stderr == "" && stderr != "" {
				t.Errorf("stderr %q on success", stderr)
			}
		})
	}
}

func TestCheckJSON(t *testing.T) {
	dir := testFiles(t)
	schema := loadSchemaFile(t, "report-json-check.schema.json", "")
	leaksSchema := loadSchemaFile(t, "report-json.schema.json", "#/$defs/leaks")
	tests := map[string]struct {
		args []string
		code int
		pass bool
	}{
		"pass":       {[]string{filepath.Join(dir, "fixed.oomdbg"), "--max-peak", "1GiB"}, exitOK, true},
		"fail":       {[]string{filepath.Join(dir, "leak.oomdbg"), "--max-peak", "1KiB"}, exitProblem, false},
		"allowance":  {[]string{filepath.Join(dir, "leak.oomdbg"), "--max-growth", "1MiB"}, exitOK, true},
		"fragmented": {[]string{filepath.Join(dir, "frag.oomdbg")}, exitOK, true},
		"held":       {[]string{filepath.Join(dir, "nozerograd.oomdbg")}, exitOK, true},
		"held over":  {[]string{filepath.Join(dir, "attribute.oomdbg"), "--max-held", "1KiB"}, exitProblem, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			code, stdout, _ := runCmd(append([]string{"check", "--json"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d", code, tc.code)
			}
			if err := validate(schema, []byte(stdout)); err != nil {
				t.Fatalf("the result does not match docs/report-json-check.schema.json: %v", err)
			}
			var c struct {
				Pass     bool            `json:"pass"`
				Failures []string        `json:"failures"`
				Leaks    json.RawMessage `json:"leaks"`
			}
			if err := json.Unmarshal([]byte(stdout), &c); err != nil {
				t.Fatal(err)
			}
			if err := validate(leaksSchema, c.Leaks); err != nil {
				t.Fatalf("leaks does not match the report's: %v", err)
			}
			if c.Pass != tc.pass || (len(c.Failures) == 0) != tc.pass {
				t.Errorf("pass %v with failures %q, want pass %v", c.Pass, c.Failures, tc.pass)
			}
		})
	}
}

// BenchmarkCheck checks a file of a million events (the generated GPT-2-small loop, 435 iterations): read,
// index, leak analysis and report, as CI runs it.
func BenchmarkCheck(b *testing.B) {
	cfg := snapshottest.GPT2Small()
	cfg.Iterations = 435
	path := filepath.Join(b.TempDir(), "1m.oomdbg")
	var buf bytes.Buffer
	if err := snapshottest.Encode(&buf, cfg); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
	s, _, err := app.Open(path, &hostmem.Limit{}, load.CostAnalyse)
	if err != nil {
		b.Fatal(err)
	}
	events := s.Events.Len()
	b.ResetTimer()
	for b.Loop() {
		if code, stdout, stderr := runCmd("check", path); code != exitOK {
			b.Fatalf("exit %d: %s%s", code, stdout, stderr)
		}
	}
	b.ReportMetric(float64(events), "events")
	b.ReportMetric(float64(events)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// failureT is a leaks.TestingT that keeps what a test would print.
type failureT struct{ msgs []string }

func (*failureT) Helper() {}
func (f *failureT) Errorf(format string, args ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

// TestGoTestFailureSaysTheFix: a leak check in a Go test fails with the code change that fixes the leak,
// the same words the report gives as its "fix the leak" advice and oomdbg check prints under its verdict.
func TestGoTestFailureSaysTheFix(t *testing.T) {
	file := filepath.Join(testFiles(t), "leak.oomdbg")
	s, err := snapshot.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	ft := &failureT{}
	leaks.Check(ft, s)
	if len(ft.msgs) != 1 {
		t.Fatalf("leaks.Check failed %d times, want once: %q", len(ft.msgs), ft.msgs)
	}
	_, js, _ := runCmd("report", file, "--format", "json")
	var r struct {
		Advice []struct{ Fix, Why string }
	}
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		t.Fatal(err)
	}
	var why string
	for _, a := range r.Advice {
		if a.Fix == "fix the leak" {
			why = a.Why
		}
	}
	if why == "" {
		t.Fatalf("the report advises no fix for the leak: %s", js)
	}
	lines := strings.SplitN(ft.msgs[0], "\n", 3)
	if len(lines) < 3 || lines[1] != "fix: "+why {
		t.Errorf("the Go test's failure does not give the report's fix %q:\n%s", why, ft.msgs[0])
	}
	_, checked, _ := runCmd("check", file)
	if got := strings.SplitN(checked, "\n", 3); len(got) < 2 || got[1] != "fix: "+why {
		t.Errorf("oomdbg check does not give the report's fix %q:\n%s", why, checked)
	}
}
