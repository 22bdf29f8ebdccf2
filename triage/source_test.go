package triage_test

import (
	"encoding/json"
	"os/exec"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
)

// countActions is CPython's own count of the trace entries of a snapshot pickle, by action.
const countActions = `
import collections, json, pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
c = collections.Counter(e["action"] for t in d.get("device_traces", []) for e in t)
print(json.dumps(c))
`

// TestEventsByActionCountsTheTrace: for the real snapshots, the report's events_by_action holds what the
// trace holds, as CPython counts its entries, and the blocks and segments rebuilt as alive before the
// trace are counted apart; events counts both.
func TestEventsByActionCountsTheTrace(t *testing.T) {
	py := torchtest.RequirePython(t)
	for _, name := range []string{torchtest.F3, torchtest.F4} {
		t.Run(name, func(t *testing.T) {
			path := torchtest.FixturePath(t, name)
			out, err := exec.Command(py, "-c", countActions, path).Output()
			if err != nil {
				t.Fatal(err)
			}
			var want map[string]int
			if err := json.Unmarshal(out, &want); err != nil {
				t.Fatal(err)
			}
			s, err := load.File(path)
			if err != nil {
				t.Fatal(err)
			}
			src := triage.Analyze(t.Context(), timeline.New(s), triage.Options{}).Source
			for a, n := range want {
				if src.EventsByAction[a] != n {
					t.Errorf("events_by_action[%s] = %d, the trace holds %d", a, src.EventsByAction[a], n)
				}
			}
			total := 0
			for a, n := range src.EventsByAction {
				total += n
				if _, ok := want[a]; !ok {
					if act, _ := snapshot.ParseAction(a); act <= snapshot.ActionOOM || act == snapshot.ActionSnapshot {
						t.Errorf("events_by_action[%s] = %d, the trace holds none", a, n)
					}
				}
			}
			if len(src.ReconstructedByAction) == 0 {
				t.Errorf("nothing counted as rebuilt from before the trace")
			}
			for _, n := range src.ReconstructedByAction {
				total += n
			}
			if total != src.Events {
				t.Errorf("events %d, the two counts sum to %d", src.Events, total)
			}
		})
	}
}
