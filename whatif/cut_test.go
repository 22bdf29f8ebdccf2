package whatif_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/whatif"
	"github.com/oomdbg/oomdbg/whatif/transform"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestWhatIfOnOneStepLoRATrace: a QLoRA fine-tune's one step, exported as PyTorch records it (no category,
// phase, step region or scope: every tag the fixes read is the importer's inference), halved in batch and
// checkpointed: the peak is within the fix's tolerance of the runtime's own recording of the fix, the
// verdicts 10% above and below that recording's peak reserved are its verdicts, and the what-if names the
// tags it inferred.
func TestWhatIfOnOneStepLoRATrace(t *testing.T) {
	base, err := train.PresetConfig("llama-3.2-1b")
	if err != nil {
		t.Fatal(err)
	}
	base.Device, base.Batch, base.Seq, base.Steps, base.LoRA, base.QLoRA = "meta", 2, 1024, 1, 16, true
	rec, _ := recordRun(t, base)
	stripped := asStrippedPyTorch(t, rec)
	for _, fix := range []struct {
		name      string
		config    func(c *train.Config)
		transform transform.Transform
		tolerance float64
	}{
		{"batch/2", func(c *train.Config) { c.Batch /= 2 }, transform.BatchScale(0.5), 0.03},
		{"checkpoint all", func(c *train.Config) { c.Checkpoint = knob.CheckpointAll }, transform.Checkpoint(knob.CheckpointAll), 0.05},
	} {
		t.Run(fix.name, func(t *testing.T) {
			direct := base
			fix.config(&direct)
			_, truth := recordRun(t, direct)
			f := whatif.Fix{Transforms: []transform.Transform{fix.transform}}
			rep, err := whatif.Evaluate(stripped, f, 0)
			if err != nil {
				t.Fatal(err)
			}
			e := float64(rep.After.PeakAllocated-truth.PeakAllocated) / float64(truth.PeakAllocated)
			t.Logf("peak allocated %d, recorded with the fix %d: %+.2f%%\n%s", rep.After.PeakAllocated, truth.PeakAllocated,
				100*e, strings.Join(rep.Assumptions, "\n"))
			if math.Abs(e) > fix.tolerance {
				t.Errorf("peak allocated %d, recorded %d: %+.2f%%, want within %.0f%%", rep.After.PeakAllocated,
					truth.PeakAllocated, 100*e, 100*fix.tolerance)
			}
			if last := rep.Assumptions[len(rep.Assumptions)-1]; !strings.HasPrefix(last, "tags inferred by oomdbg's importer") ||
				!strings.Contains(last, "categories") {
				t.Errorf("the what-if does not name the tags it inferred: %q", rep.Assumptions)
			}
			for _, scale := range []float64{1.1, 0.9} {
				capacity := uint64(float64(truth.PeakReserved) * scale)
				tight := direct
				tight.GPUMemory = capacity + tight.ContextReserve
				_, tr := recordRun(t, tight)
				got, err := whatif.Evaluate(stripped, f, capacity)
				if err != nil {
					t.Fatal(err)
				}
				checkVerdict(t, fmt.Sprintf("at %+.0f%%", 100*(scale-1)), got, tr.OOM != nil, stripped, fix.transform, func() uint64 {
					return fitsFrom(uint64(truth.PeakAllocated)/2, 2*uint64(truth.PeakReserved), func(c uint64) bool {
						cfg := direct
						cfg.GPUMemory = c + cfg.ContextReserve
						_, r := recordRun(t, cfg)
						return r.OOM != nil
					})
				})
			}
		})
	}
}

// TestWhatIfOnStrippedOOMTrace: oomdbg's default run (gpt2-medium, batch 16 on 24 GiB) dies in its first
// forward; exported as PyTorch records it, halving its batch on the same card gives what the runtime's own
// recording at half the batch did over the same requests (the same ops, half the bytes) up to the one the
// first run failed, which the what-if does not replay: the same verdict for the recorded part, and its peak
// there.
func TestWhatIfOnStrippedOOMTrace(t *testing.T) {
	base, err := train.PresetConfig("gpt2-medium")
	if err != nil {
		t.Fatal(err)
	}
	base.Device, base.Steps = "meta", 1
	rec, res := recordRun(t, base)
	if res.OOM == nil || res.OOM.Iteration != 0 || res.OOM.Phase != snapshot.PhaseForward {
		t.Fatalf("the default run must die in its first forward: %+v", res.OOM)
	}
	requests := 0 // the allocations the run was served before the one it failed
	for _, e := range rec.Events.All() {
		if e.Action == snapshot.ActionAlloc {
			requests++
		}
	}
	half := base
	half.Batch /= 2
	hs, _ := recordRun(t, half)
	htl := timeline.New(hs)
	var truthPeak int64
	within, n := false, 0 // whether the run at half the batch failed one of those requests, and its peak over them
	for i, e := range hs.Events.All() {
		if e.Action == snapshot.ActionAlloc || e.Action == snapshot.ActionOOM {
			if n++; n > requests {
				break
			}
		}
		within = within || e.Action == snapshot.ActionOOM
		truthPeak = max(truthPeak, htl.Allocated(i))
	}
	capacity := base.GPUMemory - base.ContextReserve
	rep, err := whatif.Evaluate(asStrippedPyTorch(t, rec), whatif.Fix{Transforms: []transform.Transform{transform.BatchScale(0.5)}}, capacity)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Before.OOM || rep.After.OOM != within || rep.Unrecorded == "" {
		t.Errorf("before OOM %v, after OOM %v (the recording at half the batch failed within the recorded requests: %v), unrecorded %q",
			rep.Before.OOM, rep.After.OOM, within, rep.Unrecorded)
	}
	if e := float64(rep.After.PeakAllocated-truthPeak) / float64(truthPeak); math.Abs(e) > 0.03 {
		t.Errorf("the recorded part peaks at %d after halving; the recording at half the batch peaked at %d over the same requests: %+.2f%%",
			rep.After.PeakAllocated, truthPeak, 100*e)
	}
	t.Logf("halved: %d (verdict %s), recorded at half the batch over the same %d requests: %d\n%s", rep.After.PeakAllocated,
		rep.Verdict, requests, truthPeak, strings.Join(rep.Assumptions, "\n"))
}
