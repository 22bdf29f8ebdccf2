package pickle

import (
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
)

// summary is a structural fingerprint of a decoded snapshot, computed the same way by pythonSummary.
type summary struct {
	Kind       string         `json:"kind"`         // "dict", or "list" for memory_snapshot()'s bare segment list
	Segments   int            `json:"segments"`     // len(segments)
	Blocks     int            `json:"blocks"`       // blocks over all segments
	Traces     []int          `json:"traces"`       // trace entries per device (nil when absent)
	Actions    map[string]int `json:"actions"`      // trace entries per action, all devices
	FrameLists int            `json:"frame_lists"`  // distinct "frames" lists among trace entries, by identity
	Census     map[string]int `json:"census"`       // values by type; "list"/"dict" count distinct objects, "*_refs" every reference
	IntSum     string         `json:"int_sum"`      // every int reached, summed mod 2^64
	StrBytes   int            `json:"str_bytes"`    // UTF-8 bytes of every str reached
	MaxSplitOK bool           `json:"max_split_ok"` // allocator_settings.max_split_size absent, or read back as an int
}

// summarize computes the summary of a decoded snapshot.
func summarize(t *testing.T, v any) summary {
	s := summary{Actions: map[string]int{}, Census: map[string]int{}, MaxSplitOK: true}
	var segs *List
	switch top := v.(type) {
	case *List:
		s.Kind, segs = "list", top
	case *Dict:
		s.Kind = "dict"
		segs, _ = top.GetList("segments")
		if traces, ok := top.GetList("device_traces"); ok {
			s.Traces = []int{}
			seen := map[*List]bool{}
			for _, dev := range traces.All() {
				entries := dev.(*List)
				s.Traces = append(s.Traces, entries.Len())
				for _, e := range entries.Dicts() {
					a, _ := e.GetString("action")
					s.Actions[a]++
					if f, ok := e.GetList("frames"); ok {
						seen[f] = true
					}
				}
			}
			s.FrameLists = len(seen)
		}
		if st, ok := top.GetDict("allocator_settings"); ok {
			if _, has := st.Get("max_split_size"); has {
				_, s.MaxSplitOK = st.GetInt("max_split_size")
			}
		}
	default:
		t.Fatalf("top level is %T", v)
	}
	if segs != nil {
		s.Segments = segs.Len()
		for _, seg := range segs.Dicts() {
			b, _ := seg.GetList("blocks")
			s.Blocks += b.Len()
		}
	}
	// Census: each distinct list and dict is walked once, as Python's walk does by id().
	var sum uint64
	seen := map[any]bool{}
	stack := []any{v}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		switch x := x.(type) {
		case *List:
			s.Census["list_refs"]++
			if seen[x] {
				continue
			}
			seen[x] = true
			s.Census["list"]++
			for _, e := range x.All() {
				stack = append(stack, e)
			}
		case *Dict:
			s.Census["dict_refs"]++
			if seen[x] {
				continue
			}
			seen[x] = true
			s.Census["dict"]++
			for k, e := range x.All() {
				stack = append(stack, k, e)
			}
		case Tuple:
			s.Census["tuple"]++
			stack = append(stack, x...)
		case bool:
			s.Census["bool"]++
		case int64:
			s.Census["int"]++
			sum += uint64(x)
		case *big.Int:
			s.Census["int"]++
			sum += new(big.Int).Mod(x, new(big.Int).Lsh(big.NewInt(1), 64)).Uint64()
		case float64:
			s.Census["float"]++
		case string:
			s.Census["str"]++
			s.StrBytes += len(x)
		case nil:
			s.Census["none"]++
		default:
			s.Census[typeName(x)]++
		}
	}
	s.IntSum = new(big.Int).SetUint64(sum).String()
	return s
}

