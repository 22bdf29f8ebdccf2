package pickle

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
)

// TestDeclaredLengths feeds tiny pickles that declare huge lengths and checks each fails at once, without
// allocating anything near the declared size.
func TestDeclaredLengths(t *testing.T) {
	tests := []struct {
		name, pickle string
		cause        error
	}{
		{"BINUNICODE 4 GiB", "\x80\x04X\xff\xff\xff\xffabcdefghijklmn.", ErrLimit},
		{"BINUNICODE 1 GiB", "\x80\x04X\x00\x00\x00\x40abcdefghijklmn.", io.ErrUnexpectedEOF},
		{"BINUNICODE8 1 TiB", "\x80\x04\x8d\x00\x00\x00\x00\x00\x01\x00\x00abcdefgh.", ErrLimit},
		{"BINUNICODE8 2^64-1", "\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xffabcdefgh.", ErrLimit},
		{"BINBYTES 4 GiB", "\x80\x04B\xff\xff\xff\xffabcdefghijklmn.", ErrLimit},
		{"BINBYTES8 1 TiB", "\x80\x04\x8e\x00\x00\x00\x00\x00\x01\x00\x00abcdefgh.", ErrLimit},
		{"BYTEARRAY8 1 TiB", "\x80\x05\x96\x00\x00\x00\x00\x00\x01\x00\x00abcdefgh.", ErrLimit},
		{"BINSTRING 2 GiB", "\x80\x02T\xff\xff\xff\x7fabcdefghijklmn.", ErrLimit},
		{"LONG4 2 GiB", "\x80\x02\x8b\xff\xff\xff\x7fabcdefghijklmn.", ErrLimit},
		{"FRAME 1 TiB", "\x80\x04\x95\x00\x00\x00\x00\x00\x01\x00\x00abcdefgh.", io.ErrUnexpectedEOF},
		{"SHORT_BINUNICODE past end", "\x80\x04\x8c\xffabcdefghijklmnop.", io.ErrUnexpectedEOF},
		{"LONG_BINPUT 2^32-1", "\x80\x02]r\xff\xff\xff\xffj\xff\xff\xff\xff.", nil},
		{"INT without newline", "\x80\x02I" + strings.Repeat("1", 17), io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := []byte(tt.pickle)
			if len(data) > 32 {
				t.Fatalf("test pickle is %d bytes; keep it small", len(data))
			}
			_, err := Decode(data)
			if tt.cause == nil && err != nil || tt.cause != nil && !errors.Is(err, tt.cause) {
				t.Fatalf("got %v; want %v", err, tt.cause)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			const runs = 50
			allocs := testing.AllocsPerRun(runs, func() { Decode(data) })
			runtime.ReadMemStats(&after)
			perRun := (after.TotalAlloc - before.TotalAlloc) / (runs + 1)
			// A decode's fixed cost is about a dozen allocations (the Doc's slices, the decoder's stack and
			// memo) and a failure's error a few more; what must not happen is work that grows with a declared
			// length.
			if allocs > 32 || perRun > 16<<10 {
				t.Errorf("%.0f allocations, %d bytes per decode; want a small constant", allocs, perRun)
			}
		})
	}
}

