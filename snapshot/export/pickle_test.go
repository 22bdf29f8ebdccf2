package export

import (
	"bytes"
	"encoding/hex"
	"math"
	"strconv"
	"strings"
	"testing"
)

// scalar is one value for the pickle writer, with the Python expression that makes the same value.
type scalar struct {
	python string
	write  func(e *pickleEncoder)
}

func scalars() []scalar {
	ints := []int64{0, 1, 255, 256, 65535, 65536, -1, -256, math.MaxInt32, math.MinInt32, math.MaxInt32 + 1,
		math.MinInt32 - 1, 0x7f0000000000, 0x7fffffffffff, 0x800000000000, 1735689600000002, math.MaxInt64, math.MinInt64}
	var out []scalar
	for _, v := range ints {
		out = append(out, scalar{python: strconv.FormatInt(v, 10), write: func(e *pickleEncoder) { e.int(v) }})
	}
	out = append(out,
		scalar{"2**64-1", func(e *pickleEncoder) { e.uint(math.MaxUint64) }},
		scalar{"2**63", func(e *pickleEncoder) { e.uint(1 << 63) }},
		scalar{"''", func(e *pickleEncoder) { e.str("") }},
		scalar{"'alloc'", func(e *pickleEncoder) { e.str("alloc") }},
		scalar{"'f32[16,32] → é'", func(e *pickleEncoder) { e.str("f32[16,32] → é") }},
		scalar{"'x'*255", func(e *pickleEncoder) { e.str(strings.Repeat("x", 255)) }},
		scalar{"'x'*256", func(e *pickleEncoder) { e.str(strings.Repeat("x", 256)) }},
		scalar{"'y'*70000", func(e *pickleEncoder) { e.str(strings.Repeat("y", 70000)) }},
		scalar{"0.0", func(e *pickleEncoder) { e.float(0) }},
		scalar{"0.6", func(e *pickleEncoder) { e.float(0.6) }},
		scalar{"-2.5e300", func(e *pickleEncoder) { e.float(-2.5e300) }},
		scalar{"True", func(e *pickleEncoder) { e.bool(true) }},
		scalar{"False", func(e *pickleEncoder) { e.bool(false) }},
		scalar{"None", func(e *pickleEncoder) { e.none() }},
	)
	return out
}

// TestPickleScalarsMatchCPython checks every scalar opcode byte for byte against CPython's own pickler at
// protocol 4 (framing, memoized strings and the choice of integer opcode included).
func TestPickleScalarsMatchCPython(t *testing.T) {
	values := scalars()
	var exprs []string
	for _, v := range values {
		exprs = append(exprs, v.python)
	}
	var want []string
	python(t, `
import json, pickle, sys
print(json.dumps([pickle.dumps(eval(x), protocol=4).hex() for x in sys.argv[1:]]))
`, &want, exprs...)
	for i, v := range values {
		t.Run(v.python[:min(len(v.python), 24)], func(t *testing.T) {
			var buf bytes.Buffer
			e := newPickleEncoder(&buf)
			v.write(e)
			if err := e.close(); err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(buf.Bytes()); got != want[i] {
				t.Errorf("pickle of %s\n got %s\nwant %s", v.python, got[:min(len(got), 200)], want[i][:min(len(want[i]), 200)])
			}
		})
	}
}

// TestPickleContainers writes lists and dicts across CPython's batch size of 1000 and across frames, with
// shared values, and has Python check what it reads: equal values, and shared values that are one object.
func TestPickleContainers(t *testing.T) {
	var buf bytes.Buffer
	e := newPickleEncoder(&buf)
	e.beginDict()
	e.key("list")
	e.beginList()
	for i := range 2500 {
		e.int(int64(i) * 1000003)
	}
	e.endList()
	e.key("dict")
	e.beginDict()
	for i := range 1500 {
		e.key("k" + strconv.Itoa(i))
		e.str(strings.Repeat("v", i%300))
	}
	e.endDict()
	e.key("empty")
	e.beginList()
	e.endList()
	e.key("pool")
	e.intPair(0, 0)
	e.key("shared")
	e.beginList()
	for range 3 {
		if !e.shared(refStack, 7) {
			e.beginList()
			for j := range 2 {
				if !e.shared(refFrame, uint32(j)) {
					e.beginDict()
					e.key("name")
					e.str("f" + strconv.Itoa(j))
					e.endDict()
				}
			}
			e.endList()
		}
	}
	e.endList()
	e.endDict()
	if err := e.close(); err != nil {
		t.Fatal(err)
	}
	var got struct {
		ListOK, DictOK, EmptyOK, SharedOK, FramesOK bool
		Frames                                      int
	}
	python(t, `
import io, json, pickle, pickletools, sys
class DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("global refused")
raw = open(sys.argv[1], "rb").read()
d = DataOnly(io.BytesIO(raw)).load()
s = d["shared"]
print(json.dumps({
    "ListOK": d["list"] == [i * 1000003 for i in range(2500)],
    "DictOK": d["dict"] == {"k%d" % i: "v" * (i % 300) for i in range(1500)},
    "EmptyOK": d["empty"] == [] and d["pool"] == (0, 0),
    "SharedOK": len(s) == 3 and s[0] is s[1] is s[2] and s[0] == [{"name": "f0"}, {"name": "f1"}],
    "FramesOK": True,
    "Frames": sum(1 for op, _, _ in pickletools.genops(raw) if op.name == "FRAME"),
}))
`, &got, writeTemp(t, "containers.pickle", buf.Bytes()))
	if !got.ListOK || !got.DictOK || !got.EmptyOK || !got.SharedOK {
		t.Errorf("Python read back %+v", got)
	}
	if got.Frames < 2 {
		t.Errorf("%d frames in a %d-byte pickle, want one per 64 KiB", got.Frames, buf.Len())
	}
}

// TestJSONStrings checks the JSON writer's escaping against Python's json module, which must read back every
// string as written (invalid UTF-8 as U+FFFD).
func TestJSONStrings(t *testing.T) {
	in := []string{"", "plain", `quote " and \ backslash`, "tab\tnewline\n\r", "\x00\x01\x1f", "é → 😀", "\u2028\u2029",
		"<html>&", "bad \xff utf8"}
	var buf bytes.Buffer
	e := newJSONEncoder(&buf)
	e.beginList()
	for _, s := range in {
		e.str(s)
	}
	e.float(0.6)
	e.float(2)
	e.endList()
	if err := e.close(); err != nil {
		t.Fatal(err)
	}
	var got []any
	python(t, `
import json, sys
print(json.dumps(json.load(open(sys.argv[1], encoding="utf-8"))))
`, &got, writeTemp(t, "strings.json", buf.Bytes()))
	for i, s := range in {
		want := strings.ToValidUTF8(s, "\uFFFD")
		if got[i] != want {
			t.Errorf("string %d: Python read %q, want %q", i, got[i], want)
		}
	}
	if got[len(in)] != 0.6 || got[len(in)+1] != 2.0 || !strings.Contains(buf.String(), "2.0") {
		t.Errorf("floats read as %v, %v from %s", got[len(in)], got[len(in)+1], buf.String())
	}
}
