package main

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// The figures TestCheckCommand and TestReportCommand pin, in bytes. TestPinnedFigures derives each one
// without oomdbg's analysis: from PyTorch's rules for what autograd saves, or by walking the frozen
// snapshot's events.
const (
	leakPerIteration   = 77312  // 75.50 KiB
	leakLargest        = 32768  // 32.00 KiB
	leakSuspects       = 7      // distinct blocks kept per iteration
	leakAtEnd7         = 881152 // 860.50 KiB allocated at the end of iteration 7
	leakReservedAtEnd7 = 2 << 20
	leakPeak           = 1056256 // 1.01 MiB
	fixedPeak          = 473600  // 462.50 KiB
	fragPerIteration   = 107 << 20
	attributeHeld      = 67584   // 66.00 KiB the modules keep across iterations
	attributeLargest   = 32768   // 32.00 KiB
	gradientsHeld      = 87552   // 85.50 KiB of gradients never cleared
	oomTried           = 1 << 30 // printed by PyTorch's format_size as 1024.00 MiB
)

// TestPinnedFigures holds the command tests' figures to truths the analysis did not produce.
func TestPinnedFigures(t *testing.T) {
	// The retain-graph bug keeps every iteration's graph alive, and with it what autograd saved for
	// backward (docs/allocator.md §1: block sizes, multiples of 512): the batch x (f32[batch, in], saved by
	// the first linear), the labels (i64[batch], saved by cross-entropy), each ReLU's output (f32[batch,
	// hidden], saved by the ReLU and as the next linear's input), cross-entropy's log-softmax (f32[batch,
	// classes]) and total_weight (a scalar), and the loss the history list holds (a scalar).
	cfg := mlpConfig(train.BugRetainGraph)
	block := func(bytes int) int64 { return int64((max(bytes, 1) + 511) / 512 * 512) }
	x := block(cfg.Batch * cfg.InFeatures * 4)
	labels := block(cfg.Batch * 8)
	relu := block(cfg.Batch * cfg.Hidden * 4)
	logSoftmax := block(cfg.Batch * cfg.Classes * 4)
	scalar := block(4)
	retained := []int64{x, labels, logSoftmax, scalar, scalar}
	for range cfg.Layers {
		retained = append(retained, relu)
	}
	var sum, largest int64
	for _, b := range retained {
		sum += b
		largest = max(largest, b)
	}
	if sum != leakPerIteration || largest != leakLargest || len(retained) != leakSuspects {
		t.Errorf("the MLP's graph keeps %d blocks, %d bytes per iteration, the largest %d; the tests pin %d, %d, %d",
			len(retained), sum, largest, leakSuspects, leakPerIteration, leakLargest)
	}

	leak := readFixture(t, "leak")
	ends, peak := walk(leak)
	for it := 3; it < len(ends); it++ {
		if d := ends[it] - ends[it-1]; d != leakPerIteration {
			t.Errorf("leak: allocated grows %d bytes from the end of iteration %d to %d, want %d", d, it-1, it, int64(leakPerIteration))
		}
	}
	if r := reservedAtIterationEnds(leak); r[len(r)-1] != leakReservedAtEnd7 {
		t.Errorf("leak: %d reserved at the end, the tests pin %d", r[len(r)-1], leakReservedAtEnd7)
	}
	if len(ends) != 8 || ends[7] != leakAtEnd7 || peak != leakPeak {
		t.Errorf("leak: %d iterations, %d allocated at the end of the last, peak %d; the tests pin 8, %d, %d", len(ends), ends[len(ends)-1], peak, int64(leakAtEnd7), int64(leakPeak))
	}
	if _, peak := walk(readFixture(t, "fixed")); peak != fixedPeak {
		t.Errorf("fixed: peak allocated %d, the tests pin %d", peak, int64(fixedPeak))
	}

	// A module that keeps its output on self holds it until its next forward: each Linear's output,
	// f32[batch, out], one block each. Without zero_grad the gradients stay: one block per parameter, the
	// shape of each weight and bias. Either way memory does not grow, and the held blocks are what
	// iteration ends hold beyond the fixed loop's.
	attr, grads := mlpConfig(train.BugModuleAttribute), int64(0)
	outs := []int64{block(attr.Batch * attr.Hidden * 4)}
	in := attr.InFeatures
	for l := range attr.Layers {
		if l > 0 {
			outs = append(outs, block(attr.Batch*attr.Hidden*4))
		}
		grads += block(attr.Hidden*in*4) + block(attr.Hidden*4)
		in = attr.Hidden
	}
	outs = append(outs, block(attr.Batch*attr.Classes*4))
	grads += block(attr.Classes*in*4) + block(attr.Classes*4)
	var held, largestOut int64
	for _, o := range outs {
		held += o
		largestOut = max(largestOut, o)
	}
	if held != attributeHeld || largestOut != attributeLargest || grads != gradientsHeld {
		t.Errorf("the modules keep %d bytes, the largest %d; the gradients take %d; the tests pin %d, %d, %d",
			held, largestOut, grads, int64(attributeHeld), int64(attributeLargest), int64(gradientsHeld))
	}
	fixedEnds, _ := walk(readFixture(t, "fixed"))
	for name, want := range map[string]int64{"attribute": attributeHeld, "nozerograd": gradientsHeld} {
		ends, _ := walk(readFixture(t, name))
		if len(ends) != len(fixedEnds) {
			t.Fatalf("%s: %d iterations, the fixed loop %d", name, len(ends), len(fixedEnds))
		}
		for it := range ends {
			if ends[it]-fixedEnds[it] != want {
				t.Errorf("%s: the end of iteration %d holds %d bytes more than the fixed loop's, the tests pin %d", name, it, ends[it]-fixedEnds[it], want)
			}
		}
	}

	// Growth over iterations 2-5 (a warm-up of 2) runs from the end of iteration 1 to the end of 5.
	frag := readFixture(t, "frag")
	allocated, _ := walk(frag)
	reserved := reservedAtIterationEnds(frag)
	if len(reserved) != 6 || (reserved[5]-reserved[1])/4 != fragPerIteration || allocated[5] != allocated[1] {
		t.Errorf("frag: reserved at iteration ends %d, allocated %d; the tests pin reserved growing %d per iteration over 2-5, allocated not",
			reserved, allocated, fragPerIteration)
	}

	// GPT-2 medium at batch 16 runs out of memory on naive attention's scores, f32[batch, heads, seq, seq]:
	// 1 GiB, a segment of its own size (docs/allocator.md §4), the size the OOM message reports.
	medium := mediumConfig()
	scores := int64(medium.Batch) * int64(medium.Heads) * int64(medium.Seq) * int64(medium.Seq) * 4
	oom := readFixture(t, "oom")
	var tried int64 = -1
	for _, e := range oom.Events.All() {
		if e.Action == snapshot.ActionOOM {
			tried = e.BlockSize
		}
	}
	if scores != oomTried || tried != oomTried {
		t.Errorf("oom: scores of %d bytes, the recorded OOM tried %d; the tests pin %d", scores, tried, int64(oomTried))
	}
}

