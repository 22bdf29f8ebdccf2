package train

import (
	"bytes"
	"context"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

// TestEmptyCacheCost checks what the loop counts for empty_cache against the recording's own events: the
// cudaMalloc calls of a step are its segment_alloc events, the bytes empty_cache returned are the
// segment_free events right after its annotation, and after the call every segment left holds a block in use
// (PyTorch's rule: empty_cache frees only unsplit cached segments).
func TestEmptyCacheCost(t *testing.T) {
	for _, when := range []EmptyCache{EmptyCacheNever, EmptyCacheStep, EmptyCachePhase} {
		t.Run(when.String(), func(t *testing.T) {
			cfg := tinyGPT()
			cfg.Steps, cfg.Batch, cfg.SeqDist, cfg.EmptyCache = 5, 2, UniformSeq(4, 64), when
			var buf bytes.Buffer
			res, err := Record(context.Background(), cfg, &buf, RecordOptions{})
			if err != nil || res.OOM != nil {
				t.Fatal(err, res.OOM)
			}
			s, err := snapshot.Read(&buf)
			if err != nil {
				t.Fatal(err)
			}
			tl := snapshot.NewTimeline(s)
			mallocs := map[int32]int64{}
			frees := map[int32]int64{}
			released := map[int32]int64{}
			calls := map[int32]int{}
			afterCall := false
			for i, e := range s.Events {
				switch e.Action {
				case snapshot.ActionSegmentAlloc:
					mallocs[e.Iteration]++
				case snapshot.ActionSegmentFree:
					frees[e.Iteration]++
					if afterCall {
						released[e.Iteration] += e.Size
					}
				case snapshot.ActionAnnotation:
					afterCall = s.String(e.Text) == emptyCacheNote
					if afterCall {
						calls[e.Iteration]++
					}
					continue
				case snapshot.ActionHeapDump:
					if when == EmptyCacheNever {
						break
					}
					for _, sg := range tl.SegmentsAt(i) {
						if len(sg.Blocks) == 0 {
							t.Errorf("iteration %d ends with an empty segment of %d bytes cached", e.Iteration, sg.Size)
						}
					}
				}
				if e.Action != snapshot.ActionSegmentFree {
					afterCall = false
				}
			}
			for _, st := range res.StepStats {
				it := int32(st.Iteration)
				if st.DeviceAllocs != mallocs[it] || st.DeviceFrees != frees[it] || st.EmptyCacheReleased != released[it] || st.EmptyCacheCalls != calls[it] {
					t.Errorf("step %d counted %d cudaMalloc, %d cudaFree, %d calls returning %d bytes; the recording has %d, %d, %d and %d",
						it, st.DeviceAllocs, st.DeviceFrees, st.EmptyCacheCalls, st.EmptyCacheReleased, mallocs[it], frees[it], calls[it], released[it])
				}
				switch {
				case when == EmptyCacheNever && st.EmptyCacheCalls != 0:
					t.Errorf("step %d called empty_cache %d times", it, st.EmptyCacheCalls)
				case when == EmptyCacheStep && st.EmptyCacheCalls != 1:
					t.Errorf("step %d called empty_cache %d times, want once", it, st.EmptyCacheCalls)
				case when == EmptyCachePhase && st.EmptyCacheCalls != 5: // after data, forward, backward, optimizer, zero_grad
					t.Errorf("step %d called empty_cache %d times, want after each of its 5 phases", it, st.EmptyCacheCalls)
				}
				if when != EmptyCacheNever && st.Iteration > 0 && st.DeviceAllocs == 0 {
					t.Errorf("step %d took no new segment after the cache was emptied", it)
				}
			}
		})
	}
}
