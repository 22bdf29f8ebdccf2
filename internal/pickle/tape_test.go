package pickle

import (
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
)

// checkDoc walks a Doc value and the Go value Any made of it side by side, failing where they disagree: the
// accessors a consumer reads a Doc with must say what the tree says. It also checks Get and Pick find every
// str key of every dict, and Key for every short one.
func checkDoc(t *testing.T, d *Doc, v Value, x any, depth int) {
	t.Helper()
	if depth > 2000 {
		t.Fatal("deeper than any decode allows")
	}
	switch want := x.(type) {
	case nil:
		if !v.IsNone() || v.Kind() != KindNone {
			t.Fatalf("%v (%s) for None", v, v.TypeName())
		}
	case bool:
		if b, ok := v.Bool(); !ok || b != want || v.Kind() != KindBool {
			t.Fatalf("%v (%s) for %v", v, v.TypeName(), want)
		}
	case int64:
		if i, ok := d.Int(v); !ok || i != want || v.Kind() != KindInt {
			t.Fatalf("%d (%s) for %d", i, v.TypeName(), want)
		}
	case *big.Int:
		if b, ok := d.BigInt(v); !ok || b.Cmp(want) != 0 {
			t.Fatalf("%v for %v", b, want)
		}
		i, ok := d.Int(v)
		if wi, wok := AsInt64(want); ok != wok || i != wi {
			t.Fatalf("Int %d %v; AsInt64 %d %v", i, ok, wi, wok)
		}
	case float64:
		if f, ok := d.Float(v); !ok || f != want && !(f != f && want != want) {
			t.Fatalf("%v for %v", f, want)
		}
	case string:
		if s, ok := d.Str(v); !ok || s != want {
			t.Fatalf("%q for %q", s, want)
		}
		if len(want) <= internMaxLen && d.Key(want) != v {
			t.Fatalf("Key(%q) = %v, want the interned %v", want, d.Key(want), v)
		}
	case []byte:
		if b, ok := d.Bytes(v); !ok || string(b) != string(want) || v.Kind() != KindBytes {
			t.Fatalf("%q (%s) for bytes %q", b, v.TypeName(), want)
		}
	case ByteArray:
		if b, ok := d.Bytes(v); !ok || string(b) != string(want) || v.Kind() != KindByteArray {
			t.Fatalf("%q (%s) for bytearray %q", b, v.TypeName(), want)
		}
	case *List:
		elems := d.Elems(v)
		if v.Kind() != KindList || len(elems) != want.Len() || d.Len(v) != want.Len() || d.ID(v) != want.ID() {
			t.Fatalf("list of %d (ID %d) for %d (ID %d)", len(elems), d.ID(v), want.Len(), want.ID())
		}
		for i, e := range elems {
			checkDoc(t, d, e, want.At(i), depth+1)
		}
	case Tuple:
		elems := d.Elems(v)
		if v.Kind() != KindTuple || len(elems) != len(want) {
			t.Fatalf("%s of %d for a tuple of %d", v.TypeName(), len(elems), len(want))
		}
		for i, e := range elems {
			checkDoc(t, d, e, want[i], depth+1)
		}
	case *Dict:
		pairs := d.Pairs(v)
		if v.Kind() != KindDict || len(pairs) != 2*want.Len() || d.Len(v) != want.Len() || d.ID(v) != want.ID() {
			t.Fatalf("dict of %d for %d", len(pairs)/2, want.Len())
		}
		for i, it := range want.Items() {
			checkDoc(t, d, pairs[2*i], it.Key, depth+1)
			checkDoc(t, d, pairs[2*i+1], it.Value, depth+1)
			k, ok := it.Key.(string)
			if !ok {
				continue
			}
			if got, ok := d.Get(v, k); !ok || got != pairs[2*i+1] {
				t.Fatalf("Get(%q) = %v, %v; want %v", k, got, ok, pairs[2*i+1])
			}
			if len(k) <= internMaxLen {
				var out [2]Value
				if found := d.Pick(v, []Value{noValue, d.Key(k)}, out[:]); found != 2 || out[1] != pairs[2*i+1] {
					t.Fatalf("Pick(%q) = %b, %v", k, found, out[1])
				}
			}
		}
		if _, ok := d.Get(v, "\x00 not a key"); ok {
			t.Fatal("Get found a key the dict does not have")
		}
		// A Picker of every short str key, in reverse, and one the Doc lacks, finds what Pick finds.
		var keys []Value
		for i := len(pairs) - 2; i >= 0; i -= 2 {
			if pairs[i].tag() == tStr && len(d.str(pairs[i])) <= internMaxLen && len(keys) < 31 {
				keys = append(keys, pairs[i])
			}
		}
		keys = append(keys, noValue)
		byPick, byPicker := make([]Value, len(keys)), make([]Value, len(keys))
		p := d.Picker(keys...)
		for range 2 { // the second Pick of a shape uses its plan
			wf, gf := d.Pick(v, keys, byPick), p.Pick(v, byPicker)
			if wf != gf || !slices.Equal(byPick, byPicker) || gf != 1<<(len(keys)-1)-1 {
				t.Fatalf("Picker: %b %v; Pick: %b %v", gf, byPicker, wf, byPick)
			}
		}
	case *Set:
		kind := KindSet
		if want.Frozen {
			kind = KindFrozenSet
		}
		pairs := d.Pairs(v)
		if v.Kind() != kind || len(pairs) != 2*want.Len() {
			t.Fatalf("%s of %d for a set of %d", v.TypeName(), len(pairs)/2, want.Len())
		}
		i := 0
		for e := range want.All() {
			checkDoc(t, d, pairs[2*i], e, depth+1)
			i++
		}
	default:
		t.Fatalf("unexpected %T", x)
	}
}

