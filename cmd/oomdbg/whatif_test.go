package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
)

func TestWhatIfCommand(t *testing.T) {
	dir := testFiles(t)
	f := func(name string) string { return filepath.Join(dir, name) }
	tests := map[string]struct {
		args   []string
		code   int
		stdout []string
		stderr string
	}{
		"batch":         {[]string{"whatif", f("fixed.oomdbg"), "--batch-scale", "0.5"}, 0, []string{"peak allocated", "peak reserved", "verdict", "assumes:", "batch x0.5: "}, ""},
		"several fixes": {[]string{"whatif", f("fixed.oomdbg"), "--accum", "2", "--optimizer", "sgd", "--alloc-conf", "expandable_segments:True"}, 0, []string{"accumulate 2", "optimizer sgd", "alloc-conf expandable_segments:True"}, ""},
		"ends in OOM":   {[]string{"whatif", f("oom.oomdbg"), "--batch-scale", "0.5"}, 0, []string{"out of memory", "never recorded"}, ""},
		"no fix":        {[]string{"whatif", f("fixed.oomdbg")}, 2, nil, "no fix given"},
		"amp":           {[]string{"whatif", f("fixed.oomdbg"), "--amp", "bf16"}, 2, nil, "mixed precision cannot be read off a trace"},
		"bad optimizer": {[]string{"whatif", f("fixed.oomdbg"), "--optimizer", "lion"}, 2, nil, "unknown optimizer"},
		"bad scale":     {[]string{"whatif", f("fixed.oomdbg"), "--batch-scale", "0"}, 2, nil, "--batch-scale"},
		"not a file":    {[]string{"whatif", f("text.txt"), "--batch-scale", "0.5"}, 2, nil, "text.txt"},
		"8-bit and for-loop": {[]string{"whatif", f("fixed.oomdbg"), "--optimizer", "adamw8bit", "--optimizer-impl", "for-loop"}, 0,
			[]string{"optimizer adamw8bit: ", "8-bit state", "optimizer-impl for-loop: "}, ""},
		"selective checkpoint": {[]string{"whatif", f("fixed.oomdbg"), "--checkpoint", "selective:ops"}, 2, nil,
			"checkpoint selective:ops: a trace is checkpointed by whole blocks"},
		"bad impl":     {[]string{"whatif", f("fixed.oomdbg"), "--optimizer-impl", "fast"}, 2, nil, "--optimizer-impl"},
		"zero to none": {[]string{"whatif", f("fixed.oomdbg"), "--zero-grad", "none"}, 0, []string{"already does this"}, ""},
		"cut short":    {[]string{"whatif", f("cut.oomdbg"), "--batch-scale", "0.5"}, 0, []string{"note: snapshot cut short at byte ", "the figures are for the "}, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runCmd(tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, stdout, stderr)
			}
			for _, s := range tc.stdout {
				if !strings.Contains(stdout, s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout)
				}
			}
			if tc.stderr != "" && (!strings.Contains(stderr, tc.stderr) || strings.Count(strings.TrimSpace(stderr), "\n") > 0) {
				t.Errorf("stderr %q, want one line with %q", stderr, tc.stderr)
			}
		})
	}
}

