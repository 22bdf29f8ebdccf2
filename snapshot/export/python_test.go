package export

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
)

// python runs a Python 3 script with args and decodes the JSON it prints into out: Python's own pickle and
// json modules are the independent truth the tests check against (torchtest.RequirePython).
func python(t *testing.T, script string, out any, args ...string) {
	t.Helper()
	py := torchtest.RequirePython(t)
	cmd := exec.Command(py, append([]string{"-c", script}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("python printed %q: %v", stdout.String(), err)
	}
}

// writeTemp writes data to a file in the test's temporary directory and returns its path.
func writeTemp(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// loadScript loads a torch export with an Unpickler that refuses every global (so only plain data can load,
// as PyTorch's snapshots and memory_viz require), loads the JSON export with the json module, and prints what
// a check needs: the keys, the opcodes, counts, whether the two documents are equal, and how many distinct
// frame lists the pickle holds (shared ones count once).
const loadScript = `
import io, json, pickle, pickletools, sys, collections

class DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("global %s.%s refused" % (module, name))

raw = open(sys.argv[1], "rb").read()
snap = DataOnly(io.BytesIO(raw)).load()
doc = json.load(open(sys.argv[2], encoding="utf-8"))

def plain(x):
    if isinstance(x, tuple):
        return [plain(v) for v in x]
    if isinstance(x, list):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x

frame_lists = {}
bad = []
traces = []
for dev, trace in enumerate(snap["device_traces"]):
    counts = collections.Counter()
    for e in trace:
        counts[e["action"]] += 1
        need = ["action", "size", "stream"] + (["device_free"] if e["action"] == "oom" else ["addr"])
        if any(k not in e for k in need) or not all(isinstance(e[k], int) for k in need[1:]):
            bad.append(e)
        if "frames" in e:
            frame_lists[id(e["frames"])] = e["frames"]
    traces.append(dict(counts))
blocks = 0
for s in snap["segments"]:
    frame_lists[id(s["frames"])] = s["frames"]
    for b in s["blocks"]:
        blocks += 1
        frame_lists[id(b["frames"])] = b["frames"]
        if b["state"] not in ("active_allocated", "active_pending_free", "inactive"):
            bad.append(b)
    if s["segment_pool_id"] != (0, 0) or sum(b["size"] for b in s["blocks"]) != s["total_size"]:
        bad.append(s)
ops = set(op.name for op, _, _ in pickletools.genops(raw))
print(json.dumps({
    "keys": sorted(snap.keys()),
    "protocol": raw[1],
    "opcodes": sorted(ops),
    "traces": traces,
    "segments": len(snap["segments"]),
    "blocks": blocks,
    "annotations": len(snap["external_annotations"]),
    "settings": snap.get("allocator_settings"),
    "same_as_json": plain(snap) == doc,
    "frame_lists": len([l for l in frame_lists.values() if l]),
    "bad": [repr(b)[:200] for b in bad[:3]],
}))
`
