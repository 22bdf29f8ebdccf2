package whatif_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/export"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/snapshot/torch"
	"github.com/oomdbg/oomdbg/whatif"
	"github.com/oomdbg/oomdbg/whatif/transform"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// whatIfShapes are the workloads the what-if transformations are held against: GPTs (nanoGPT's loop, AdamW)
// and MLPs (Adam) of several shapes.
func whatIfShapes() map[string]train.Config {
	gpt := func(layers, heads, d, seq, vocab, batch int) train.Config {
		c, err := train.PresetConfig("gpt2-small")
		if err != nil {
			panic(err)
		}
		c.Layers, c.Heads, c.DModel, c.Seq, c.Vocab, c.Batch, c.Steps = layers, heads, d, seq, vocab, batch, 3
		return c
	}
	mlp := func(in, hidden, layers, classes, batch int) train.Config {
		c := train.DefaultMLP()
		c.InFeatures, c.Hidden, c.Layers, c.Classes, c.Batch, c.Steps = in, hidden, layers, classes, batch, 3
		return c
	}
	return map[string]train.Config{
		"gpt L4 d256 T256 B8":   gpt(4, 8, 256, 256, 2048, 8),
		"gpt L6 d384 T128 B16":  gpt(6, 6, 384, 128, 4096, 16),
		"gpt L3 d512 T512 B4":   gpt(3, 8, 512, 512, 1024, 4),
		"mlp 1024x2048 L4 B512": mlp(1024, 2048, 4, 10, 512),
		"mlp 256x4096 L3 B2048": mlp(256, 4096, 3, 100, 2048),
	}
}

// whatIfFix is one fix: how the configuration records it directly, and the transformation that should
// reproduce it from a recording without it.
type whatIfFix struct {
	name      string
	from      func(c *train.Config)      // the configuration the fix is applied to, if not the workload's own
	config    func(c *train.Config) bool // false: the workload cannot record the fix
	transform transform.Transform
	tolerance float64 // on peak allocated
}

func whatIfFixes() []whatIfFix {
	gptOnly := func(c *train.Config) bool { return c.Model == "gpt" }
	return []whatIfFix{
		{"batch/2", nil, func(c *train.Config) bool { c.Batch /= 2; return true }, transform.BatchScale(0.5), 0.03},
		{"batch/4 accum 4", nil, func(c *train.Config) bool { c.Batch /= 4; c.Accum = 4; return true }, transform.Accumulate(4), 0.03},
		{"sgd", nil, func(c *train.Config) bool { c.Optimizer, c.WeightDecay = knob.SGD, 0; return true },
			transform.SwitchOptimizer(knob.SGD), 0.03},
		{"adamw8bit", nil, func(c *train.Config) bool { c.Optimizer = knob.AdamW8bit; return true },
			transform.SwitchOptimizer(knob.AdamW8bit), 0.03},
		{"for-loop", nil, func(c *train.Config) bool { c.OptimizerImpl = knob.ForLoop; return true },
			transform.OptimizerImpl(knob.ForLoop), 0.03},
		{"zero_grad zero", nil, func(c *train.Config) bool { c.ZeroGrad = knob.ZeroGradZero; return true },
			transform.ZeroGrad(knob.ZeroGradZero), 0.03},
		{"zero_grad none", func(c *train.Config) { c.ZeroGrad = knob.ZeroGradZero },
			func(c *train.Config) bool { c.ZeroGrad = knob.ZeroGradNone; return true },
			transform.ZeroGrad(knob.ZeroGradNone), 0.03},
		{"checkpoint all", nil, func(c *train.Config) bool { c.Checkpoint = knob.CheckpointAll; return gptOnly(c) },
			transform.Checkpoint(knob.CheckpointAll), 0.05},
		{"checkpoint every:2", nil, func(c *train.Config) bool { c.Checkpoint = knob.CheckpointEvery(2); return gptOnly(c) },
			transform.Checkpoint(knob.CheckpointEvery(2)), 0.05},
	}
}

