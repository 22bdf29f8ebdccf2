package leakstest_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/workloads/train"
)

func TestEncodeIsReproducible(t *testing.T) {
	cfg := train.DefaultMLP()
	cfg.Steps, cfg.Bug = 3, train.BugRetainGraph
	a, _, err := leakstest.Encode(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, res, err := leakstest.Encode(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("two recordings of one configuration differ")
	}
	s, err := snapshot.Read(bytes.NewReader(a))
	if err != nil || s.Footer == nil || s.Warning != nil {
		t.Fatalf("read back: %v, footer %v, warning %v", err, s.Footer, s.Warning)
	}
	if !s.Meta.Created.Equal(leakstest.Created) || s.Meta.Host != leakstest.Host || s.Meta.ToolVersion != leakstest.ToolVersion {
		t.Errorf("metadata %+v", s.Meta)
	}
	if s.Footer.Summary.PeakAllocated != res.PeakAllocated {
		t.Errorf("the footer's peak %d, the run's %d", s.Footer.Summary.PeakAllocated, res.PeakAllocated)
	}
	for i := 1; i < s.Events.Len(); i++ {
		if s.Events.At(i).Time-s.Events.At(i-1).Time != 100 {
			t.Fatalf("event %d is %d ns after the one before, want 100", i, s.Events.At(i).Time-s.Events.At(i-1).Time)
		}
	}
}

// fakeT records what a check reports, so that a failing check can be tested.
type fakeT struct {
	errors, fatals []string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
}

// TestCheckWorkloadParallel runs checks of several configurations at once: nothing is shared between them.
func TestCheckWorkloadParallel(t *testing.T) {
	for _, bug := range append([]string{""}, train.Bugs...) {
		t.Run("bug="+bug, func(t *testing.T) {
			t.Parallel()
			cfg := train.DefaultMLP()
			cfg.Steps, cfg.Bug = 6, bug
			var f fakeT
			leakstest.CheckWorkload(&f, cfg)
			leaky := bug == train.BugEvalNoGrad || bug == train.BugRetainGraph || bug == train.BugStashActivations
			if len(f.fatals) > 0 || (len(f.errors) > 0) != leaky {
				t.Fatalf("errors %q, fatals %q; want a failure: %v", f.errors, f.fatals, leaky)
			}
			if leaky && !strings.HasPrefix(f.errors[0], "leak: ") {
				t.Errorf("failure %q", f.errors[0])
			}
			// What the others hold across iterations fails a check that allows nothing held.
			var strict fakeT
			leakstest.CheckWorkload(&strict, cfg, leaks.MaxHeld(0), leaks.MaxGrowth(1<<30))
			holds := bug == train.BugNoZeroGrad || bug == train.BugModuleAttribute || bug == train.BugTensorLossSum
			if (len(strict.errors) > 0) != holds || holds && !strings.HasPrefix(strict.errors[0], "held: ") {
				t.Errorf("with MaxHeld(0): errors %q; want a failure: %v", strict.errors, holds)
			}
		})
	}
}

func TestRecordBadConfig(t *testing.T) {
	cfg := train.DefaultMLP()
	cfg.Batch = 0
	var f fakeT
	if s := leakstest.Record(&f, cfg); s != nil || len(f.fatals) != 1 || !strings.Contains(f.fatals[0], "batch") {
		t.Errorf("snapshot %v, fatals %q", s, f.fatals)
	}
	leakstest.CheckWorkload(&f, cfg) // does not go on to check a snapshot it could not record
	if len(f.errors) != 0 {
		t.Errorf("errors %q", f.errors)
	}
}

func TestFragmentationRecording(t *testing.T) {
	s := leakstest.Fragmentation(t, 6)
	tl := timeline.New(s)
	its := tl.Iterations()
	var prevAlloc, prevRes int64 = -1, -1
	for _, it := range its[1:] {
		a, r := tl.Allocated(it.End-1), tl.Reserved(it.End-1)
		if prevAlloc >= 0 && (a != prevAlloc || r <= prevRes) {
			t.Errorf("iteration %d ends with %d allocated, %d reserved (before: %d, %d)", it.Iteration, a, r, prevAlloc, prevRes)
		}
		prevAlloc, prevRes = a, r
	}
	if got := leaks.Find(s).Verdict; got != leaks.Fragmentation {
		t.Errorf("verdict %s", got)
	}
}