// pythonSummary is summarize written in Python, run on Python's own unpickler (with classes refused).
const pythonSummary = `
import json, pickle, sys

class Data(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("refusing %s.%s" % (module, name))

def summarize(v):
    s = {"actions": {}, "census": {}, "traces": None, "frame_lists": 0, "max_split_ok": True}
    if isinstance(v, list):
        s["kind"], segs = "list", v
    else:
        s["kind"], segs = "dict", v.get("segments")
        if "device_traces" in v:
            s["traces"], seen = [], set()
            for dev in v["device_traces"]:
                s["traces"].append(len(dev))
                for e in dev:
                    a = e.get("action", "")
                    s["actions"][a] = s["actions"].get(a, 0) + 1
                    if isinstance(e.get("frames"), list):
                        seen.add(id(e["frames"]))
            s["frame_lists"] = len(seen)
        st = v.get("allocator_settings")
        if isinstance(st, dict) and "max_split_size" in st:
            s["max_split_ok"] = -2**63 <= st["max_split_size"] < 2**64
    s["segments"] = len(segs or [])
    s["blocks"] = sum(len(seg["blocks"]) for seg in segs or [])
    c, seen, total, nbytes, stack = {}, set(), 0, 0, [v]
    def bump(k):
        c[k] = c.get(k, 0) + 1
    while stack:
        x = stack.pop()
        if isinstance(x, (list, dict)):
            kind = type(x).__name__
            bump(kind + "_refs")
            if id(x) in seen:
                continue
            seen.add(id(x))
            bump(kind)
            if isinstance(x, list):
                stack.extend(x)
            else:
                for k, e in x.items():
                    stack.append(k)
                    stack.append(e)
        elif isinstance(x, tuple):
            bump("tuple")
            stack.extend(x)
        elif isinstance(x, bool):
            bump("bool")
        elif isinstance(x, int):
            bump("int")
            total = (total + x) % 2**64
        elif isinstance(x, float):
            bump("float")
        elif isinstance(x, str):
            bump("str")
            nbytes += len(x.encode("utf-8", "surrogatepass"))
        elif x is None:
            bump("none")
        else:
            bump(type(x).__name__)
    s["census"], s["int_sum"], s["str_bytes"] = c, str(total), nbytes
    return s

out = {}
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        out[path] = summarize(Data(f).load())
json.dump(out, sys.stdout)
`

// TestFixtures decodes the real PyTorch snapshots and checks the structure against Python's stdlib pickle,
// run live on the same files so the truth is independent of this package.
func TestFixtures(t *testing.T) {
	var paths []string
	for _, name := range torchtest.Fixtures {
		paths = append(paths, torchtest.FixturePath(t, name))
	}
	python := torchtest.RequirePython(t)
	out, err := exec.Command(python, append([]string{"-c", pythonSummary}, paths...)...).Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	var want map[string]summary
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			got := summarize(t, decodeFile(t, path))
			if !reflect.DeepEqual(got, want[path]) {
				g, _ := json.Marshal(got)
				w, _ := json.Marshal(want[path])
				t.Errorf("summary differs from Python's\n got: %s\nwant: %s", g, w)
			}
		})
	}
	// A few figures docs/pytorch-snapshots.md §11 gives, so a broken Python side cannot pass vacuously.
	f3 := want[torchtest.FixturePath(t, torchtest.F3)]
	if n := f3.Traces; len(n) != 4 || n[0]+n[1]+n[2]+n[3] != 10327 || f3.Actions["segment_alloc"] != 584 {
		t.Errorf("f3: traces %v, %d segment_alloc; want 4 devices, 10,327 entries, 584", n, f3.Actions["segment_alloc"])
	}
	if n := want[torchtest.FixturePath(t, torchtest.F2)].Segments; n != 255 {
		t.Errorf("f2: %d segments; want 255", n)
	}
}