// TestDocAgreesWithAny decodes every pickle of the test data and the real snapshots into a Doc and checks its
// accessors against the tree Any makes.
func TestDocAgreesWithAny(t *testing.T) {
	files, err := filepath.Glob("testdata/python/*.pickle")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test pickles: %v", err)
	}
	inputs := map[string][]byte{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inputs[f] = data
	}
	for _, f := range torchtest.Fixtures {
		if data := torchtest.OptionalFixture(t, f); data != nil {
			inputs[f] = data
		}
	}
	for name, data := range inputs {
		d, err := DecodeDoc(data)
		if err != nil {
			if _, err2 := Decode(data); err2 == nil || err.Error() != err2.Error() {
				t.Fatalf("%s: DecodeDoc: %v; Decode: %v", name, err, err2)
			}
			continue // a pickle the decoder refuses, as the other tests expect
		}
		checkDoc(t, d, d.Root(), d.Any(d.Root()), 0)
	}
}

// TestDocStrings checks that equal short strs are one Value whether or not the pickle shares them, that long
// ones are found by content, and that strings do not alias the input.
func TestDocStrings(t *testing.T) {
	long := strings.Repeat("k", 100)
	// {"ab": 1, "ab" (a second object): 2, long: 3}: the repeat replaces the first value, in its place.
	data := []byte("\x80\x04}(\x8c\x02abK\x01\x8c\x02abK\x02\x8c\x64" + long + "K\x03u.")
	d, err := DecodeDoc(data)
	if err != nil {
		t.Fatal(err)
	}
	m := d.Root()
	if d.Len(m) != 2 {
		t.Fatalf("%d entries; want 2", d.Len(m))
	}
	if v, ok := d.Get(m, "ab"); !ok || v != mk(tInt, 2) {
		t.Fatalf(`Get("ab") = %v, %v`, v, ok)
	}
	if v, ok := d.Get(m, long); !ok || v != mk(tInt, 3) {
		t.Fatalf("Get(long) = %v, %v", v, ok)
	}
	if d.Key(long) != noValue || d.Key("absent") != noValue {
		t.Fatal("Key found a long or absent str")
	}
	for i := range data {
		data[i] = 0
	}
	if s, _ := d.Str(d.Pairs(m)[0]); s != "ab" {
		t.Fatalf("str %q after the input was overwritten", s)
	}
}