// TestLimits checks that each Limits field is enforced, and named in the error.
func TestLimits(t *testing.T) {
	nested := func(n int) string { return "\x80\x02" + strings.Repeat("]", n) + strings.Repeat("a", n-1) + "." }
	tests := []struct {
		name   string
		lim    Limits
		pickle string
		field  string // "" when the pickle must decode within lim
	}{
		{"MaxInput", Limits{MaxInput: 4}, "\x80\x02N.", ""},
		{"MaxInput over", Limits{MaxInput: 3}, "\x80\x02N.", "MaxInput"},
		{"MaxString", Limits{MaxString: 3}, "\x80\x04\x8c\x03abc.", ""},
		{"MaxString over", Limits{MaxString: 3}, "\x80\x04\x8c\x04abcd.", "MaxString"},
		{"MaxString bytes", Limits{MaxString: 3}, "\x80\x04C\x04abcd.", "MaxString"},
		{"MaxInt", Limits{MaxInt: 2}, "\x80\x02\x8a\x02\x01\x02.", ""},
		{"MaxInt over", Limits{MaxInt: 2}, "\x80\x02\x8a\x03\x01\x02\x03.", "MaxInt"},
		{"MaxInt text", Limits{MaxInt: 2}, "I123\n.", "MaxInt"},
		{"MaxMemo", Limits{MaxMemo: 2}, "\x80\x04N\x94N\x94.", ""},
		{"MaxMemo over", Limits{MaxMemo: 2}, "\x80\x04N\x94N\x94N\x94.", "MaxMemo"},
		{"MaxMemo sparse", Limits{MaxMemo: 2}, "\x80\x02Nq\x05q\x07q\x09.", "MaxMemo"},
		{"MaxStack", Limits{MaxStack: 3}, "\x80\x02(NN0.", ""},
		{"MaxStack over", Limits{MaxStack: 3}, "\x80\x02(NNN.", "MaxStack"},
		{"MaxStack memo", Limits{MaxStack: 2}, "\x80\x04N\x94h\x00h\x00.", "MaxStack"},
		{"MaxStack marks", Limits{MaxStack: 2}, "\x80\x04(((N.", "MaxStack"},
		{"MaxItems", Limits{MaxItems: 2}, "\x80\x02](NNe.", ""},
		{"MaxItems list", Limits{MaxItems: 2}, "\x80\x02](NNeNa.", "MaxItems"},
		{"MaxItems dict", Limits{MaxItems: 1}, "\x80\x02}(K\x01NK\x02Nu.", "MaxItems"},
		{"MaxItems tuple", Limits{MaxItems: 2}, "\x80\x02(NNNt.", "MaxItems"},
		{"MaxItems set", Limits{MaxItems: 2}, "\x80\x04\x8f(K\x01K\x02K\x03\x90.", "MaxItems"},
		{"MaxDepth", Limits{MaxDepth: 3}, nested(3), ""},
		{"MaxDepth lists", Limits{MaxDepth: 3}, nested(4), "MaxDepth"},
		{"MaxDepth default", Limits{}, nested(2000), "MaxDepth"},
		{"MaxDepth tuples", Limits{MaxDepth: 3}, "\x80\x02)\x85\x85\x85.", "MaxDepth"},
		{"MaxDepth tuple of list", Limits{MaxDepth: 3}, "\x80\x02]]a\x85\x85.", "MaxDepth"},
		{"MaxDepth dict", Limits{MaxDepth: 2}, "\x80\x02}K\x01}K\x01]ss.", "MaxDepth"},
		{"MaxDepth list of dicts", Limits{MaxDepth: 2}, "\x80\x02](}K\x01]se.", "MaxDepth"},
		{"MaxObjects", Limits{MaxObjects: 3}, "\x80\x02(NNt.", ""},
		{"MaxObjects over", Limits{MaxObjects: 3}, "\x80\x02(NNNt.", "MaxObjects"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.lim.Decode([]byte(tt.pickle))
			if tt.field == "" {
				if err != nil {
					t.Fatalf("within the limit: %v", err)
				}
				return
			}
			var de *DecodeError
			if !errors.Is(err, ErrLimit) || !errors.As(err, &de) || !strings.Contains(err.Error(), "Limits."+tt.field) {
				t.Fatalf("got %v; want an ErrLimit naming Limits.%s", err, tt.field)
			}
		})
	}
}

// endless is a reader that never ends, counting what it hands out.
type endless struct{ n int64 }

func (r *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'N'
	}
	r.n += int64(len(p))
	return len(p), nil
}

// TestDecodeReader checks the io.Reader entry point: the same result as Decode, and a limit on how much it
// reads from an endless input.
func TestDecodeReader(t *testing.T) {
	t.Run("same as Decode", func(t *testing.T) {
		v, err := DecodeReader(bytes.NewReader([]byte("\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00]K\x01a.")))
		if err != nil {
			t.Fatal(err)
		}
		if l, ok := v.(*List); !ok || l.Len() != 1 || l.At(0) != int64(1) {
			t.Fatalf("got %#v", v)
		}
	})
	t.Run("endless input", func(t *testing.T) {
		r := &endless{}
		_, err := Limits{MaxInput: 1 << 20}.DecodeReader(r)
		if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "MaxInput") {
			t.Fatalf("got %v; want the MaxInput limit", err)
		}
		if r.n > 2<<20 {
			t.Fatalf("read %d bytes for a 1 MiB limit", r.n)
		}
	})
	t.Run("read error", func(t *testing.T) {
		boom := errors.New("disk on fire")
		_, err := DecodeReader(io.MultiReader(strings.NewReader("\x80\x04"), errReader{boom}))
		var de *DecodeError
		if !errors.Is(err, boom) || !errors.As(err, &de) {
			t.Fatalf("got %v; want the read error wrapped in a *DecodeError", err)
		}
	})
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// TestRecoverBoundary checks the last line of defence turns a panic into an error. No input reaches it (the
// other tests run with it disabled); this calls it directly.
func TestRecoverBoundary(t *testing.T) {
	panicOnBug = false
	defer func() { panicOnBug = true }()
	d := &decoder{data: []byte("\x80\x02N."), at: 2}
	err := func() (err error) {
		defer d.recoverBug(&err)
		panic("boom")
	}()
	var de *DecodeError
	if !errors.As(err, &de) || !errors.Is(err, errInternal) || de.Op != "NONE" || de.Offset != 2 {
		t.Fatalf("got %v; want an internal error at NONE, offset 2", err)
	}
}