func readFixture(t *testing.T, name string) *snapshot.Snapshot {
	t.Helper()
	s, err := snapshot.ReadFile(filepath.Join(testFiles(t), name+".oomdbg"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// walk returns allocated bytes at the end of each iteration (before the next iteration's marker, or the
// file's end) and the peak, counting blocks from alloc to free_requested as PyTorch's allocated_bytes does.
func walk(s *snapshot.Snapshot) (ends []int64, peak int64) {
	var now int64
	for _, e := range s.Events.All() {
		switch e.Action {
		case snapshot.ActionAlloc:
			now += e.BlockSize
		case snapshot.ActionFreeRequested:
			now -= e.BlockSize
		case snapshot.ActionIteration:
			if e.Iteration > 0 {
				ends = append(ends, now)
			}
		}
		peak = max(peak, now)
	}
	return append(ends, now), peak
}

// reservedAtIterationEnds is reserved bytes (segments and mapped pages) at the end of each iteration.
func reservedAtIterationEnds(s *snapshot.Snapshot) []int64 {
	var ends []int64
	var reserved int64
	for _, e := range s.Events.All() {
		switch e.Action {
		case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
			reserved += e.Size
		case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
			reserved -= e.Size
		case snapshot.ActionIteration:
			if e.Iteration > 0 {
				ends = append(ends, reserved)
			}
		}
	}
	return append(ends, reserved)
}

// kib and mib print sizes as the pinned texts do (two decimals), without oomdbg's formatter.
func kib(n int64) string { return fmt.Sprintf("%.2f KiB", float64(n)/(1<<10)) }
func mib(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }
