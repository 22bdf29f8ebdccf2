package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/allocator/replay"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// varlenConfig is the variable-length workload of the fragmentation fixture and of README.md's table:
// GPT-2 small in bf16 with flash attention, 20 samples a batch of 64 to 1024 tokens each, padded to each
// batch's longest, on a 24 GiB card.
func varlenConfig() train.Config {
	cfg, _ := train.PresetConfig("gpt2-small")
	cfg.AMP, cfg.Attention, cfg.Batch, cfg.Steps = knob.AMPBF16, knob.AttentionFlash, 20, 20
	cfg.SeqDist = train.UniformSeq(64, 1024)
	return cfg
}

// gapsAt walks a snapshot's events up to event end (inclusive) with PyTorch's accounting and nothing of
// oomdbg's analysis: the segments, the blocks active in them (alloc until free_completed), and the free
// ranges between the blocks, which are the allocator's free blocks (a freed block merges with free
// neighbours). It also returns the allocated bytes (alloc until free_requested).
func gapsAt(t *testing.T, s *snapshot.Snapshot, end int) (gaps []int64, allocated, reserved int64) {
	t.Helper()
	segs := map[uint64]int64{}
	active := map[uint64]int64{}
	for _, e := range s.Events.Slice(0, end+1) {
		switch e.Action {
		case snapshot.ActionSegmentAlloc:
			segs[e.Addr] = e.Size
			reserved += e.Size
		case snapshot.ActionSegmentFree:
			reserved -= segs[e.Addr]
			delete(segs, e.Addr)
		case snapshot.ActionSegmentMap, snapshot.ActionSegmentUnmap:
			t.Fatal("the walk does not follow expandable segments")
		case snapshot.ActionAlloc:
			active[e.Addr] = e.BlockSize
			allocated += e.BlockSize
		case snapshot.ActionFreeRequested:
			allocated -= e.BlockSize
		case snapshot.ActionFreeCompleted:
			delete(active, e.Addr)
		}
	}
	type block struct {
		addr uint64
		size int64
	}
	var blocks []block
	for a, n := range active {
		blocks = append(blocks, block{a, n})
	}
	slices.SortFunc(blocks, func(a, b block) int { return cmp.Compare(a.addr, b.addr) })
	for base, size := range segs {
		at := base
		for _, b := range blocks {
			if b.addr < base || b.addr >= base+uint64(size) {
				continue
			}
			if b.addr > at {
				gaps = append(gaps, int64(b.addr-at))
			}
			at = b.addr + uint64(b.size)
		}
		if end := base + uint64(size); at < end {
			gaps = append(gaps, int64(end-at))
		}
	}
	return gaps, allocated, reserved
}

func gib(n int64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }

