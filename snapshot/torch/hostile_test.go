package torch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
)

// pickleOf hand-assembles a protocol-2 pickle of JSON-like data (dicts, lists, str, int), so that tests can
// build malformed snapshots without Python.
func pickleOf(t *testing.T, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	b.WriteString("\x80\x02")
	var enc func(v any)
	enc = func(v any) {
		switch x := v.(type) {
		case nil:
			b.WriteByte('N')
		case bool:
			if x {
				b.WriteByte(0x88)
			} else {
				b.WriteByte(0x89)
			}
		case int:
			b.WriteByte('J')
			var n [4]byte
			for i := range n {
				n[i] = byte(uint32(int32(x)) >> (8 * i))
			}
			b.Write(n[:])
		case *big.Int: // LONG1, two's complement little-endian, for a non-negative x
			mag := x.Bytes()
			le := make([]byte, len(mag)+1) // a zero top byte keeps it positive
			for i, c := range mag {
				le[len(mag)-1-i] = c
			}
			b.Write([]byte{0x8a, byte(len(le))})
			b.Write(le)
		case float64:
			b.WriteByte('G')
			bits := make([]byte, 8)
			u := math.Float64bits(x)
			for i := range bits {
				bits[i] = byte(u >> (56 - 8*i))
			}
			b.Write(bits)
		case string:
			b.WriteByte('X')
			n := len(x)
			b.Write([]byte{byte(n), byte(n >> 8), byte(n >> 16), byte(n >> 24)})
			b.WriteString(x)
		case []any:
			b.WriteString("]")
			for _, e := range x {
				enc(e)
				b.WriteByte('a')
			}
		case map[string]any:
			b.WriteString("}")
			for _, k := range slices.Sorted(maps.Keys(x)) {
				enc(k)
				enc(x[k])
				b.WriteByte('s')
			}
		default:
			t.Fatalf("pickleOf: %T", v)
		}
	}
	enc(v)
	b.WriteByte('.')
	return b.Bytes()
}

