package backend

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/snapshot/torch"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/train"
)

const mib = 1 << 20

// isSetting reports whether a fix is an allocator setting (PYTORCH_CUDA_ALLOC_CONF).
func isSetting(fix string) bool {
	for _, k := range []string{"expandable_segments", "max_split_size_mb", "garbage_collection_threshold", "roundup_power2_divisions"} {
		if strings.Contains(fix, k) {
			return true
		}
	}
	return false
}

// checkDataParallelStory holds the report of an OOM under nn.DataParallel to what was measured: the OOM's
// message and diagnosis give the failing device's memory (allocated bytes at the OOM), no allocator setting
// is advised when the replay showed none serves the request (nor expandable segments, which the run already
// had), and halving the batch, replayed on the trace, is offered with at most half of what was allocated.
func checkDataParallelStory(t *testing.T, s *snapshot.Snapshot, device int, allocated, summed int64) *triage.Report {
	t.Helper()
	r := triage.Analyze(t.Context(), timeline.New(s), triage.Options{Replayer: Backend{}})
	o := r.OOM
	if o == nil {
		t.Fatal("no OOM reported")
	}
	if o.Device != device || o.Allocated != allocated || r.Peak.Device != device || r.Peak.Allocated != allocated {
		t.Errorf("OOM on device %d with %d allocated, peak on %d of %d; want device %d, %d", o.Device, o.Allocated,
			r.Peak.Device, r.Peak.Allocated, device, allocated)
	}
	own := "Of the allocated memory " + formatSize(allocated) + " was allocated by PyTorch"
	if !strings.Contains(o.Message, own) || strings.Contains(o.Message, formatSize(summed)) {
		t.Errorf("the message does not give device %d's own memory (%s), or gives the devices' sum (%s):\n%s", device,
			formatSize(allocated), formatSize(summed), o.Message)
	}
	if !strings.Contains(o.Diagnosis, formatSize(allocated)+" allocated plus the request") || strings.Contains(o.Diagnosis, formatSize(summed)) {
		t.Errorf("the diagnosis does not use device %d's figures:\n%s", device, o.Diagnosis)
	}
	if o.Kind != triage.OOMCapacity || len(o.ServedBy) != 0 {
		t.Errorf("kind %s, served by %+v: want a capacity OOM no setting serves", o.Kind, o.ServedBy)
	}
	var half *triage.Advice
	for i, a := range r.Advice {
		if isSetting(a.Fix) {
			t.Errorf("advises %s, which the replay showed would not serve the request (or was already set): %s", a.Fix, a.Why)
		}
		if a.Fix == "batch x0.5" {
			half = &r.Advice[i]
		}
	}
	if half == nil {
		t.Fatalf("halving the batch is not offered: %+v", r.Advice)
	}
	if !half.Replayed || half.Fits == nil || !*half.Fits || half.PeakAfter == nil || *half.PeakAfter > allocated/2+mib || r.Advice[0].Fix != "batch x0.5" {
		t.Errorf("batch x0.5: %+v (peak after %v), want it first, replayed, fitting at about half of %d", *half, half.PeakAfter, allocated)
	}
	return r
}

// TestDataParallelOOMAdviceFromWhatWasMeasured: the hand-made trace of an OOM on cuda:1 of three GPUs
// (snapshottest.DataParallelOOM: 16, 78 and 22 MiB allocated, the 5 MiB request failing on cuda:1).
func TestDataParallelOOMAdviceFromWhatWasMeasured(t *testing.T) {
	s, err := torch.Import(snapshottest.DataParallelOOM())
	if err != nil {
		t.Fatal(err)
	}
	r := checkDataParallelStory(t, s, 1, 78*mib, (16+78+22)*mib)
	if o := r.OOM; o.Reserved != 80*mib || o.Free != 1*mib || !strings.HasSuffix(o.Diagnosis,
		"78.00 MiB allocated plus the request is 83.00 MiB, more than the 81.00 MiB the allocator could have") {
		t.Errorf("reserved %d, free %d: %s", o.Reserved, o.Free, o.Diagnosis)
	}
	for _, a := range r.Advice {
		if a.Fix == "batch x0.5" && *a.PeakAfter != 39*mib {
			t.Errorf("batch x0.5 peaks at %d allocated, want half of the 78 MiB: every block alive on cuda:1 at the OOM was made in forward", *a.PeakAfter)
		}
	}
}

