package recorder_test

import (
	"maps"
	"path/filepath"
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/recorder"
)

// keysScript prints the keys of a snapshot pickle: the top level's, a segment's, a block's, the allocator
// settings', and each action's trace entries', as JSON.
const keysScript = `
import json, pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
out = {"top": sorted(k for k in s if k != "oomdbg")}
segs = s.get("segments", [])
out["segment"] = sorted(segs[0].keys()) if segs else []
out["block"] = sorted(segs[0]["blocks"][0].keys()) if segs else []
out["allocator_settings"] = sorted(s.get("allocator_settings", {}).keys())
acts = {}
for tr in s.get("device_traces", []):
    for e in tr:
        acts.setdefault(e["action"], set()).update(e.keys())
out["actions"] = {a: sorted(k) for a, k in acts.items()}
print(json.dumps(out))
`

type snapshotKeys struct {
	Top, Segment, Block, AllocatorSettings []string
	Actions                                map[string][]string
}

// TestDumpSchemaAgainstRealSnapshots: what the recorder dumps under the fake CUDA of a release has the keys
// of a real snapshot of that generation (docs/pytorch-snapshots.md §10), everywhere both have the thing:
// the top level, segments, blocks, allocator settings and each action's trace entries (so with no stacks
// where the real file had none). The fake of 2.0 adds
// segment_pool_id to the legacy blocks of f1, as 2.0's Module.cpp does.
func TestDumpSchemaAgainstRealSnapshots(t *testing.T) {
	cases := []struct {
		fixture, version string
		stacks           recorder.Stacks // f4 was recorded without stacks: its entries have no frames
		extraSegment     []string
	}{
		{torchtest.F1, "2.0", recorder.StacksPython, []string{"segment_pool_id"}},
		{torchtest.F3, "2.1", recorder.StacksPython, nil},
		{torchtest.F4, "2.3", recorder.StacksNone, nil},
		{torchtest.F7, "2.5", recorder.StacksPython, nil},
	}
	for _, c := range cases {
		t.Run(c.version, func(t *testing.T) {
			var real snapshotKeys
			torchtest.Run(t, keysScript, &real, torchtest.FixturePath(t, c.fixture))
			dir := filepath.Join(t.TempDir(), "dumps")
			// Two step dumps: the second holds the snapshot entry the first one's _snapshot() left.
			res, _, stderr := record(t, recorder.Options{Dir: dir, Every: 1, Keep: 1, Stacks: c.stacks}, fakeEnv(t, c.version, ""), "--steps", "2")
			if res.ExitCode != 0 {
				t.Fatalf("exit %d: %s", res.ExitCode, stderr)
			}
			var fake snapshotKeys
			torchtest.Run(t, keysScript, &fake, dumpOf(t, res, recorder.DumpStep))
			same := func(what string, fakeKeys, realKeys []string, extra ...string) {
				t.Helper()
				if len(realKeys) == 0 || len(fakeKeys) == 0 {
					return
				}
				want := slices.Sorted(slices.Values(append(slices.Clone(realKeys), extra...)))
				if !slices.Equal(fakeKeys, want) {
					t.Errorf("%s: the dump has %v, %s has %v", what, fakeKeys, c.fixture, want)
				}
			}
			same("top level", fake.Top, real.Top)
			same("segment", fake.Segment, real.Segment, c.extraSegment...)
			same("block", fake.Block, real.Block)
			same("allocator_settings", fake.AllocatorSettings, real.AllocatorSettings)
			shared := 0
			for _, a := range slices.Sorted(maps.Keys(real.Actions)) {
				if f, ok := fake.Actions[a]; ok {
					same("trace entry "+a, f, real.Actions[a])
					shared++
				}
			}
			if shared == 0 && len(real.Actions) > 0 {
				t.Errorf("no action in common with %s (%v)", c.fixture, slices.Collect(maps.Keys(real.Actions)))
			}
		})
	}
}
