package train

import (
	"bytes"
	"context"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
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
			tl := timeline.New(s)
			mallocs := map[int32]int64{}
			frees := map[int32]int64{}
			released := map[int32]int64{}
			calls := map[int32]int{}
			afterCall := false
			for i, e := range s.Events.All() {
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

// TestUnallocatedAtPeak checks the run's fragmentation figure against the recording's Timeline: reserved minus
// allocated when reserved memory peaked, a new segment counted with its block.
func TestUnallocatedAtPeak(t *testing.T) {
	for _, conf := range []string{"", "expandable_segments:True"} {
		cfg := tinyGPT()
		cfg.Steps, cfg.Batch, cfg.SeqDist = 6, 3, UniformSeq(4, 64)
		var err error
		if cfg.AllocConf, err = ParseAllocConf(conf); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		res, err := Record(context.Background(), cfg, &buf, RecordOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := snapshot.Read(&buf)
		if err != nil {
			t.Fatal(err)
		}
		tl := timeline.New(s)
		p := tl.Peak(timeline.Reserved)
		if p.Bytes != res.PeakReserved || tl.Unallocated(p.Seq) != res.UnallocatedAtPeak || res.UnallocatedAtPeak <= 0 {
			t.Errorf("%q: peak reserved %d with %d unallocated; the recording has %d with %d", conf,
				res.PeakReserved, res.UnallocatedAtPeak, p.Bytes, tl.Unallocated(p.Seq))
		}
	}
}

// TestSettingsFixes checks each settings fix sets what it is named after, and that the data fixes are tried
// only where lengths vary.
func TestSettingsFixes(t *testing.T) {
	cfg := tinyGPT()
	cfg.AllocConf, _ = ParseAllocConf("roundup_power2_divisions:4")
	if n := len(SettingsFixesFor(cfg)); n != len(SettingsFixes) {
		t.Errorf("fixed lengths: %d fixes", n)
	}
	cfg.SeqDist = UniformSeq(1, 64)
	want := map[string]string{
		"as configured":                    "roundup_power2_divisions:4",
		"expandable_segments:True":         "roundup_power2_divisions:4,expandable_segments:True",
		"max_split_size_mb:128":            "max_split_size_mb:128,roundup_power2_divisions:4",
		"garbage_collection_threshold:0.6": "",
	}
	for _, f := range SettingsFixesFor(cfg) {
		c := cfg
		f.Apply(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", f.Name, err)
		}
		switch f.Name {
		case "garbage_collection_threshold:0.6":
			// 23.5 of 24 GiB: the allocator's limit is what the card has for it.
			if a := c.AllocConf.Config; a.GarbageCollectionThreshold != 0.6 || a.PerProcessMemoryFraction*float64(c.GPUMemory) != float64(c.GPUMemory-c.ContextReserve) {
				t.Errorf("%s: %+v", f.Name, a)
			}
		case "empty_cache every step":
			if c.EmptyCache != EmptyCacheStep {
				t.Errorf("%s: %v", f.Name, c.EmptyCache)
			}
		case "padding multiple:64":
			if c.Padding != PadToMultiple(64) {
				t.Errorf("%s: %v", f.Name, c.Padding)
			}
		case "sort-by-length":
			if !c.SortByLength {
				t.Errorf("%s: not sorted", f.Name)
			}
		default:
			if w, ok := want[f.Name]; ok && c.AllocConf.String() != w {
				t.Errorf("%s: settings %q, want %q", f.Name, c.AllocConf.String(), w)
			}
		}
	}
}
