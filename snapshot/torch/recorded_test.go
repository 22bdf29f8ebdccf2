package torch

import (
	"errors"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

// recordedTrace is a hand-written trace of one device with oomdbg record's key: a weight allocated in
// setup, then one iteration (the batch, forward, backward with a gradient, the optimizer's state), with the
// allocator's counts at each mark and tag. The comments give each entry's allocs and frees before it.
const recordedTrace = `{"segments": [], "device_traces": [[
 {"action": "alloc", "addr": 4096, "size": 1024, "time_us": 10},
 {"action": "alloc", "addr": 8192, "size": 512, "time_us": 20},
 {"action": "alloc", "addr": 12288, "size": 2048, "time_us": 30},
 {"action": "alloc", "addr": 16384, "size": 1024, "time_us": 40},
 {"action": "free_requested", "addr": 12288, "size": 2048, "time_us": 50},
 {"action": "free_completed", "addr": 12288, "size": 2048, "time_us": 50},
 {"action": "alloc", "addr": 20480, "size": 1024, "time_us": 60},
 {"action": "free_requested", "addr": 16384, "size": 1024, "time_us": 70},
 {"action": "free_completed", "addr": 16384, "size": 1024, "time_us": 70}
]],
"oomdbg": {"format": 1, "tool": "oomdbg record test", "reason": "exit", "rank": 0, "steps": 1,
 "counts": [{"device": 0, "allocs": 105, "frees": 102}],
 "marks": [
  {"time_us": 1, "device": 0, "allocs": 100, "frees": 100, "kind": "phase", "name": "setup"},
  {"time_us": 25, "device": 0, "allocs": 102, "frees": 100, "kind": "iteration", "name": "0"},
  {"time_us": 25, "device": 0, "allocs": 102, "frees": 100, "kind": "phase", "name": "forward"},
  {"time_us": 26, "device": -1, "allocs": -1, "frees": -1, "kind": "enter", "name": "blocks.0"},
  {"time_us": 35, "device": -1, "allocs": -1, "frees": -1, "kind": "exit", "name": "blocks.0"},
  {"time_us": 38, "device": 0, "allocs": 103, "frees": 100, "kind": "phase", "name": "backward"},
  {"time_us": 55, "device": 0, "allocs": 104, "frees": 101, "kind": "end", "name": "backward"},
  {"time_us": 55, "device": 0, "allocs": 104, "frees": 101, "kind": "phase", "name": "optimizer"}
 ],
 "tags": [
  {"time_us": 25, "device": 0, "allocs": 102, "frees": 100, "address": 8192, "size": 512, "category": "input", "name": ""},
  {"time_us": 65, "device": 0, "allocs": 105, "frees": 101, "address": 16384, "size": 1024, "category": "gradient", "name": "w.grad"},
  {"time_us": 66, "device": -1, "allocs": -1, "frees": -1, "address": 4096, "size": 1024, "category": "parameter", "name": "w"},
  {"time_us": 66, "device": -1, "allocs": -1, "frees": -1, "address": 20480, "size": 1024, "category": "optimizer_state", "name": "w.exp_avg"}
 ]}}`

// TestRecordedPlacement holds the import of a hand-written recorded trace to what its marks and tags say,
// worked out by hand: marks placed by the counts (the trace's first alloc is the 101st), the batch moved into
// the iteration its forward began, the tags on the blocks they name.
func TestRecordedPlacement(t *testing.T) {
	s, err := Import([]byte(recordedTrace))
	if err != nil {
		t.Fatal(err)
	}
	o, _ := OriginOf(s)
	if o.Iterations != IterationsRecorded.String() || o.Recorded.Placed != 8 || o.Recorded.ByCounts != 6 || o.Recorded.Matched != 4 {
		t.Fatalf("origin %q %+v", o.Iterations, o.Recorded)
	}
	type want struct {
		phase     snapshot.Phase
		iteration int32
		category  snapshot.Category
		scope     string
		label     string
	}
	wants := []want{
		{snapshot.PhaseSetup, -1, snapshot.CategoryParameter, "", "w"},
		{snapshot.PhaseData, 0, snapshot.CategoryInput, "", ""}, // the batch, before the forward's mark
		{snapshot.PhaseForward, 0, snapshot.CategoryActivation, "blocks.0", ""},
		{snapshot.PhaseBackward, 0, snapshot.CategoryGradient, "", "w.grad"},
		{snapshot.PhaseOptimizer, 0, snapshot.CategoryOptimizerState, "", "w.exp_avg"},
	}
	k := 0
	for i := range s.Events.Len() {
		e := s.Events.At(i)
		if e.Action != snapshot.ActionAlloc {
			continue
		}
		w := wants[k]
		k++
		if e.Phase != w.phase || e.Iteration != w.iteration || e.Category != w.category ||
			s.String(e.Scope) != w.scope || s.String(e.Label) != w.label {
			t.Errorf("alloc %d at %#x: %s, iteration %d, %s, scope %q, label %q; want %+v", k, e.Addr, e.Phase, e.Iteration,
				e.Category, s.String(e.Scope), s.String(e.Label), w)
		}
	}
	if k != len(wants) {
		t.Fatalf("%d allocs", k)
	}
}

// TestRecordedHostile: a bad "oomdbg" key fails the import with an *ImportError naming where; a newer format
// is skipped with a note, and PyTorch's part still imports.
func TestRecordedHostile(t *testing.T) {
	base := `{"segments": [], "device_traces": [[{"action": "alloc", "addr": 512, "size": 100}]], "oomdbg": %s}`
	cases := map[string]struct {
		key  string
		path string // "" for an import that succeeds
	}{
		"not a dict":        {`[1]`, "oomdbg"},
		"marks not a list":  {`{"format": 1, "marks": 3}`, "oomdbg.marks"},
		"mark not a dict":   {`{"format": 1, "marks": [7]}`, "oomdbg.marks[0]"},
		"unknown kind":      {`{"format": 1, "marks": [{"kind": "jump", "name": "x"}]}`, "oomdbg.marks[0].kind"},
		"unknown phase":     {`{"format": 1, "marks": [{"kind": "phase", "name": "lunch"}]}`, "oomdbg.marks[0].name"},
		"iteration not int": {`{"format": 1, "marks": [{"kind": "iteration", "name": "-3"}]}`, "oomdbg.marks[0].name"},
		"device too large":  {`{"format": 1, "marks": [{"kind": "phase", "name": "forward", "device": 99999}]}`, "oomdbg.marks[0].device"},
		"time a string":     {`{"format": 1, "marks": [{"kind": "phase", "name": "forward", "time_us": "now"}]}`, "oomdbg.marks[0].time_us"},
		"tag no address":    {`{"format": 1, "tags": [{"size": 4, "category": "parameter"}]}`, "oomdbg.tags[0]"},
		"tag bad category":  {`{"format": 1, "tags": [{"address": 512, "size": 4, "category": "weights"}]}`, "oomdbg.tags[0].category"},
		"tag negative size": {`{"format": 1, "tags": [{"address": 512, "size": -4, "category": "parameter"}]}`, "oomdbg.tags[0]"},
		"notes not strings": {`{"format": 1, "notes": [1]}`, "oomdbg.notes.0"},
		"counts not dicts":  {`{"format": 1, "counts": ["x"]}`, "oomdbg.counts[0]"},
		"newer format":      {`{"format": 2, "marks": "anything"}`, ""},
		"counts beyond the trace": {`{"format": 1, "counts": [{"device": 0, "allocs": 1, "frees": 0}],
			"marks": [{"kind": "phase", "name": "forward", "device": 0, "allocs": 1000, "frees": 0}]}`, ""},
		"long names cut": {`{"format": 1, "tags": [{"address": 512, "size": 100, "category": "input", "device": -1, "name": "` +
			strings.Repeat("n", 10000) + `"}]}`, ""},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			s, err := Import([]byte(strings.Replace(base, "%s", c.key, 1)))
			if c.path == "" {
				if err != nil {
					t.Fatal(err)
				}
				checkWellFormed(t, s)
				return
			}
			var ie *ImportError
			if !errors.As(err, &ie) || ie.Path != c.path || !errors.Is(err, ErrSchema) {
				t.Fatalf("got %v (path %q), want a schema error at %q", err, pathOf(ie), c.path)
			}
		})
	}
}

func pathOf(ie *ImportError) string {
	if ie == nil {
		return ""
	}
	return ie.Path
}
