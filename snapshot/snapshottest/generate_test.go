package snapshottest_test

import (
	"bytes"
	"reflect"
	"regexp"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

func TestDeterministic(t *testing.T) {
	cfg := snapshottest.Tiny()
	if !reflect.DeepEqual(snapshottest.Trace(cfg), snapshottest.Trace(cfg)) {
		t.Fatal("two traces of one Config differ")
	}
	var a, b bytes.Buffer
	if err := snapshottest.Encode(&a, cfg); err != nil {
		t.Fatal(err)
	}
	if err := snapshottest.Encode(&b, cfg); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two encodings of one Config differ")
	}
	other := cfg
	other.Seed++
	if a, b := snapshottest.Trace(cfg), snapshottest.Trace(other); a.Events.Equal(&b.Events) {
		t.Fatal("the seed does not change the trace")
	}
}

// TestTraceInvariants checks the trace against the rules of the allocator and the training loop it imitates,
// computing each from the events alone.
func TestTraceInvariants(t *testing.T) {
	for name, cfg := range map[string]snapshottest.Config{"tiny": snapshottest.Tiny(), "gpt2-small": gpt2Short()} {
		t.Run(name, func(t *testing.T) {
			s := snapshottest.Trace(cfg)
			type block struct{ size, blockSize int64 }
			live := map[uint64]block{}
			type seg struct{ addr, end uint64 }
			var segs []seg
			var allocated, peak, reserved int64
			var peakSeq uint64
			byAction := map[string]uint64{}
			iterations, phase := 0, snapshot.PhaseNone
			label := regexp.MustCompile(`^(f32|u8|i64)\[[0-9,]*\] [a-z_0-9.]+$`)
			for i, e := range s.Events.All() {
				byAction[e.Action.String()]++
				if i > 0 && e.Time <= s.Events.At(i-1).Time {
					t.Fatalf("event %d: time does not advance", i)
				}
				switch e.Action {
				case snapshot.ActionSegmentAlloc:
					segs = append(segs, seg{e.Addr, e.Addr + uint64(e.Size)})
					reserved += e.Size
					if e.Size != 2<<20 && e.Size != 20<<20 && e.Size%(2<<20) != 0 {
						t.Fatalf("event %d: segment of %d bytes", i, e.Size)
					}
				case snapshot.ActionAlloc:
					if _, ok := live[e.Addr]; ok {
						t.Fatalf("event %d: alloc at live address %#x", i, e.Addr)
					}
					if e.BlockSize%512 != 0 || e.BlockSize < e.Size {
						t.Fatalf("event %d: block %d for request %d", i, e.BlockSize, e.Size)
					}
					inside := false
					for _, sg := range segs {
						inside = inside || e.Addr >= sg.addr && e.Addr+uint64(e.BlockSize) <= sg.end
					}
					if !inside {
						t.Fatalf("event %d: block outside every segment", i)
					}
					if !label.MatchString(s.String(e.Label)) {
						t.Fatalf("event %d: label %q", i, s.String(e.Label))
					}
					if d := len(s.Stack(e.Stack)); d < 10 || d > 30 {
						t.Fatalf("event %d: stack of depth %d", i, d)
					}
					live[e.Addr] = block{e.Size, e.BlockSize}
					allocated += e.BlockSize
					if allocated > peak {
						peak, peakSeq = allocated, e.Seq
					}
				case snapshot.ActionFreeRequested, snapshot.ActionCategory:
					if b, ok := live[e.Addr]; !ok || b.size != e.Size || b.blockSize != e.BlockSize {
						t.Fatalf("event %d: %v of a block that is not live", i, e.Action)
					}
				case snapshot.ActionFreeCompleted:
					if _, ok := live[e.Addr]; !ok || s.Events.At(i-1).Action != snapshot.ActionFreeRequested {
						t.Fatalf("event %d: free_completed without free_requested", i)
					}
					delete(live, e.Addr)
					allocated -= e.BlockSize
				case snapshot.ActionIteration:
					iterations++
				case snapshot.ActionPhase:
					if e.Phase <= phase && e.Phase != snapshot.PhaseData {
						t.Fatalf("event %d: phase %v after %v", i, e.Phase, phase)
					}
					phase = e.Phase
				case snapshot.ActionRetain:
					if prev := s.Events.At(i - 1).Action; prev != snapshot.ActionRetain && prev != snapshot.ActionHeapDump {
						t.Fatalf("event %d: retain outside a heap dump", i)
					}
				}
			}
			if iterations != cfg.Iterations {
				t.Errorf("%d iterations, want %d", iterations, cfg.Iterations)
			}
			sum := s.Footer.Summary
			if sum.Events != uint64(s.Events.Len()) || !reflect.DeepEqual(sum.ByAction, byAction) ||
				sum.PeakAllocated != peak || sum.PeakAllocatedSeq != peakSeq || sum.PeakReserved != reserved {
				t.Errorf("footer summary %+v disagrees with the events (peak %d at %d, reserved %d)", sum, peak, peakSeq, reserved)
			}
			var footerLive int
			for _, sg := range s.Footer.Segments {
				for _, b := range sg.Blocks {
					if b.State == "active_allocated" {
						footerLive++
						if _, ok := live[b.Addr]; !ok {
							t.Errorf("footer block %#x is not live", b.Addr)
						}
					}
				}
			}
			if footerLive != len(live) {
				t.Errorf("footer has %d live blocks, the events leave %d", footerLive, len(live))
			}
		})
	}
}

// TestSteadyState: after the first iteration (which creates the optimizer state), every iteration makes the
// same tensors at the same addresses, as under PyTorch's caching allocator.
func TestSteadyState(t *testing.T) {
	cfg := gpt2Short()
	cfg.Iterations = 4
	s := snapshottest.Trace(cfg)
	type alloc struct {
		label snapshot.StringID
		size  int64
		addr  uint64
	}
	var iters [][]alloc
	for _, e := range s.Events.All() {
		switch e.Action {
		case snapshot.ActionIteration:
			iters = append(iters, nil)
		case snapshot.ActionAlloc:
			if len(iters) > 0 {
				iters[len(iters)-1] = append(iters[len(iters)-1], alloc{e.Label, e.Size, e.Addr})
			}
		}
	}
	if len(iters[0]) <= len(iters[1]) {
		t.Fatal("the first iteration must allocate the optimizer state on top")
	}
	if !reflect.DeepEqual(iters[1], iters[2]) || !reflect.DeepEqual(iters[1], iters[3]) {
		t.Fatal("iterations 2, 3 and 4 allocate differently")
	}
}

// TestLeakLoss: the leaky variant keeps one loss block per iteration, held by the loss history.
func TestLeakLoss(t *testing.T) {
	cfg := snapshottest.Tiny()
	cfg.LeakLoss = true
	s := snapshottest.Trace(cfg)
	var dumps, history []int
	for _, e := range s.Events.All() {
		switch e.Action {
		case snapshot.ActionHeapDump:
			dumps = append(dumps, 0)
		case snapshot.ActionRetain:
			if regexp.MustCompile(`^loss_history\[\d+\]$`).MatchString(s.String(e.Text)) {
				dumps[len(dumps)-1]++
			}
		}
	}
	for i := range cfg.Iterations {
		history = append(history, i+1)
	}
	if !reflect.DeepEqual(dumps, history) {
		t.Fatalf("loss history per heap dump %v, want %v", dumps, history)
	}
}

func gpt2Short() snapshottest.Config {
	cfg := snapshottest.GPT2Small()
	cfg.Iterations = 3
	return cfg
}