// oomDeviceMemory is CPython's reading of a real snapshot's OOM: the device of its oom trace entry and the
// bytes allocated there at that moment, and on all devices at that time. This snapshot's trace entries give
// the requested size of an alloc; the allocator counts the block, rounded by PyTorch's round_size (512
// bytes at least, a multiple of 512; its roundup_power2_divisions are off). Each device's trace starts
// empty: the script checks that the blocks its walk leaves alive are those the final state holds.
const oomDeviceMemory = `
import json, pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
assert all(v == 0 for v in d["allocator_settings"]["roundup_power2_divisions"].values())
rnd = lambda n: max(512, (n + 511) // 512 * 512)
oom_time, oom_dev = [(e["time_us"], dev) for dev, tr in enumerate(d["device_traces"]) for e in tr if e["action"] == "oom"][0]
at = {}
for dev, tr in enumerate(d["device_traces"]):
    live, a = {}, None
    for e in tr:
        if a is None and (e["action"] == "oom" if dev == oom_dev else e["time_us"] > oom_time):
            a = sum(live.values())
        if e["action"] == "alloc": live[e["addr"]] = rnd(e["size"])
        elif e["action"] == "free_requested": del live[e["addr"]]
    final = {b["address"]: b["size"] for s in d["segments"] if s["device"] == dev for b in s["blocks"] if b["state"] == "active_allocated"}
    assert live == final, dev
    at[dev] = sum(live.values()) if a is None else a
print(json.dumps({"device": oom_dev, "allocated": at[oom_dev], "summed": sum(at.values())}))
`

// TestRealDataParallelOOMStory holds the report of the real snapshot (f8: three GPUs under DataParallel,
// expandable segments, the OOM on cuda:1 in forward) to CPython's own reading of the pickle.
func TestRealDataParallelOOMStory(t *testing.T) {
	py := torchtest.RequirePython(t)
	path := torchtest.FixturePath(t, torchtest.F8)
	out, err := exec.Command(py, "-c", oomDeviceMemory, path).Output()
	if err != nil {
		t.Fatal(err)
	}
	var want struct{ Device, Allocated, Summed int64 }
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	s, err := load.File(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CPython: the OOM on device %d with %d bytes allocated there, %d on all devices", want.Device, want.Allocated, want.Summed)
	checkDataParallelStory(t, s, int(want.Device), want.Allocated, want.Summed)
}

func formatSize(n int64) string { return units.FormatSize(n) }

// TestRankAdviceIsMeasuredFromItsOwnStrategy: a ZeRO-2 rank of the build-along GPT on 4 x 24 GiB that runs
// out of memory in its first forward. Its fixes are measured from the rank as configured: what it needs is
// the peak of the configured run with unlimited memory (run here apart from the sweep), ZeRO-2 is not
// advised as a change, the model's fixes are measured under ZeRO-2, and bf16 + flash + checkpointing every
// block fits, needing what oomdbg fixes measures for ZeRO-2 with flash attention and checkpointing (README.md's
// table: 13.88 GiB). The request met free blocks that could hold it, but a run that needs five times the card
// is out of capacity: the OOM is not called fragmentation.
func TestRankAdviceIsMeasuredFromItsOwnStrategy(t *testing.T) {
	cfg, err := train.PresetConfig("buildalong")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Device, cfg.Steps = "meta", 3
	cfg.Parallel = dist.Settings{GPUs: 4, Strategy: dist.ZeRO2}
	var buf bytes.Buffer
	res, err := train.Record(t.Context(), cfg, &buf, train.RecordOptions{ToolVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if res.OOM == nil {
		t.Fatal("the rank does not run out of memory")
	}
	s, err := snapshot.Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	unlimited := cfg
	unlimited.GPUMemory, unlimited.Steps = 16<<40, 2
	alone, _, err := train.Run(t.Context(), unlimited, nil)
	if err != nil {
		t.Fatal(err)
	}
	withFixes := cfg
	withFixes.Attention, withFixes.Checkpoint = knob.AttentionFlash, knob.CheckpointAll
	table, err := train.Sweep(t.Context(), withFixes, train.DistFixes)
	if err != nil {
		t.Fatal(err)
	}
	var zero2 int64
	for _, row := range table {
		if row.Fix == "zero2" {
			zero2 = row.NeedsAllocated
		}
	}

	r := triage.Analyze(t.Context(), timeline.New(s), triage.Options{Measurer: Backend{}, Replayer: Backend{}})
	if r.OOM == nil || r.OOM.RunNeeds == nil || *r.OOM.RunNeeds != alone.PeakAllocated {
		t.Fatalf("the OOM's run needs %v; the configured rank alone with unlimited memory peaks at %d", r.OOM.RunNeeds, alone.PeakAllocated)
	}
	if r.OOM.Kind != triage.OOMCapacity || !strings.Contains(r.OOM.Diagnosis, "the run needs "+formatSize(alone.PeakAllocated)) {
		t.Errorf("kind %s: %s", r.OOM.Kind, r.OOM.Diagnosis)
	}
	var best *triage.Advice
	for i, a := range r.Advice {
		switch a.Fix {
		case "zero2":
			t.Errorf("advises the rank's own strategy: %+v", a)
		case "bf16 + flash + checkpoint every block":
			best = &r.Advice[i]
		}
		if a.Measured && a.Metric == "allocated" && a.PeakAfter != nil && a.Saving != alone.PeakAllocated-*a.PeakAfter {
			t.Errorf("%s: saving %d is not measured from the rank as configured (%d - %d)", a.Fix, a.Saving, alone.PeakAllocated, *a.PeakAfter)
		}
	}
	if best == nil || !*best.Fits || *best.PeakAfter != zero2 {
		t.Errorf("bf16 + flash + checkpoint every block: %+v; oomdbg fixes measures ZeRO-2 with them at %d", best, zero2)
	}
}