// TestTruncated cuts real snapshots short at every byte offset (f7, and the protocol 2 pickle of a
// snapshot-like dict, which has no frames to catch the cut early) or at many (f1): every prefix must fail
// with an error that says the input was truncated.
func TestTruncated(t *testing.T) {
	cases := []struct {
		name string
		data []byte
		step int
	}{
		{"f7", torchtest.OptionalFixture(t, torchtest.F7), 1},
		{"f1", torchtest.OptionalFixture(t, torchtest.F1), 61},
		{"snapshot_like.p2", mustRead(t, "testdata/python/snapshot_like.p2.pickle"), 1},
		{"keys.p3", mustRead(t, "testdata/python/keys.p3.pickle"), 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.data == nil {
				t.Skip("the real snapshots are not checked out beside the repository")
			}
			if _, err := Decode(c.data); err != nil {
				t.Fatalf("whole file: %v", err)
			}
			for n := 0; n < len(c.data); n += c.step {
				_, err := Decode(c.data[:n])
				var de *DecodeError
				if !errors.Is(err, io.ErrUnexpectedEOF) || !errors.As(err, &de) || !strings.Contains(err.Error(), "truncated") {
					t.Fatalf("cut at %d: got %v; want a truncation error", n, err)
				}
			}
		})
	}
}

// TestCorrupted overwrites each byte of small real pickles with several values. Decoding must never panic
// (TestMain lets a panic through), must return a *DecodeError when it fails, and anything it does return
// must be a well-formed tree.
func TestCorrupted(t *testing.T) {
	cases := map[string][]byte{
		"f7":               torchtest.OptionalFixture(t, torchtest.F7),
		"snapshot_like.p2": mustRead(t, "testdata/python/snapshot_like.p2.pickle"),
		"keys.p4":          mustRead(t, "testdata/python/keys.p4.pickle"),
	}
	lim := Limits{MaxDepth: 50}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			if data == nil {
				t.Skip("the real snapshots are not checked out beside the repository")
			}
			buf := make([]byte, len(data))
			fails := 0
			for i := range data {
				for _, b := range []byte{0x00, 0xff, data[i] ^ 0x80, data[i] + 1, '(', 'h', '.'} {
					copy(buf, data)
					buf[i] = b
					v, err := lim.Decode(buf)
					if err != nil {
						var de *DecodeError
						if !errors.As(err, &de) {
							t.Fatalf("byte %d = %#x: %v is not a *DecodeError", i, b, err)
						}
						fails++
						continue
					}
					checkTree(t, v, lim.MaxDepth)
				}
			}
			if fails == 0 {
				t.Fatal("no corruption was detected")
			}
		})
	}
}

// checkTree fails if a decoded value nests deeper than maxDepth or is cyclic. Shared values are measured
// once, so a heavily shared tree (a DAG) is checked in linear time.
func checkTree(t testing.TB, v any, maxDepth int) {
	t.Helper()
	const inProgress = -1
	depths := map[any]int{} // container (tuples by their first element) → depth, or inProgress
	var depth func(v any) int
	depth = func(v any) int {
		var id any
		switch x := v.(type) {
		case *List, *Dict, *Set:
			id = x
		case Tuple:
			if len(x) == 0 {
				return 1
			}
			id = &x[0]
		default:
			return 0
		}
		if d, ok := depths[id]; ok {
			if d == inProgress {
				t.Fatalf("cycle through a %s", typeName(v))
			}
			return d
		}
		depths[id] = inProgress
		h := 0
		visit := func(e any) { h = max(h, depth(e)) }
		switch x := v.(type) {
		case *List:
			for _, e := range x.All() {
				visit(e)
			}
		case *Dict:
			for k, e := range x.All() {
				visit(k)
				visit(e)
			}
		case *Set:
			for e := range x.All() {
				visit(e)
			}
		case Tuple:
			for _, e := range x {
				visit(e)
			}
		}
		depths[id] = h + 1
		if h+1 > maxDepth {
			t.Fatalf("value nests %d deep; the limit is %d", h+1, maxDepth)
		}
		return h + 1
	}
	depth(v)
}

func mustRead(t *testing.T, path string) []byte {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
