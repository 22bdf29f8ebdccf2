package torch

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
)

// pythonTruth is what testdata/truth.py computes from a snapshot with Python's own pickle module.
type pythonTruth struct {
	Actions      map[string]uint64 `json:"actions"`
	Segments     int               `json:"segments"`
	Blocks       int               `json:"blocks"`
	Devices      []int             `json:"devices"`
	PreExisting  int               `json:"pre_existing"`
	Forward      int               `json:"forward_allocs"`
	ActivePeak   map[string]int64  `json:"active_peak"`
	ReservedPeak map[string]int64  `json:"reserved_peak"`
	AllocatedEnd map[string]int64  `json:"allocated_end"`
}

// runTruth runs testdata/truth.py on a snapshot file.
func runTruth(t *testing.T, path string) pythonTruth {
	t.Helper()
	py := torchtest.RequirePython(t) // the truth of this test is Python's own reading of the pickle
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(py, filepath.Join("testdata", "truth.py"), path)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("truth.py %s: %v\n%s", path, err, stderr.String())
	}
	var tr pythonTruth
	if err := json.Unmarshal(stdout.Bytes(), &tr); err != nil {
		t.Fatalf("truth.py output: %v", err)
	}
	return tr
}

// TestFixturesAgainstPython imports every real snapshot and compares what the events say with what Python's
// pickle module, reading the same file the way memory_viz does, computes: the trace entries per action, the
// final segments and blocks, the devices, the blocks alive before the trace, and per device the peaks of
// active (requested) and reserved bytes and the allocated bytes at the end.
func TestFixturesAgainstPython(t *testing.T) {
	for _, name := range torchtest.Fixtures {
		t.Run(name, func(t *testing.T) {
			data := torchtest.ReadFixture(t, name)
			truth := runTruth(t, filepath.Join(torchtest.FixtureDir(t), name))
			s, err := Import(data)
			if err != nil {
				t.Fatal(err)
			}
			recorded := map[string]uint64{}
			synthAllocs := 0
			for _, e := range s.Events.All() {
				switch {
				case s.String(e.Label) == PreExistingLabel:
					if e.Action == snapshot.ActionAlloc {
						synthAllocs++
					}
				case e.Action <= snapshot.ActionOOM || e.Action == snapshot.ActionSnapshot:
					recorded[e.Action.String()]++
				}
			}
			if len(truth.Actions) == 0 {
				truth.Actions = map[string]uint64{}
			}
			if !reflect.DeepEqual(recorded, truth.Actions) {
				t.Errorf("recorded events by action %v, Python counts %v", recorded, truth.Actions)
			}
			forward := 0
			for _, e := range s.Events.All() {
				if e.Action == snapshot.ActionAlloc && e.Phase == snapshot.PhaseForward && s.String(e.Label) != PreExistingLabel {
					forward++
				}
			}
			if forward != truth.Forward {
				t.Errorf("%d allocations in forward, Python finds %d made in a module call", forward, truth.Forward)
			}
			if synthAllocs != truth.PreExisting {
				t.Errorf("%d pre-existing blocks, Python finds %d", synthAllocs, truth.PreExisting)
			}
			blocks := 0
			for _, seg := range s.Footer.Segments {
				blocks += len(seg.Blocks)
			}
			if len(s.Footer.Segments) != truth.Segments || blocks != truth.Blocks {
				t.Errorf("%d segments, %d blocks; Python %d, %d", len(s.Footer.Segments), blocks, truth.Segments, truth.Blocks)
			}
			var devs []int
			for _, d := range s.Meta.Devices {
				devs = append(devs, d.Index)
			}
			if !slices.Equal(devs, truth.Devices) {
				t.Errorf("devices %v, Python %v", devs, truth.Devices)
			}

			active, reserved, allocated := peaks(s)
			var sumReserved int64
			for _, d := range truth.Devices {
				k := strconv.Itoa(d)
				if active[d] != truth.ActivePeak[k] {
					t.Errorf("device %d: active peak %d, Python %d", d, active[d], truth.ActivePeak[k])
				}
				if reserved[d] != truth.ReservedPeak[k] {
					t.Errorf("device %d: reserved peak %d, Python %d", d, reserved[d], truth.ReservedPeak[k])
				}
				if allocated[d] != truth.AllocatedEnd[k] {
					t.Errorf("device %d: allocated at the end %d, final state %d", d, allocated[d], truth.AllocatedEnd[k])
				}
				sumReserved += truth.ReservedPeak[k]
			}
			// No fixture changes segments on two devices, so the peak of the sum is the sum of the peaks.
			if s.Footer.Summary.PeakReserved != sumReserved {
				t.Errorf("summary peak reserved %d, Python %d", s.Footer.Summary.PeakReserved, sumReserved)
			}
			if o, _ := OriginOf(s); o.Inconsistencies != 0 {
				t.Errorf("%d inconsistencies between the trace and the final state", o.Inconsistencies)
			}
		})
	}
}