// asTorchPickle exports s as PyTorch's snapshot pickle and imports it back: the trace as a PyTorch file
// carries it, categories and scopes in each entry, phases as annotations, category changes lost.
func asTorchPickle(t *testing.T, s *snapshot.Snapshot) *snapshot.Snapshot {
	t.Helper()
	path := filepath.Join(t.TempDir(), "snapshot.pickle")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := export.Torch(f, timeline.New(s)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	p, err := load.File(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// asStrippedPyTorch exports s as PyTorch's JSON snapshot, strips what PyTorch does not record (categories,
// module scopes, phase and step regions: torchtest.StripToPyTorch) and imports it, so that the tags the
// transformations read are the importer's inference.
func asStrippedPyTorch(t *testing.T, s *snapshot.Snapshot) *snapshot.Snapshot {
	t.Helper()
	var buf bytes.Buffer
	if err := export.TorchJSON(&buf, timeline.New(s)); err != nil {
		t.Fatal(err)
	}
	p, err := torch.Import(torchtest.StripToPyTorch(t, buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// verdict says what the what-if found at a capacity, and what the recording found where they differ. Tight
// (no OOM, inside the headroom rule's margin) agrees with a recording that did not run out.
func verdict(got string, recorded bool) string {
	want := map[bool]string{true: "oom", false: "fits"}[recorded]
	if got == want || got == "tight" && !recorded {
		return got
	}
	return got + " (recorded: " + want + ")"
}

// fitsFrom returns the least capacity, to 1 MiB, in (lo, hi] at which oom reports false, by bisection; lo
// must fail and hi fit. Failing by fragmentation need not be monotone in the capacity: this finds one edge.
func fitsFrom(lo, hi uint64, oom func(capacity uint64) bool) uint64 {
	for hi-lo > 1<<20 {
		if m := lo + (hi-lo)/2; oom(m) {
			lo = m
		} else {
			hi = m
		}
	}
	return hi
}

// checkVerdict holds a what-if's verdict at a capacity against the recording's. Where the what-if is at the
// edge (the fix places releases the trace does not record, and the run fits at one end of them only), the
// verdict is not wrong but the claim behind it is checked: the capacity from which the recording fits must
// lie between those from which the two ends fit.
func checkVerdict(t *testing.T, key string, got *whatif.Report, recorded bool, s *snapshot.Snapshot, fix transform.Transform,
	recordFitsFrom func() uint64) {
	t.Helper()
	switch got.Verdict {
	case "edge":
		ends := func(held bool) func(uint64) bool {
			return func(c uint64) bool {
				r, err := whatif.Evaluate(s, whatif.Fix{Transforms: []transform.Transform{fix}}, c)
				if err != nil {
					t.Fatal(err)
				}
				if held {
					return r.AfterHeld.OOM
				}
				return r.After.OOM
			}
		}
		lo, hi := uint64(got.After.PeakAllocated)/2, 2*uint64(max(got.After.PeakReserved, got.AfterHeld.PeakReserved))
		early, late := fitsFrom(lo, hi, ends(false)), fitsFrom(lo, hi, ends(true))
		rec := recordFitsFrom()
		t.Logf("%s: at the edge (recorded: OOM %v); fits from %d released at first read, %d held, recorded %d", key,
			recorded, early, late, rec)
		if rec+1<<20 < min(early, late) || rec > max(early, late)+1<<20 {
			t.Errorf("%s: the recording fits from %d bytes, outside the what-if's ends: %d released at first read, %d held",
				key, rec, early, late)
		}
	case map[bool]string{true: "oom", false: "fits"}[recorded]:
	case "tight": // the replay ran, inside the margin: the recording must not have run out either
		if recorded {
			t.Errorf("%s (%d bytes): what-if says tight, the recording ran out of memory", key, got.Capacity)
		}
	default:
		t.Errorf("%s (%d bytes): what-if says %s, the recording OOM %v", key, got.Capacity, got.Verdict, recorded)
	}
}

// recordRun records cfg on the meta device and reads the snapshot back.
func recordRun(t *testing.T, cfg train.Config) (*snapshot.Snapshot, *train.Result) {
	t.Helper()
	var buf bytes.Buffer
	res, err := train.Record(context.Background(), cfg, &buf, train.RecordOptions{ToolVersion: "test"})
	if err != nil {
		t.Fatalf("record: %v", err)
	}
	s, err := snapshot.Read(&buf)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return s, res
}

// TestWhatIfMatchesRecordedFix is the what-if's ground truth: for each workload C and fix X, the recording
// of C transformed by X and replayed must peak within the fix's tolerance of the recording of C+X made by
// the runtime itself, and give the same verdict at a capacity 10% above and 10% below the direct
// recording's peak reserved memory.
func TestWhatIfMatchesRecordedFix(t *testing.T) {
	if testing.Short() {
		t.Skip("records 5 workloads under 6 fixes")
	}
	var table strings.Builder
	table.WriteString("| workload | fix | peak allocated: recorded | what-if | error | via torch pickle | stripped, tags inferred | peak reserved: recorded | what-if | error | verdicts (+10%, -10%) | stripped: verdicts |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	shapes := whatIfShapes()
	for _, shape := range slices.Sorted(maps.Keys(shapes)) {
		base := shapes[shape]
		s, _ := recordRun(t, base)
		sp := asTorchPickle(t, s)
		ss := asStrippedPyTorch(t, s)
		for _, fix := range whatIfFixes() {
			from := base
			if fix.from != nil {
				fix.from(&from)
			}
			direct := from
			if !fix.config(&direct) {
				continue
			}
			t.Run(shape+"/"+fix.name, func(t *testing.T) {
				s, sp, ss := s, sp, ss
				if fix.from != nil {
					s, _ = recordRun(t, from)
					sp, ss = asTorchPickle(t, s), asStrippedPyTorch(t, s)
				}
				_, truth := recordRun(t, direct)
				rep, err := whatif.Evaluate(s, whatif.Fix{Transforms: []transform.Transform{fix.transform}}, 0)
				if err != nil {
					t.Fatal(err)
				}
				errAlloc := float64(rep.After.PeakAllocated-truth.PeakAllocated) / float64(truth.PeakAllocated)
				errRes := float64(rep.After.PeakReserved-truth.PeakReserved) / float64(truth.PeakReserved)
				// The same trace as a PyTorch pickle, with the tags it can carry.
				viaPickle, err := whatif.Evaluate(sp, whatif.Fix{Transforms: []transform.Transform{fix.transform}}, 0)
				if err != nil {
					t.Fatal(err)
				}
				errPickle := float64(viaPickle.After.PeakAllocated-truth.PeakAllocated) / float64(truth.PeakAllocated)
				// The same trace as PyTorch records it, its tags inferred by the importer (checkpointing finds
				// the repeated blocks by the repetition of their allocations): the fix is held to the same
				// target.
				stripped := "refused"
				viaStripped, err := whatif.Evaluate(ss, whatif.Fix{Transforms: []transform.Transform{fix.transform}}, 0)
				var missing *transform.MissingTagsError
				switch {
				case errors.As(err, &missing):
					t.Errorf("stripped: refused: %v", err)
				case err != nil:
					t.Fatal(err)
				default:
					e := float64(viaStripped.After.PeakAllocated-truth.PeakAllocated) / float64(truth.PeakAllocated)
					stripped = fmt.Sprintf("%+.2f%%", 100*e)
					if math.Abs(e) > fix.tolerance {
						t.Errorf("stripped, tags inferred: peak allocated %d, recorded %d: %+.2f%%, want within %.0f%%",
							viaStripped.After.PeakAllocated, truth.PeakAllocated, 100*e, 100*fix.tolerance)
					}
				}
				if math.Abs(errPickle) > fix.tolerance {
					t.Errorf("via the torch pickle: peak allocated %d, recorded %d: %+.2f%%, want within %.0f%%",
						viaPickle.After.PeakAllocated, truth.PeakAllocated, 100*errPickle, 100*fix.tolerance)
				}
				if math.Abs(errAlloc) > fix.tolerance {
					t.Errorf("peak allocated %d, recorded %d: %+.2f%%, want within %.0f%%\n%s", rep.After.PeakAllocated,
						truth.PeakAllocated, 100*errAlloc, 100*fix.tolerance, strings.Join(rep.Assumptions, "\n"))
				}
				var verdicts, strippedVerdicts []string
				for _, f := range []float64{1.1, 0.9} {
					capacity := uint64(float64(truth.PeakReserved) * f)
					tight := direct
					tight.GPUMemory = capacity + tight.ContextReserve
					_, tr := recordRun(t, tight)
					got, err := whatif.Evaluate(s, whatif.Fix{Transforms: []transform.Transform{fix.transform}}, capacity)
					if err != nil {
						t.Fatal(err)
					}
					want := tr.OOM != nil
					var recFits uint64
					recordFitsFrom := func() uint64 {
						if recFits == 0 {
							recFits = fitsFrom(uint64(truth.PeakAllocated)/2, 2*uint64(truth.PeakReserved), func(c uint64) bool {
								cfg := direct
								cfg.GPUMemory = c + cfg.ContextReserve
								_, r := recordRun(t, cfg)
								return r.OOM != nil
							})
						}
						return recFits
					}
					if viaStripped != nil {
						gotS, err := whatif.Evaluate(ss, whatif.Fix{Transforms: []transform.Transform{fix.transform}}, capacity)
						if err != nil {
							t.Fatal(err)
						}
						checkVerdict(t, fmt.Sprintf("stripped at %+.0f%%", 100*(f-1)), gotS, want, ss, fix.transform, recordFitsFrom)
						strippedVerdicts = append(strippedVerdicts, verdict(gotS.Verdict, want))
					}
					checkVerdict(t, fmt.Sprintf("at %+.0f%%", 100*(f-1)), got, want, s, fix.transform, recordFitsFrom)
					verdicts = append(verdicts, verdict(got.Verdict, want))
				}
				fmt.Fprintf(&table, "| %s | %s | %d | %d | %+.2f%% | %+.2f%% | %s | %d | %d | %+.2f%% | %s | %s |\n", shape, fix.name,
					truth.PeakAllocated, rep.After.PeakAllocated, 100*errAlloc, 100*errPickle, stripped, truth.PeakReserved, rep.After.PeakReserved,
					100*errRes, strings.Join(verdicts, ", "), strings.Join(strippedVerdicts, ", "))
			})
		}
	}
	t.Logf("\n%s", table.String())
}

// TestWhatIfOnATraceEndingInOOM: a run that dies in its first forward is transformed as far as it was
// recorded. Halving the batch of the recorded part must peak no higher than the direct recording at half
// the batch did up to the same phase, fit where that recording fits, and say what was never recorded.
func TestWhatIfOnATraceEndingInOOM(t *testing.T) {
	base := whatIfShapes()["gpt L4 d256 T256 B8"]
	_, full := recordRun(t, base)
	capacity := uint64(full.PeakAllocated) * 6 / 10
	base.GPUMemory = capacity + base.ContextReserve
	s, res := recordRun(t, base)
	if res.OOM == nil || res.OOM.Iteration != 0 {
		t.Fatalf("the run must die in its first iteration: %+v", res.OOM)
	}
	half := base
	half.Batch /= 2
	_, truth := recordRun(t, half)
	var truthPeak int64 // the direct recording's peak up to the phase the first run died in
	for _, ps := range truth.Phases {
		truthPeak = max(truthPeak, ps.Peak)
		if ps.Iteration == res.OOM.Iteration && ps.Phase == res.OOM.Phase {
			break
		}
	}
	rep, err := whatif.Evaluate(s, whatif.Fix{Transforms: []transform.Transform{transform.BatchScale(0.5)}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Before.OOM || rep.Unrecorded == "" {
		t.Errorf("before OOM %v, unrecorded %q: want the recorded OOM and what was never recorded", rep.Before.OOM, rep.Unrecorded)
	}
	// The what-if knows only the recorded part: the direct recording must fail within it exactly when the
	// what-if says it fails.
	within := truth.OOM != nil && (truth.OOM.Iteration < res.OOM.Iteration ||
		truth.OOM.Iteration == res.OOM.Iteration && truth.OOM.Phase <= res.OOM.Phase)
	if rep.After.OOM != within {
		t.Errorf("after OOM %v; the recording at half the batch: %+v", rep.After.OOM, truth.OOM)
	}
	if rep.After.PeakAllocated > truthPeak*103/100 {
		t.Errorf("the recorded part peaks at %d after halving; the direct recording peaked at %d up to %s",
			rep.After.PeakAllocated, truthPeak, res.OOM.Phase)
	}
	t.Logf("died in %s of iteration %d at %d bytes; halved: %d, recorded at half the batch up to there: %d",
		res.OOM.Phase, res.OOM.Iteration, capacity, rep.After.PeakAllocated, truthPeak)
}