// The JSON holds at least what docs/whatif.md promises: before and after with peak_allocated,
// peak_reserved (bytes) and oom (a boolean), for checkpointing after_held too, a verdict, and the
// assumptions.
func TestWhatIfJSON(t *testing.T) {
	dir := testFiles(t)
	code, stdout, stderr := runCmd("whatif", filepath.Join(dir, "oom.oomdbg"), "--checkpoint", "all", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	type side struct {
		PeakAllocated *int64 `json:"peak_allocated"`
		PeakReserved  *int64 `json:"peak_reserved"`
		OOM           *bool  `json:"oom"`
	}
	var doc struct {
		Before, After *side
		AfterHeld     *side    `json:"after_held"`
		Verdict       string   `json:"verdict"`
		Assumptions   []string `json:"assumptions"`
		Unrecorded    string   `json:"unrecorded"`
	}
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*side{"before": doc.Before, "after": doc.After, "after_held": doc.AfterHeld} {
		if s == nil || s.PeakAllocated == nil || s.PeakReserved == nil || s.OOM == nil || *s.PeakAllocated <= 0 {
			t.Errorf("%s: %s", name, stdout)
		}
	}
	if len(doc.Assumptions) != 1 || doc.Unrecorded == "" || !*doc.Before.OOM {
		t.Errorf("assumptions %q, unrecorded %q, before OOM %v", doc.Assumptions, doc.Unrecorded, *doc.Before.OOM)
	}
	want := map[[2]bool]string{{false, false}: "fits", {true, true}: "oom", {true, false}: "edge", {false, true}: "edge"}
	if doc.After != nil && doc.AfterHeld != nil && doc.Verdict != want[[2]bool{*doc.After.OOM, *doc.AfterHeld.OOM}] {
		t.Errorf("verdict %q, with after OOM %v and after_held OOM %v", doc.Verdict, *doc.After.OOM, *doc.AfterHeld.OOM)
	}
}

// TestWhatIfOnRealSnapshot: the what-if on a real PyTorch snapshot (f3: 10,327 trace entries, no tags but
// what the importer infers). Halving the batch says in one line how much of what was live at the recorded
// peak scales, and the replay after agrees with it: the peak falls by at most half of that (rounding up
// keeps a little), and never rises; every figure of the line is the replay's own before figure or below it.
// Expandable segments, which change no request, leave the peak allocated bytes where they were.
func TestWhatIfOnRealSnapshot(t *testing.T) {
	f3 := torchtest.FixturePath(t, torchtest.F3)
	type side struct {
		PeakAllocated int64 `json:"peak_allocated"`
		PeakReserved  int64 `json:"peak_reserved"`
	}
	var doc struct {
		Before, After side
		AfterHeld     *side    `json:"after_held"`
		Verdict       string   `json:"verdict"`
		Assumptions   []string `json:"assumptions"`
	}
	whatif := func(args ...string) {
		code, stdout, stderr := runCmd(append([]string{"whatif", f3, "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		doc.AfterHeld = nil
		if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
			t.Fatal(err)
		}
	}
	whatif("--batch-scale", "0.5")
	line := doc.Assumptions[0]
	t.Log(line)
	// "batch x0.5: 5.55 GiB of the 19.37 GiB live at the recorded peak scale with the batch ..."
	w := strings.Fields(line)
	if len(w) < 13 || strings.Join(w[:2], " ") != "batch x0.5:" || strings.Join(w[4:6], " ") != "of the" || strings.Join(w[8:13], " ") != "live at the recorded peak" {
		t.Fatalf("the assumption line %q does not say what scales", line)
	}
	x, err1 := units.ParseSize(w[2] + w[3])
	y, err2 := units.ParseSize(w[6] + w[7])
	if err1 != nil || err2 != nil || x == 0 || x > y {
		t.Fatalf("the assumption line %q: scaled %d of %d (%v, %v)", line, x, y, err1, err2)
	}
	if got := units.FormatSize(doc.Before.PeakAllocated); got != units.FormatSize(y) {
		t.Errorf("the line's live bytes at the peak, %s, are not the peak before, %s", units.FormatSize(y), got)
	}
	before, after := doc.Before.PeakAllocated, doc.After.PeakAllocated
	if after > before || after < before-int64(x)/2-int64(x)/100 {
		t.Errorf("batch x0.5: peak allocated %d -> %d, want a fall of at most half the %d bytes that scale", before, after, x)
	}
	if doc.AfterHeld != nil || doc.Verdict != "unknown" {
		t.Errorf("batch x0.5 on a trace without a capacity: verdict %q, a late end %v", doc.Verdict, doc.AfterHeld != nil)
	}
	// The same requests: only what a block holds past its request when it is not split (under 1 MiB) may
	// differ.
	whatif("--alloc-conf", "expandable_segments:True")
	if d := doc.After.PeakAllocated - doc.Before.PeakAllocated; d*100 > doc.Before.PeakAllocated || -d*100 > doc.Before.PeakAllocated {
		t.Errorf("expandable segments: peak allocated %d -> %d", doc.Before.PeakAllocated, doc.After.PeakAllocated)
	}
	if !strings.Contains(doc.Assumptions[0], "expandable_segments:True") {
		t.Errorf("expandable segments: the assumption %q does not name the settings", doc.Assumptions[0])
	}
}

// TestCutShortTraceIsSaidCutShort: replay and whatif of a recording cut short before what they need say the
// file was cut short, never that PyTorch does not record it. One file is cut inside its first chunk, before
// any allocation; the other holds the chunks up to the first with an allocation (setup: the weights), cut
// short before the training phases a fix reads.
func TestCutShortTraceIsSaidCutShort(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testFiles(t), "fixed.oomdbg"))
	if err != nil {
		t.Fatal(err)
	}
	first := headerLen(data) // where the first chunk begins
	// The first chunk after which the file holds an allocation, and none of the training loop.
	setupEnd := 0
	for off := first; off+24 <= len(data) && setupEnd == 0; {
		off += 24 + int(binary.LittleEndian.Uint32(data[off+4:]))
		s, _ := snapshot.Read(bytes.NewReader(data[:off+30]))
		for _, e := range s.Events.All() {
			if e.Phase == snapshot.PhaseForward {
				t.Fatalf("no chunk ends before the forward pass: the recording's chunks are not cut at phase ends")
			}
			if e.Action == snapshot.ActionAlloc {
				setupEnd = off
			}
		}
	}
	dir := t.TempDir()
	cut := func(name string, n int) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data[:n], 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	empty, setup := cut("empty.oomdbg", first+30), cut("setup.oomdbg", setupEnd+30)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"replay", empty}, ", before any allocation: there is no trace to replay"},
		{[]string{"whatif", empty, "--batch-scale", "0.5"}, ", before any allocation: there is no trace to replay"},
		{[]string{"whatif", setup, "--checkpoint", "all"}, " tags checkpoint all needs"},
		{[]string{"whatif", setup, "--accum", "4"}, " tags accumulate 4 needs"},
	} {
		code, _, stderr := runCmd(tc.args...)
		if code != exitUsage || !strings.HasPrefix(stderr, "oomdbg: "+tc.args[1]+": snapshot cut short at byte ") ||
			!strings.HasSuffix(stderr, tc.says+"\n") || strings.Contains(stderr, "PyTorch") || strings.Count(stderr, "\n") != 1 {
			t.Errorf("oomdbg %s: exit %d, stderr %q; want 2 and a line that says the file was cut short, ending %q",
				strings.Join(tc.args, " "), code, stderr, tc.says)
		}
	}
}

// TestWhatIfNamesTheFixAskedFor: a fix the trace cannot take is refused in the name the user asked for it
// by, not that of a step it takes (accumulation scales each micro-batch).
func TestWhatIfNamesTheFixAskedFor(t *testing.T) {
	f4 := torchtest.FixturePath(t, "f4_2024_time_us_no_settings_2dev.pickle")
	code, _, stderr := runCmd("whatif", f4, "--accum", "4")
	if code != exitUsage || !strings.HasPrefix(stderr, "oomdbg: "+f4+": accumulate 4 needs the trace's ") || strings.Contains(stderr, "batch x0.25") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}