// TestKeyWork checks that hashing dict keys stays proportional to the input: a shared tuple key is hashed
// once however often it is used, while keys whose hashing would explode are refused.
func TestKeyWork(t *testing.T) {
	// sharedTuples builds T0 = () and T(i+1) = (Ti, Ti), memoized at i: T60 spells out 2^60 leaves.
	sharedTuples := func(n int) string {
		s := "\x80\x04)\x94"
		for i := range n {
			s += "h" + string(rune(i)) + "h" + string(rune(i)) + "\x86\x94"
		}
		return s
	}
	longStrings := func(n, size int) string {
		s := "\x80\x04"
		for i := range n {
			s += "X" + string([]byte{byte(size), byte(size >> 8), byte(size >> 16), 0}) + strings.Repeat("k", size-1) + string(rune('a'+i)) + "\x94"
		}
		return s
	}
	tests := []struct {
		name   string
		pickle string
		ok     bool
	}{
		{"nested shared tuple key", sharedTuples(60) + "}h\x3cNs.", false},
		{"nested shared tuple in set", sharedTuples(60) + "\x8f(h\x3c\x90.", false},
		{"shared tuple key used often", "\x80\x04K\x00K\x00\x86\x94" + strings.Repeat("}h\x00Ns0", 20000) + "N.", true},
		{"shallow shared tuple keys", sharedTuples(8) + "}(" + strings.Repeat("h\x08N", 1000) + "u.", true},
		{"long str keys used often", longStrings(20, 100000) + "}(" + strings.Repeat("h\x00Nh\x01N", 20000) + "u.", false},
		{"big int keys used often", "\x80\x04\x8b\x00\x10\x00\x00" + strings.Repeat("\x01", 4096) + "\x94}(" + strings.Repeat("h\x00N", 50000) + "u.", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.pickle))
			if tt.ok && err != nil {
				t.Fatal(err)
			}
			if !tt.ok && !errors.Is(err, ErrLimit) {
				t.Fatalf("got %v; want ErrLimit", err)
			}
		})
	}
}

// TestMemoryPerInputByte pins the bounds Limits documents: whatever the opcodes, DecodeDoc allocates at most
// about 96 bytes per input byte, and Decode, which also builds Go values, at most about 256.
func TestMemoryPerInputByte(t *testing.T) {
	const n = 50000
	tests := map[string]string{
		"empty lists":          strings.Repeat("]", n),
		"memoized dicts":       strings.Repeat("}\x94", n),
		"tuples of None":       strings.Repeat("N\x85", n),
		"marks":                strings.Repeat("(", n) + "N",
		"memo reads appended":  "N\x94](" + strings.Repeat("h\x00", n) + "e",
		"dicts in a list":      "](" + strings.Repeat("}", n) + "e",
		"ints":                 strings.Repeat("J\x01\x02\x03\x04", n),
		"sparse memo":          "N" + strings.Repeat("r\x01\x02\x03\x04", n),
		"short strings":        strings.Repeat("\x8c\x01a", n),
		"set of ints":          "\x8f(" + strings.Repeat("J\x01\x02\x03\x04", n) + "\x90",
		"dict with int keys":   "}(" + strings.Repeat("J\x01\x02\x03\x04N", n) + "u",
		"list of tuples":       "](" + strings.Repeat("N\x85", n) + "e",
		"nested shared tuples": ")\x94" + strings.Repeat("h\x00h\x00\x86", n),
	}
	perByte := func(data []byte, decode func([]byte) error) float64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		if err := decode(data); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		return float64(after.TotalAlloc-before.TotalAlloc) / float64(len(data))
	}
	for name, body := range tests {
		t.Run(name, func(t *testing.T) {
			data := []byte("\x80\x04" + body + ".")
			doc := perByte(data, func(b []byte) error { _, err := DecodeDoc(b); return err })
			tree := perByte(data, func(b []byte) error { _, err := Decode(b); return err })
			if doc > 96 || tree > 256 {
				t.Errorf("%s: %.0f bytes allocated per input byte by DecodeDoc, %.0f by Decode", name, doc, tree)
			}
		})
	}
}