// TestHostile feeds malformed and hostile inputs and checks each fails with a typed error naming the
// problem (and, for structural errors, where it is), and never panics.
func TestHostile(t *testing.T) {
	entry := func(kv ...any) map[string]any {
		m := map[string]any{"action": "alloc", "addr": 4096, "size": 512, "stream": 0}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == nil {
				delete(m, kv[i].(string))
				continue
			}
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	traces := func(e ...any) map[string]any { return map[string]any{"device_traces": []any{e}} }
	seg := func(kv ...any) map[string]any {
		m := map[string]any{"device": 0, "address": 4096, "total_size": 2097152, "stream": 0,
			"segment_type": "small", "blocks": []any{map[string]any{"address": 4096, "size": 2097152,
				"requested_size": 0, "state": "inactive"}}}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	tests := map[string]struct {
		data []byte
		want error
		msg  string // a substring of the error
	}{
		"empty":          {nil, ErrNotSnapshot, "neither a pickle"},
		"text":           {[]byte("hello"), ErrNotSnapshot, "neither a pickle"},
		"protocol 1":     {[]byte("\x80\x01}."), ErrNotSnapshot, `without "segments"`},
		"protocol 6":     {[]byte("\x80\x06}."), ErrMalformed, "protocol"},
		"not a dict":     {pickleOf(t, 7), ErrNotSnapshot, "the top level is a int"},
		"unrelated dict": {pickleOf(t, map[string]any{"weights": []any{}}), ErrNotSnapshot, `without "segments"`},
		"global opcode":  {[]byte("\x80\x02cos\nsystem\nq\x00."), ErrUnsafe, "GLOBAL"},
		"truncated":      {[]byte("\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments"), ErrTruncated, ""},
		"huge string":    {[]byte("\x80\x02X\xff\xff\xff\xff."), ErrLimit, "MaxString"},
		"huge long4":     {[]byte("\x80\x04\x8b\xff\xff\xff\x7f."), ErrLimit, ""},
		"pickled size past 2^64": {pickleOf(t, traces(entry("size", new(big.Int).Lsh(big.NewInt(1), 64)))), ErrSchema,
			"device_traces[0][0].size: unexpected snapshot structure: int 18446744073709551616 out of range"},
		"size past 2^64": {[]byte(`{"device_traces": [[{"action": "alloc", "addr": 4096, "size": 18446744073709551616}]]}`), ErrSchema,
			"device_traces[0][0].size: unexpected snapshot structure: int 18446744073709551616 out of range (a snapshot's ints lie in -2^63 to 2^64-1)"},
		"addr below -2^63": {[]byte(`{"device_traces": [[{"action": "alloc", "addr": -9223372036854775809, "size": 1}]]}`), ErrSchema,
			"device_traces[0][0].addr: unexpected snapshot structure: int -9223372036854775809 out of range"},
		"time of 100 digits": {[]byte(`{"device_traces": [[{"action": "alloc", "addr": 1, "size": 1, "time_us": 1` + strings.Repeat("0", 99) + `}]]}`), ErrSchema,
			"device_traces[0][0].time_us: unexpected snapshot structure: int of 100 digits out of range"},
		"json garbage":  {[]byte(`{"segments": [1,`), ErrTruncated, ""},
		"json trailing": {[]byte(`{"segments": []} x`), ErrMalformed, ""},
		"size is str": {pickleOf(t, traces(entry("size", "big"))), ErrSchema,
			"device_traces[0][0].size: unexpected snapshot structure: want int, got str"},
		"negative size": {pickleOf(t, traces(entry("size", -5))), ErrSchema, "device_traces[0][0].size"},
		"no action":     {pickleOf(t, traces(entry("action", nil))), ErrSchema, `device_traces[0][0]: unexpected snapshot structure: missing "action"`},
		"frames not a list": {pickleOf(t, traces(entry("frames", "x"))), ErrSchema,
			"device_traces[0][0].frames: unexpected snapshot structure: want list, got str"},
		"frame line is str": {pickleOf(t, traces(entry("frames", []any{map[string]any{"name": "f", "filename": "a.py", "line": "7"}}))),
			ErrSchema, "device_traces[0][0].frames[0].line"},
		"trace not a list": {pickleOf(t, map[string]any{"device_traces": []any{7}}), ErrSchema, "device_traces[0]: unexpected snapshot structure: want list, got int"},
		"bad state": {pickleOf(t, map[string]any{"segments": []any{seg("blocks", []any{map[string]any{"size": 512, "state": "weird"}})}}),
			ErrSchema, "segments[0].blocks[0].state"},
		"device out of range": {pickleOf(t, map[string]any{"segments": []any{seg("device", 1<<20)}}), ErrSchema, "segments[0].device"},
		"segment without blocks": {pickleOf(t, []any{map[string]any{"device": 0, "address": 0, "total_size": 0}}), ErrSchema,
			`segments[0]: unexpected snapshot structure: missing "blocks"`},
		"bad stage": {pickleOf(t, map[string]any{"device_traces": []any{}, "external_annotations": []any{
			map[string]any{"stage": "MIDDLE", "name": "x", "device": 0, "time_us": 1}}}), ErrSchema, "external_annotations[0].stage"},
		"settings not a dict": {pickleOf(t, map[string]any{"device_traces": []any{}, "allocator_settings": []any{}}), ErrSchema,
			"allocator_settings: unexpected snapshot structure: want dict, got list"},
		"bad divisions": {pickleOf(t, map[string]any{"device_traces": []any{}, "allocator_settings": map[string]any{
			"roundup_power2_divisions": map[string]any{"1": 3}}}), ErrSchema, "roundup_power2_divisions.1"},
		// Sizes no device holds (snapshot.MaxBytes): two live blocks of 2^62 bytes made every total wrap.
		"two live blocks of 2^62 bytes": {pickleOf(t, traces(entry("size", big.NewInt(1<<62)),
			entry("addr", 1<<30, "size", big.NewInt(1<<62)))), ErrSchema,
			"sizes past what any device holds: event 0 (alloc) has a size of 4611686018427387904 bytes, outside 0 to 2^50 bytes (1 PiB)"},
		"blocks adding up past 2^55 bytes": {pickleOf(t, traces(func() []any {
			var es []any
			for i := range 40 { // each names 2^51, its request and its block: the 17th passes 2^55
				es = append(es, entry("addr", (i+1)<<20, "size", big.NewInt(1<<50)))
			}
			return es
		}()...)), ErrSchema, "sizes add up to more than 2^55 bytes (32 PiB)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s, err := Import(tc.data)
			if err == nil {
				t.Fatalf("imported %d events, want an error", s.Events.Len())
			}
			var ie *ImportError
			if !errors.As(err, &ie) {
				t.Fatalf("%T %v is not an *ImportError", err, err)
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("%v does not wrap %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", err, tc.msg)
			}
		})
	}
}

// TestLimits checks that Limits bound what an import takes.
func TestLimits(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "snapshots", "g3.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		lim Limits
		ok  bool
	}{
		"defaults":         {Limits{}, true},
		"input too big":    {Limits{MaxInput: int64(len(data) - 1)}, false},
		"too many entries": {Limits{MaxEvents: 8}, false},
		"just enough":      {Limits{MaxInput: int64(len(data)), MaxEvents: 64}, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Import(data, WithLimits(tc.lim))
			if (err == nil) != tc.ok {
				t.Fatalf("error %v, want ok %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrLimit) {
				t.Errorf("%v does not wrap ErrLimit", err)
			}
		})
	}
}