// TestFragmentationOOM holds the frozen variable-length run to what a fragmentation OOM is: its failing
// request plus what was allocated fits the card less the CUDA context, and fits in none of the free blocks
// the walk of its events finds; the report says so in those words, its figures are the walk's, the trace
// replayed through the allocator model fails under the recorded settings and is served under
// expandable_segments:True; and the workload run with expandable_segments:True fits.
func TestFragmentationOOM(t *testing.T) {
	dir := testFiles(t)
	s := readFixture(t, "varlen")
	oom := slices.IndexFunc(s.Events.Actions(), func(a snapshot.Action) bool { return a == snapshot.ActionOOM })
	if oom < 0 {
		t.Fatal("the fixture has no OOM")
	}
	request := s.Events.At(oom).Size
	gaps, allocated, reserved := gapsAt(t, s, oom)
	usable := s.Meta.Devices[0].Capacity - s.Meta.Devices[0].ContextReserve
	var free, largest int64
	for _, g := range gaps {
		free += g
		largest = max(largest, g)
	}
	if allocated+request > usable || largest >= request || len(gaps) == 0 {
		t.Fatalf("not a fragmentation OOM: %d allocated + %d requested against %d usable; %d free blocks, the largest %d",
			allocated, request, usable, len(gaps), largest)
	}

	code, stdout, stderr := runCmd("report", filepath.Join(dir, "varlen.oomdbg"), "--format", "json")
	if code != exitProblem { // it ran out of memory
		t.Fatalf("report: exit %d: %s", code, stderr)
	}
	var r triage.Report
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	o := r.OOM
	if o.Kind != triage.OOMFragmentation || o.Request != request || o.FreeInReserved != free || o.LargestFreeBlock != largest ||
		o.FreeBlocks != len(gaps) || o.Allocated != allocated || o.Reserved != reserved {
		t.Errorf("the report's OOM: kind %s, request %d, %d free in %d blocks, largest %d, allocated %d, reserved %d;\n"+
			"the walk: request %d, %d free in %d blocks, largest %d, allocated %d, reserved %d",
			o.Kind, o.Request, o.FreeInReserved, o.FreeBlocks, o.LargestFreeBlock, o.Allocated, o.Reserved,
			request, free, len(gaps), largest, allocated, reserved)
	}
	if len(o.Replays) == 0 || o.Replays[0].Served || !slices.ContainsFunc(o.ServedBy, func(x triage.Replayed) bool { return x.Settings == "expandable_segments:True" }) {
		t.Errorf("replays %+v, served by %+v: want the recorded settings failing and expandable_segments:True serving", o.Replays, o.ServedBy)
	}

	_, text, _ := runCmd("report", filepath.Join(dir, "varlen.oomdbg"))
	want := fmt.Sprintf("The %s request fits in none of %d free blocks totalling %s (the largest is %s)", gib(request), len(gaps), gib(free), gib(largest))
	if !strings.Contains(text, want) || !strings.Contains(text, "a fragmentation OOM") ||
		!strings.Contains(text, "expandable_segments:True, ") || !strings.Contains(text, "would have served it") {
		t.Errorf("the text report does not say %q and which setting serves it:\n%s", want, text)
	}

	// The same workload with expandable segments runs its 20 steps.
	var cfg train.Config
	if err := json.Unmarshal(s.Meta.Workload, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.AllocConf, _ = train.ParseAllocConf("expandable_segments:True")
	res, _, err := train.Run(t.Context(), cfg, nil)
	if err != nil || res.OOM != nil || res.Steps != cfg.Steps {
		t.Errorf("with expandable_segments:True: %v, OOM %+v, %d of %d steps", err, res.OOM, res.Steps, cfg.Steps)
	}
}

// TestVariableLengthReplay exports variable-length runs to PyTorch's pickle and replays them: the allocator
// model creates a segment of the recorded size for every segment the recording created, reuses every cached
// block at the recorded address, and releases what each empty_cache released. (Under max_split_size_mb the
// recording releases oversize blocks one by one to make room, which the replay, on a device that never runs
// out, does as a whole empty_cache: those releases do not match, and are left out here.)
func TestVariableLengthReplay(t *testing.T) {
	dir := t.TempDir()
	runs := map[string]string{"frozen": filepath.Join(testFiles(t), "varlen.oomdbg")}
	for name, args := range map[string][]string{
		"empty_cache": {"--empty-cache", "step", "--steps", "6"},
		"sorted":      {"--sort-by-length", "--padding", "multiple:64", "--steps", "6"},
		"lognormal":   {"--seq-dist", "lognormal:300:0.6:1024", "--batch", "32", "--steps", "6"},
	} {
		out := filepath.Join(dir, name+".oomdbg")
		base := []string{"run", "--preset", "gpt2-small", "--amp", "bf16", "--attention", "flash", "--batch", "20",
			"--seq-dist", "uniform:64:1024", "-o", out}
		if code, _, stderr := runCmd(append(base, args...)...); code != exitOK && code != exitProblem {
			t.Fatalf("%s: exit %d: %s", name, code, stderr)
		}
		runs[name] = out
	}
	for name, path := range runs {
		t.Run(name, func(t *testing.T) {
			pickle := filepath.Join(dir, name+".pickle")
			if code, _, stderr := runCmd("export", path, "--format", "torch", "-o", pickle); code != exitOK {
				t.Fatalf("export: exit %d: %s", code, stderr)
			}
			code, stdout, stderr := runCmd("replay", pickle, "--json")
			if code != exitOK {
				t.Fatalf("replay: exit %d: %s", code, stderr)
			}
			var rep replay.Report
			if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
				t.Fatal(err)
			}
			if len(rep.Fidelity) != 1 {
				t.Fatalf("%d devices", len(rep.Fidelity))
			}
			f := rep.Fidelity[0]
			if f.NewSegments.Total == 0 || f.NewSegments.Matched != f.NewSegments.Total || f.ReusedInTrace.Total == 0 ||
				f.ReusedInTrace.Matched != f.ReusedInTrace.Total || f.ExtraSegments != 0 || f.Unknown != 0 || f.Untracked != 0 ||
				f.Releases.Matched != f.Releases.Total || f.ExtraReleases != 0 {
				t.Errorf("new segments %+v (%d extra), reused %+v, releases %+v (%d extra), unknown %d, untracked %d; mismatches %+v",
					f.NewSegments, f.ExtraSegments, f.ReusedInTrace, f.Releases, f.ExtraReleases, f.Unknown, f.Untracked, head(f.Mismatches, 3))
			}
			if name == "empty_cache" && f.Releases.Total == 0 {
				t.Error("empty_cache every step released nothing")
			}
		})
	}
}

func head[T any](s []T, n int) []T { return s[:min(n, len(s))] }

// TestReadmeFragmentationTable runs the command README.md says made its fragmentation table and compares
// the rows, so that the table is what the command prints.
func TestReadmeFragmentationTable(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const cmdline = "oomdbg fixes --fragmentation --preset gpt2-small --amp bf16 --attention flash --batch 20 --seq-dist uniform:64:1024 --steps 20 --markdown"
	text := strings.Join(strings.Fields(string(readme)), " ")
	if !strings.Contains(text, strings.ReplaceAll("`"+cmdline+"`", "\n", " ")) {
		t.Fatalf("README.md does not name the command %q", cmdline)
	}
	table := func(s string) []string {
		var rows []string
		in := false
		for _, l := range strings.Split(s, "\n") {
			switch {
			case strings.HasPrefix(l, "| setting |"):
				in = true
			case in && !strings.HasPrefix(l, "|"):
				return rows
			}
			if in {
				rows = append(rows, l)
			}
		}
		return rows
	}
	code, stdout, stderr := runCmd(strings.Fields(cmdline)[1:]...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got, want := table(stdout), table(string(readme))
	if len(want) == 0 || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the command prints\n%s\nREADME.md has\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
