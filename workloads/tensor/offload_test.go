package tensor

import (
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
)

// streamBlocks counts, per stream, the blocks the allocator hands out, how many are live at once at most,
// and how many are live now.
type streamBlocks struct {
	allocs, live, peak map[int64]int
}

func newStreamBlocks() *streamBlocks {
	return &streamBlocks{allocs: map[int64]int{}, live: map[int64]int{}, peak: map[int64]int{}}
}

func (s *streamBlocks) Alloc(_ int, stream int64, _, _, _ uint64) {
	s.allocs[stream]++
	s.live[stream]++
	s.peak[stream] = max(s.peak[stream], s.live[stream])
}
func (s *streamBlocks) FreeRequested(_ int, stream int64, _, _, _ uint64) { s.live[stream]-- }
func (s *streamBlocks) FreeCompleted(int, int64, uint64, uint64, uint64)  {}
func (s *streamBlocks) SegmentAlloc(int, int64, uint64, uint64)           {}
func (s *streamBlocks) SegmentFree(int, int64, uint64, uint64)            {}
func (s *streamBlocks) SegmentMap(int, int64, uint64, uint64)             {}
func (s *streamBlocks) SegmentUnmap(int, int64, uint64, uint64)           {}
func (s *streamBlocks) OOM(int, int64, uint64, uint64, uint64)            {}

// TestActivationOffloadFollowsTorchtune runs a chain of eight tanh, each saving its 4 KiB result, under
// torchtune's OffloadActivations rules, and checks what they imply, derived here by hand from its source:
//   - forward: eight packs, all at least 1024 bytes, so eight pinned host copies of 4096 bytes (a power of
//     two: the caching host allocator's block); with streams the forward stash keeps the last five device
//     tensors (pack k drops the ids up to k-5), so the device holds the input and results 4 to 8; without
//     streams only the input and the result the caller keeps;
//   - backward, newest node first: node 8 finds its tensor in the forward stash, whose other entries go once
//     it has run; nodes 7 to 1 each bring one back on the copy stream, kept until the next such node has
//     run, so at most two copy-stream blocks are live at once; nothing is left after backward. Without
//     streams the copies come back on the compute stream and go after their node.
//
// The gradients are tanh's, with or without offloading.
func TestActivationOffloadFollowsTorchtune(t *testing.T) {
	const n, elems = 8, 1024 // 4096 bytes a result
	for _, streams := range []bool{true, false} {
		run := func(offload bool) (grad []float32, fwdDevice uint64, blocks *streamBlocks, host allocator.HostStats) {
			blocks = newStreamBlocks()
			dev := device.NewSimulated(device.CPU, 0, 1<<30, 0, allocator.DefaultConfig())
			dev.Allocator().SetObserver(blocks)
			rt := NewRuntime(dev, nil, 7)
			h := allocator.NewHostAllocator()
			if offload {
				rt.SetActivationOffload(&ActivationOffload{Host: NewRuntime(device.NewHost(device.CPU, h), nil, 7),
					Streams: streams, MinBytes: 1024, MaxStash: 5, Head: "lm_head"})
			}
			x := rt.Uniform(F32, []int{elems}, -1, 1, "x", snapshot.CategoryInput).SetRequiresGrad(true)
			var y *Tensor
			rt.OffloadForward(func() {
				y = x.Ref()
				for range n {
					next := Tanh(y)
					y.Release()
					y = next
				}
			})
			fwdDevice = uint64(dev.Allocator().Stats().AllocatedBytes.All().Current)
			loss := Sum(y)
			loss.Backward(false)
			grad = x.Grad().Values()
			loss.Release()
			y.Release()
			x.Release()
			if left := rt.LiveHandles(); left != 0 {
				t.Errorf("streams %v: %d references left", streams, left)
			}
			return grad, fwdDevice, blocks, h.Stats()
		}
		plain, _, _, _ := run(false)
		grad, fwd, blocks, host := run(true)
		for i := range plain {
			if grad[i] != plain[i] {
				t.Fatalf("streams %v: gradient %d is %v offloaded, %v not", streams, i, grad[i], plain[i])
			}
		}
		wantFwd, wantCopies, wantPeak := uint64(4096*(1+5)), 7, 2
		if !streams {
			wantFwd, wantCopies, wantPeak = 4096*2, 0, 0
		}
		if fwd != wantFwd {
			t.Errorf("streams %v: %d device bytes after the forward, want %d", streams, fwd, wantFwd)
		}
		if blocks.allocs[1] != wantCopies || blocks.peak[1] != wantPeak || blocks.live[1] != 0 {
			t.Errorf("streams %v: copy stream: %d blocks, %d at most at once, %d left; want %d, %d, 0", streams,
				blocks.allocs[1], blocks.peak[1], blocks.live[1], wantCopies, wantPeak)
		}
		if !streams && blocks.allocs[0] < n { // the copies back are on the compute stream
			t.Errorf("no streams: %d compute-stream blocks", blocks.allocs[0])
		}
		if host.PeakAllocated != n*4096 || host.Allocated != 0 || host.Pinned != n*4096 {
			t.Errorf("streams %v: host %+v, want %d pinned bytes at the peak, none left allocated", streams, host, n*4096)
		}
	}
}