// TestTruncatedEverywhere cuts a snapshot at every length: each prefix fails with a typed error (or, for a
// JSON prefix that happens to close, imports), and none panics.
func TestTruncatedEverywhere(t *testing.T) {
	for _, name := range []string{"g5.pickle", "g0.pickle"} {
		data, err := os.ReadFile(filepath.Join("testdata", "snapshots", name))
		if err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) {
			for n := range len(data) {
				_, err := Import(data[:n])
				var ie *ImportError
				if !errors.As(err, &ie) {
					t.Fatalf("cut at %d: %v, want an *ImportError", n, err)
				}
				if n > 2 && !errors.Is(err, ErrTruncated) {
					t.Fatalf("cut at %d: %v, want ErrTruncated", n, err)
				}
			}
		})
	}
}

// TestHugeDeclaredLengths checks that lengths a file declares are not trusted: a 12-byte file claiming a
// 4 GiB string allocates next to nothing.
func TestHugeDeclaredLengths(t *testing.T) {
	inputs := map[string][]byte{
		"binunicode 4 GiB": []byte("\x80\x02X\xff\xff\xff\xff."),
		"frame 2^63":       []byte("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7f}."),
		"unicode8 2^40":    []byte("\x80\x04\x8d\x00\x00\x00\x00\x00\x01\x00\x00."),
		"bytes8 2^40":      []byte("\x80\x04\x8e\x00\x00\x00\x00\x00\x01\x00\x00."),
	}
	for name, data := range inputs {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Import(data)
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Fatal("imported a hostile input")
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
				t.Errorf("allocated %d bytes for a %d-byte input", grew, len(data))
			}
		})
	}
}

// TestDeterministic checks that importing the same bytes twice gives equal snapshots, written to equal files:
// a later export and re-import can then be compared.
func TestDeterministic(t *testing.T) {
	for _, name := range []string{torchtest.F3, torchtest.F4} {
		t.Run(name, func(t *testing.T) {
			data := torchtest.ReadFixture(t, name)
			a, err := Import(data)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Import(data)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a, b) {
				t.Fatal("two imports of the same bytes differ")
			}
			var fa, fb bytes.Buffer
			if err := writeNative(&fa, a); err != nil {
				t.Fatal(err)
			}
			if err := writeNative(&fb, b); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(fa.Bytes(), fb.Bytes()) {
				t.Error("two imports write different files")
			}
		})
	}
}