// TestDocInts checks the three homes of an int: the Value itself up to 60 bits, the wide table up to 64, and
// big.Int beyond, with PyTorch's 2^64-1 read back as -1.
func TestDocInts(t *testing.T) {
	for _, tt := range []struct {
		long string // LONG1 payload, little-endian
		want int64
		ok   bool
	}{
		{"\x00", 0, true},
		{"\xff", -1, true},
		{"\xff\xff\xff\xff\xff\xff\xff\x07", 1<<59 - 1, true},
		{"\x00\x00\x00\x00\x00\x00\x00\x08", 1 << 59, true},
		{"\x00\x00\x00\x00\x00\x00\x00\xf8", -1 << 59, true},
		{"\xff\xff\xff\xff\xff\xff\xff\xf7", -1<<59 - 1, true},
		{"\x00\x00\x00\x00\x00\x00\x00\x80", -1 << 63, true},
		{"\xff\xff\xff\xff\xff\xff\xff\xff\x00", -1, true}, // 2^64-1
		{"\x00\x00\x00\x00\x00\x00\x00\x00\x01", 0, false}, // 2^64
	} {
		d, err := DecodeDoc([]byte("\x80\x02\x8a" + string(rune(len(tt.long))) + tt.long + "."))
		if err != nil {
			t.Fatal(err)
		}
		got, ok := d.Int(d.Root())
		if got != tt.want || ok != tt.ok || d.Root().Kind() != KindInt {
			t.Errorf("LONG1 %x: %d, %v; want %d, %v", tt.long, got, ok, tt.want, tt.ok)
		}
	}
}

// TestBuilder checks that a Builder applies a decode's rules: a repeated key keeps its place and takes the
// last value, an unhashable key and too deep a nesting fail with the decoder's sentinels.
func TestBuilder(t *testing.T) {
	b := Limits{MaxDepth: 3}.NewBuilder()
	k, _ := b.Str("size")
	k2, _ := b.Str("size") // another "size": the same key
	f := must(b.Float(1.5))
	m, err := b.Dict([]Value{k, must(b.Int(1)), mustStr(t, b, "name"), f, k2, must(b.Int(1 << 62))})
	if err != nil {
		t.Fatal(err)
	}
	l, err := b.List([]Value{m, b.None(), b.Bool(true), must(b.BigInt(new(big.Int).Lsh(big.NewInt(1), 70)))})
	if err != nil {
		t.Fatal(err)
	}
	d := b.Doc(l)
	got := d.Any(d.Root()).(*List)
	gm := got.At(0).(*Dict)
	if gm.Len() != 2 || gm.Items()[0].Key != "size" || gm.Items()[0].Value != int64(1<<62) {
		t.Fatalf("dict %v", gm.Items())
	}
	if x, _ := got.At(3).(*big.Int); x == nil || x.BitLen() != 71 || got.At(2) != true || got.At(1) != nil {
		t.Fatalf("list %v", got.Items())
	}

	b = Limits{MaxDepth: 3}.NewBuilder()
	inner, _ := b.List(nil)
	if _, err := b.Dict([]Value{inner, b.None()}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("list as a key: %v; want ErrMalformed", err)
	}
	v := b.None()
	for i := range 4 {
		if v, err = b.List([]Value{v}); (err != nil) != (i == 3) {
			t.Fatalf("list nested %d deep with MaxDepth 3: %v", i+1, err)
		}
	}
	if !errors.Is(err, ErrLimit) {
		t.Fatalf("4 levels with MaxDepth 3: %v; want ErrLimit", err)
	}
}

// mustStr is b.Str, failing the test on error.
func mustStr(t *testing.T, b *Builder, s string) Value {
	t.Helper()
	v, err := b.Str(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// must returns v, panicking on err: for Builder calls that cannot fail without a memory ceiling.
func must(v Value, err error) Value {
	if err != nil {
		panic(err)
	}
	return v
}