// peaks computes from the events, per device, the peak of requested bytes alive (memory_viz's Active Memory
// Timeline), the peak of reserved bytes, and the allocated bytes at the end.
func peaks(s *snapshot.Snapshot) (active, reserved, allocatedEnd map[int]int64) {
	active, reserved, allocatedEnd = map[int]int64{}, map[int]int64{}, map[int]int64{}
	curActive, curReserved := map[int]int64{}, map[int]int64{}
	requested := map[[2]uint64]int64{}
	for _, e := range s.Events.All() {
		d := int(e.Device)
		key := [2]uint64{uint64(d), e.Addr}
		switch e.Action {
		case snapshot.ActionAlloc:
			requested[key] = e.Size
			curActive[d] += e.Size
			allocatedEnd[d] += e.BlockSize
		case snapshot.ActionFreeRequested:
			allocatedEnd[d] -= e.BlockSize
		case snapshot.ActionFreeCompleted:
			curActive[d] -= requested[key]
			delete(requested, key)
		case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
			curReserved[d] += e.Size
		case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
			curReserved[d] -= e.Size
		}
		active[d] = max(active[d], curActive[d])
		reserved[d] = max(reserved[d], curReserved[d])
	}
	return active, reserved, allocatedEnd
}

// TestFixtureDetails pins what the real snapshots hold beyond counts: f3's block sizes all follow from the
// layout, f4's one freed block from before the trace cannot be sized, f7's settings and expandable segments.
func TestFixtureDetails(t *testing.T) {
	tests := map[string]struct {
		generation       string
		timeUnit         string
		settings         string
		exact, estimated int
		preSegs          int
		mapped           uint64 // pre-existing segment_map events (expandable segments)
	}{
		torchtest.F1: {generation: "G0", timeUnit: "index", exact: 460, preSegs: 176},
		torchtest.F2: {generation: "", timeUnit: "index", exact: 1938, preSegs: 255},
		torchtest.F3: {generation: "G1", timeUnit: "index", exact: 3253, preSegs: 131},
		torchtest.F4: {generation: "G2", timeUnit: "us", exact: 6240, estimated: 1, preSegs: 673},
		torchtest.F7: {generation: "G3", timeUnit: "index", settings: "expandable_segments:True,max_split_size_mb:128",
			exact: 4, preSegs: 3, mapped: 3},
	}
	for name, w := range tests {
		t.Run(name, func(t *testing.T) {
			s, err := Import(torchtest.ReadFixture(t, name))
			if err != nil {
				t.Fatal(err)
			}
			o, _ := OriginOf(s)
			if o.Generation != w.generation || s.Meta.TimeUnit != w.timeUnit || s.Meta.AllocatorSettings != w.settings {
				t.Errorf("generation %q time unit %q settings %q, want %q %q %q", o.Generation, s.Meta.TimeUnit,
					s.Meta.AllocatorSettings, w.generation, w.timeUnit, w.settings)
			}
			if o.BlockSizesExact != w.exact || o.BlockSizesEstimated != w.estimated || o.PreExistingSegments != w.preSegs {
				t.Errorf("block sizes exact %d estimated %d, pre-existing segments %d; want %d %d %d",
					o.BlockSizesExact, o.BlockSizesEstimated, o.PreExistingSegments, w.exact, w.estimated, w.preSegs)
			}
			if got := s.Footer.Summary.ByAction["segment_map"]; got != w.mapped {
				t.Errorf("%d segment_map events, want %d", got, w.mapped)
			}
		})
	}
}