// TestWritesAndReadsBack checks that an imported snapshot is a valid oomdbg snapshot: the writer takes every
// event and table entry, and the reader gives back the same events, tables, metadata and footer.
func TestWritesAndReadsBack(t *testing.T) {
	for _, name := range torchtest.Fixtures {
		t.Run(name, func(t *testing.T) {
			s, err := Import(torchtest.ReadFixture(t, name))
			if err != nil {
				t.Fatal(err)
			}
			checkWellFormed(t, s)
			var buf bytes.Buffer
			if err := writeNative(&buf, s); err != nil {
				t.Fatal(err)
			}
			r, err := snapshot.Read(&buf)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Events.Equal(&s.Events) {
				t.Error("events differ after a write and read")
			}
			if !reflect.DeepEqual(r.Strings, s.Strings) || !reflect.DeepEqual(r.Frames, s.Frames) || !reflect.DeepEqual(r.Stacks, s.Stacks) {
				t.Error("tables differ after a write and read")
			}
			wantFooter, _ := json.Marshal(s.Footer)
			gotFooter, _ := json.Marshal(r.Footer)
			if !bytes.Equal(wantFooter, gotFooter) {
				t.Error("footer differs after a write and read")
			}
			if string(r.Meta.Workload) != string(s.Meta.Workload) || r.Meta.AllocatorSettings != s.Meta.AllocatorSettings ||
				!r.Meta.Created.Equal(s.Meta.Created) {
				t.Error("metadata differs after a write and read")
			}
		})
	}
}

// TestSniff checks the format detection by content.
func TestSniff(t *testing.T) {
	tests := map[string]struct {
		prefix []byte
		want   bool
	}{
		"pickle protocol 2": {[]byte("\x80\x02}q\x00"), true},
		"pickle protocol 4": {[]byte("\x80\x04\x95\x10\x00"), true},
		"pickle protocol 5": {[]byte("\x80\x05\x95"), true},
		"pickle protocol 6": {[]byte("\x80\x06\x95"), false},
		"pickle protocol 1": {[]byte("\x80\x01"), false},
		"lone PROTO":        {[]byte("\x80"), false},
		"json object":       {[]byte(`{"segments"`), true},
		"json list":         {[]byte(" \n\t[{"), true},
		"json with BOM":     {[]byte("\xef\xbb\xbf{"), true},
		"oomdbg snapshot":   {[]byte(snapshot.Magic), false},
		"text":              {[]byte("segments"), false},
		"empty":             {nil, false},
		"only whitespace":   {[]byte("   "), false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Sniff(tc.prefix); got != tc.want {
				t.Errorf("Sniff(%q) = %v, want %v", tc.prefix, got, tc.want)
			}
		})
	}
}

// TestUnknownActions checks that trace entries of actions a newer PyTorch may record are skipped and counted,
// not fatal, and that a trace left empty by them has no time.
func TestUnknownActions(t *testing.T) {
	s, err := Import([]byte(`{"device_traces": [[{"action": "defragment", "addr": 1, "size": 2, "time_us": 5},
		{"action": "defragment", "addr": 3, "size": 4, "time_us": 6}]]}`))
	if err != nil {
		t.Fatal(err)
	}
	o, _ := OriginOf(s)
	if !reflect.DeepEqual(o.SkippedActions, map[string]int{"defragment": 2}) || o.TraceEntries != 2 {
		t.Errorf("skipped %v of %d entries, want defragment: 2 of 2", o.SkippedActions, o.TraceEntries)
	}
	if s.Events.Len() != 0 || s.Meta.TimeUnit != "index" || !s.Meta.Created.IsZero() {
		t.Errorf("%d events, time unit %q, created %v; want none, index, zero", s.Events.Len(), s.Meta.TimeUnit, s.Meta.Created)
	}
}

// TestSharedListsDoNotExpand builds a 60 KB pickle whose 1,000 segments all share one list of 1,000 blocks
// through the memo: a million blocks if expanded. The import refuses it instead of expanding it.
func TestSharedListsDoNotExpand(t *testing.T) {
	str := func(s string) string { return "X" + string([]byte{byte(len(s)), 0, 0, 0}) + s }
	var b strings.Builder
	b.WriteString("\x80\x02}" + str("segments"))
	b.WriteString("]q\x00(") // the blocks list, memo slot 0
	for range 1000 {
		b.WriteString("}(" + str("size") + "J\x00\x02\x00\x00" + str("state") + str("inactive") + "u")
	}
	b.WriteString("e0](") // APPENDS; POP it (it stays in the memo); the segments list
	for i := range 1000 {
		b.WriteString("}(" + str("device") + "K\x00" + str("address") + "J" + string([]byte{0, 0, byte(i), byte(i >> 8)}) +
			str("total_size") + "J\x00\x00\x08\x00" + str("blocks") + "h\x00u")
	}
	b.WriteString("es.")
	data := []byte(b.String())
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := Import(data)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrLimit) {
		t.Fatalf("error %v, want ErrLimit", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64*uint64(len(data)) {
		t.Errorf("allocated %d bytes for a %d-byte input", grew, len(data))
	}
}

// TestExpandableMappedDuringTheTrace pins that a range mapped by the trace and still mapped at the end is
// neither an inconsistency nor a segment from before the trace.
func TestExpandableMappedDuringTheTrace(t *testing.T) {
	const base = 0x7f0000000000
	data := []byte(fmt.Sprintf(`{"segments": [{"device": 0, "address": %d, "total_size": 20971520, "allocated_size": 1024,
		"active_size": 1024, "requested_size": 1000, "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0],
		"is_expandable": true, "frames": [], "blocks": [
			{"address": %d, "size": 1024, "requested_size": 1000, "state": "active_allocated", "frames": []},
			{"address": %d, "size": 20970496, "requested_size": 0, "state": "inactive", "frames": []}]}],
		"device_traces": [[
			{"action": "segment_map", "addr": %d, "size": 20971520, "stream": 0, "time_us": 1},
			{"action": "alloc", "addr": %d, "size": 1000, "stream": 0, "time_us": 2}]]}`, base, base, base+1024, base, base))
	s, err := Import(data)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := OriginOf(s)
	if !ok {
		t.Fatal("no import origin recorded")
	}
	if o.Inconsistencies != 0 {
		t.Errorf("%d inconsistencies in a consistent trace", o.Inconsistencies)
	}
	var maps int
	for _, e := range s.Events.All() {
		if e.Action == snapshot.ActionSegmentMap {
			maps++
		}
	}
	if maps != 1 {
		t.Errorf("%d segment_map events, want the trace's one (no pre-existing copy of the range)", maps)
	}
}

// TestSettingsStringParsedAsPyTorch checks the recorded PYTORCH_CUDA_ALLOC_CONF string sizes blocks when
// PyTorch's parser takes it (large_segment_size_mb:40 makes a 5 MiB request's segment 40 MiB), and that a
// string PyTorch refuses ("true" is not a boolean to it) changes nothing and is reported.
func TestSettingsStringParsedAsPyTorch(t *testing.T) {
	tests := map[string]struct {
		conf    string
		segment int64
		err     string
	}{
		"accepted": {"large_segment_size_mb:40", 40 << 20, ""},
		"refused":  {"large_segment_size_mb:40,expandable_segments:true", 20 << 20, "Expected 'True' or 'False' at index 6 in ConfigTokenizer but got 'true'"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			data := []byte(fmt.Sprintf(`{"segments": [], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": %q},
				"device_traces": [[{"action": "oom", "device_free": 1024, "size": 5242880, "stream": 0, "time_us": 1}]]}`, tc.conf))
			s, err := Import(data)
			if err != nil {
				t.Fatal(err)
			}
			o, _ := OriginOf(s)
			if o.SettingsError != tc.err {
				t.Errorf("SettingsError %q, want %q", o.SettingsError, tc.err)
			}
			if s.Meta.AllocatorSettings != tc.conf {
				t.Errorf("settings %q, want the recorded string %q", s.Meta.AllocatorSettings, tc.conf)
			}
			var found bool
			for _, e := range s.Events.All() {
				if e.Action == snapshot.ActionOOM {
					found = true
					if e.BlockSize != tc.segment {
						t.Errorf("oom segment %d, want %d", e.BlockSize, tc.segment)
					}
				}
			}
			if !found {
				t.Fatal("no oom event imported")
			}
		})
	}
}
