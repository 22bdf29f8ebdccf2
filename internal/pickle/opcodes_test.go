package pickle

import (
	"encoding/json"
	"errors"
	"io"
	"math"
	"math/big"
	"strings"
	"testing"
)

// decodeRender decodes a pickle and renders it as the JSON text the tables below expect.
func decodeRender(t *testing.T, data string) string {
	t.Helper()
	v, err := Decode([]byte(data))
	if err != nil {
		t.Fatalf("Decode(%q): %v", data, err)
	}
	b, err := json.Marshal(render(v, map[any]int{}))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestOpcodes decodes every supported opcode from hand-assembled pickles.
func TestOpcodes(t *testing.T) {
	tests := []struct {
		name, pickle, want string
	}{
		{"PROTO NONE STOP", "\x80\x02N.", `["none"]`},
		{"PROTO 5", "\x80\x05N.", `["none"]`},
		{"FRAME", "\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00N.", `["none"]`},
		{"NEWTRUE", "\x88.", `["bool",true]`},
		{"NEWFALSE", "\x89.", `["bool",false]`},
		{"INT", "I-42\n.", `["int","-42"]`},
		{"INT true", "I01\n.", `["bool",true]`},
		{"INT false", "I00\n.", `["bool",false]`},
		{"INT big", "I123456789012345678901234567890\n.", `["int","123456789012345678901234567890"]`},
		{"LONG", "L-123456789012345678901234567890L\n.", `["int","-123456789012345678901234567890"]`},
		{"LONG without suffix", "L7\n.", `["int","7"]`},
		{"FLOAT", "F-1.5\n.", `["float","bff8000000000000"]`},
		{"FLOAT inf", "Finf\n.", `["float","7ff0000000000000"]`},
		{"BININT", "J\xfe\xff\xff\xff.", `["int","-2"]`},
		{"BININT max", "J\xff\xff\xff\x7f.", `["int","2147483647"]`},
		{"BININT1", "K\xff.", `["int","255"]`},
		{"BININT2", "M\xff\xff.", `["int","65535"]`},
		{"LONG4", "\x8b\x02\x00\x00\x00\x00\x80.", `["int","-32768"]`},
		{"LONG4 big", "\x8b\x09\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\x00.", `["int","18446744073709551615"]`},
		{"BINFLOAT", "G\x3f\xf8\x00\x00\x00\x00\x00\x00.", `["float","3ff8000000000000"]`},
		{"SHORT_BINUNICODE", "\x8c\x03h\xc3\xbc.", `["str","hü"]`},
		{"BINUNICODE", "X\x03\x00\x00\x00abc.", `["str","abc"]`},
		{"BINUNICODE surrogate", "X\x03\x00\x00\x00\xed\xa0\x80.", `["strx","eda080"]`},
		{"BINUNICODE8", "\x8d\x01\x00\x00\x00\x00\x00\x00\x00z.", `["str","z"]`},
		{"SHORT_BINSTRING", "U\x02ab.", `["str","ab"]`},
		{"BINSTRING", "T\x02\x00\x00\x00ab.", `["str","ab"]`},
		{"SHORT_BINBYTES", "C\x02\x00\xff.", `["bytes","00ff"]`},
		{"BINBYTES", "B\x01\x00\x00\x00\x07.", `["bytes","07"]`},
		{"BINBYTES empty", "B\x00\x00\x00\x00.", `["bytes",""]`},
		{"BINBYTES8", "\x8e\x01\x00\x00\x00\x00\x00\x00\x00\x08.", `["bytes","08"]`},
		{"BYTEARRAY8", "\x96\x01\x00\x00\x00\x00\x00\x00\x00\x09.", `["bytearray","09"]`},
		{"EMPTY_DICT", "}.", `["dict",0,[]]`},
		{"DICT", "(K\x01K\x02K\x03K\x04d.", `["dict",0,[[["int","1"],["int","2"]],[["int","3"],["int","4"]]]]`},
		{"SETITEM", "}K\x01K\x02s.", `["dict",0,[[["int","1"],["int","2"]]]]`},
		{"SETITEMS", "}(\x8c\x01aK\x01\x8c\x01bK\x02u.", `["dict",0,[[["str","a"],["int","1"]],[["str","b"],["int","2"]]]]`},
		{"SETITEMS replaces in place", "}(K\x01K\x02K\x03K\x04K\x01K\x05u.", `["dict",0,[[["int","1"],["int","5"]],[["int","3"],["int","4"]]]]`},
		{"True is key 1", "}(K\x01K\x02\x88K\x03u.", `["dict",0,[[["int","1"],["int","3"]]]]`},
		{"1.0 is key 1", "}(K\x01K\x02G\x3f\xf0\x00\x00\x00\x00\x00\x00K\x03u.", `["dict",0,[[["int","1"],["int","3"]]]]`},
		{"bytes is not str", "}(\x8c\x01kK\x01C\x01kK\x02u.", `["dict",0,[[["str","k"],["int","1"]],[["bytes","6b"],["int","2"]]]]`},
		{"tuple key", "}(K\x00K\x00\x86K\x01K\x00K\x00\x86K\x02u.", `["dict",0,[[["tuple",[["int","0"],["int","0"]]],["int","2"]]]]`},
		{"EMPTY_LIST", "].", `["list",0,[]]`},
		{"LIST", "(K\x01K\x02l.", `["list",0,[["int","1"],["int","2"]]]`},
		{"APPEND", "]K\x01a.", `["list",0,[["int","1"]]]`},
		{"APPENDS", "](K\x01K\x02eK\x03a.", `["list",0,[["int","1"],["int","2"],["int","3"]]]`},
		{"APPENDS dicts then int", "](}}eK\x01a.", `["list",0,[["dict",1,[]],["dict",2,[]],["int","1"]]]`},
		{"EMPTY_TUPLE", ").", `["tuple",[]]`},
		{"TUPLE", "(K\x01K\x02K\x03K\x04t.", `["tuple",[["int","1"],["int","2"],["int","3"],["int","4"]]]`},
		{"TUPLE1", "K\x01\x85.", `["tuple",[["int","1"]]]`},
		{"TUPLE2", "K\x01K\x02\x86.", `["tuple",[["int","1"],["int","2"]]]`},
		{"TUPLE3", "K\x01K\x02K\x03\x87.", `["tuple",[["int","1"],["int","2"],["int","3"]]]`},
		{"EMPTY_SET ADDITEMS", "\x8f(K\x01K\x02K\x01\x90.", `["set",0,[["int","1"],["int","2"]]]`},
		{"FROZENSET", "(K\x02\x8c\x01a\x91.", `["frozenset",[["int","2"],["str","a"]]]`},
		{"MARK POP_MARK", "K\x07(K\x01K\x021.", `["int","7"]`},
		{"POP", "K\x07K\x080.", `["int","7"]`},
		{"POP drops an empty mark", "K\x07(0.", `["int","7"]`},
		{"DUP", "]2K\x01a0.", `["list",0,[["int","1"]]]`},
		{"MEMOIZE BINGET", "]\x940h\x00.", `["list",0,[]]`},
		{"BINPUT BINGET", "K\x05q\x070h\x07.", `["int","5"]`},
		{"LONG_BINPUT LONG_BINGET", "K\x05r\x00\x01\x00\x000j\x00\x01\x00\x00.", `["int","5"]`},
		{"PUT GET", "K\x05p12\n0g12\n.", `["int","5"]`},
		{"memo out of order", "K\x05q\x01K\x06q\x00K\x07\x94(h\x00h\x01h\x02t.", `["tuple",[["int","6"],["int","5"],["int","7"]]]`},
		{"MEMOIZE numbers by count", "K\x05q\x01K\x06\x94h\x01.", `["int","6"]`},
		{"bytes after STOP ignored", "K\x01.garbage", `["int","1"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := decodeRender(t, tt.pickle); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestLong1 pins LONG1 at every length from 0 to 9 bytes, at the int64 boundaries, and the unsigned
// 2^64-1 PyTorch writes for -1.
func TestLong1(t *testing.T) {
	tests := []struct {
		name    string
		bytes   string
		want    string // decimal value
		big     bool   // decodes to *big.Int rather than int64
		asInt64 int64  // what AsInt64 gives
		asOK    bool
	}{
		{"0 bytes", "", "0", false, 0, true},
		{"1 byte -1", "\xff", "-1", false, -1, true},
		{"1 byte 127", "\x7f", "127", false, 127, true},
		{"2 bytes -32768", "\x00\x80", "-32768", false, -32768, true},
		{"2 bytes 255", "\xff\x00", "255", false, 255, true},
		{"3 bytes", "\x00\x00\x80", "-8388608", false, -8388608, true},
		{"4 bytes", "\xff\xff\xff\x7f", "2147483647", false, 2147483647, true},
		{"5 bytes", "\x00\x00\x00\x00\x80", "-549755813888", false, -549755813888, true},
		{"6 bytes address", "\x00\x00\x00\x18\x7a\x73", "126968225857536", false, 126968225857536, true},
		{"7 bytes time_us", "\x8d\xae\xa6\x9b\xc7\x4c\x06", "1773270053858957", false, 1773270053858957, true},
		{"8 bytes max", "\xff\xff\xff\xff\xff\xff\xff\x7f", "9223372036854775807", false, math.MaxInt64, true},
		{"8 bytes min", "\x00\x00\x00\x00\x00\x00\x00\x80", "-9223372036854775808", false, math.MinInt64, true},
		{"9 bytes 2^64-1", "\xff\xff\xff\xff\xff\xff\xff\xff\x00", "18446744073709551615", true, -1, true},
		{"9 bytes 2^63", "\x00\x00\x00\x00\x00\x00\x00\x80\x00", "9223372036854775808", true, math.MinInt64, true},
		{"9 bytes 2^64", "\x00\x00\x00\x00\x00\x00\x00\x00\x01", "18446744073709551616", true, 0, false},
		{"9 bytes -1 padded", "\xff\xff\xff\xff\xff\xff\xff\xff\xff", "-1", false, -1, true},
		{"9 bytes min padded", "\x00\x00\x00\x00\x00\x00\x00\x80\xff", "-9223372036854775808", false, math.MinInt64, true},
		{"9 bytes -2^63-1", "\xff\xff\xff\xff\xff\xff\xff\x7f\xff", "-9223372036854775809", true, 0, false},
		{"9 bytes -2^64", "\x00\x00\x00\x00\x00\x00\x00\x00\xff", "-18446744073709551616", true, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Decode([]byte("\x8a" + string(rune(len(tt.bytes))) + tt.bytes + "."))
			if err != nil {
				t.Fatal(err)
			}
			switch x := v.(type) {
			case int64:
				if tt.big || big.NewInt(x).String() != tt.want {
					t.Errorf("got int64 %d; want %s (big %v)", x, tt.want, tt.big)
				}
			case *big.Int:
				if !tt.big || x.String() != tt.want {
					t.Errorf("got *big.Int %s; want %s (big %v)", x, tt.want, tt.big)
				}
			default:
				t.Fatalf("got %T", v)
			}
			if got, ok := AsInt64(v); got != tt.asInt64 || ok != tt.asOK {
				t.Errorf("AsInt64 = %d, %v; want %d, %v", got, ok, tt.asInt64, tt.asOK)
			}
		})
	}
}

// TestMemoSharing checks that every memo read of one slot yields the same object.
func TestMemoSharing(t *testing.T) {
	t.Run("lists", func(t *testing.T) {
		v, err := Decode([]byte("\x80\x04](]\x94h\x00h\x00e."))
		if err != nil {
			t.Fatal(err)
		}
		l := v.(*List)
		if l.Len() != 3 || l.At(0) != l.At(1) || l.At(1) != l.At(2) {
			t.Fatalf("elements not one list: %v %v %v", l.At(0), l.At(1), l.At(2))
		}
		if inner := l.At(0).(*List); l.ID() != 0 || inner.ID() != 1 || l.OnlyDicts() {
			t.Fatalf("IDs %d, %d; want 0 and 1 in creation order", l.ID(), inner.ID())
		}
	})
	t.Run("dicts", func(t *testing.T) {
		v, err := Decode([]byte("\x80\x04](}\x94h\x00}e."))
		if err != nil {
			t.Fatal(err)
		}
		l := v.(*List)
		a, _ := l.DictAt(0)
		b, _ := l.DictAt(1)
		c, _ := l.DictAt(2)
		if !l.OnlyDicts() || a != b || a == c || a.ID() != b.ID() || a.ID() == c.ID() {
			t.Fatalf("got %p %p %p (IDs %d %d %d); want the first two the same and the third apart",
				a, b, c, a.ID(), b.ID(), c.ID())
		}
	})
	t.Run("python snapshot frames", func(t *testing.T) {
		// snapshot_like shares one traceback list between a segment, its block and two trace entries.
		for _, p := range []string{"2", "3", "4", "5"} {
			v := decodeFile(t, "testdata/python/snapshot_like.p"+p+".pickle")
			top := v.(*Dict)
			segs, _ := top.GetList("segments")
			seg, _ := segs.DictAt(0)
			blocks, _ := seg.GetList("blocks")
			block, _ := blocks.DictAt(0)
			traces, _ := top.GetList("device_traces")
			dev0, _ := traces.At(0).(*List)
			e0, _ := dev0.DictAt(0)
			e1, _ := dev0.DictAt(1)
			f := []any{mustGet(t, seg, "frames"), mustGet(t, block, "frames"), mustGet(t, e0, "frames"), mustGet(t, e1, "frames")}
			for i := range f {
				if f[i] != f[0] {
					t.Fatalf("protocol %s: frames %d is not the shared list", p, i)
				}
			}
			if n, ok := mustGet(t, top, "allocator_settings").(*Dict).GetInt("max_split_size"); !ok || n != -1 {
				t.Fatalf("protocol %s: max_split_size = %d, %v; want -1 (2^64-1 mapped back)", p, n, ok)
			}
		}
	})
}

func mustGet(t *testing.T, d *Dict, key string) any {
	t.Helper()
	v, ok := d.Get(key)
	if !ok {
		t.Fatalf("no key %q", key)
	}
	return v
}

// TestMalformed feeds pickles Python would refuse to load and checks each fails with the right cause, at the
// right opcode and offset.
func TestMalformed(t *testing.T) {
	tests := []struct {
		name, pickle string
		cause        error
		op           string
		offset       int64
		msg          string
	}{
		{"empty", "", io.ErrUnexpectedEOF, "", 0, "no STOP"},
		{"no STOP", "\x80\x02N", io.ErrUnexpectedEOF, "", 3, "no STOP"},
		{"STOP on empty stack", ".", ErrMalformed, "STOP", 0, "underflow"},
		{"APPEND without list", "K\x01a.", ErrMalformed, "APPEND", 2, "underflow"},
		{"APPEND to int", "K\x01K\x02a.", ErrMalformed, "APPEND", 4, "APPEND to a int"},
		{"APPENDS without mark", "]K\x01e.", ErrMalformed, "APPENDS", 3, "no MARK"},
		{"APPENDS to dict", "}(K\x01e.", ErrMalformed, "APPENDS", 4, "APPENDS to a dict"},
		{"SETITEMS odd", "}(K\x01u.", ErrMalformed, "SETITEMS", 4, "odd number"},
		{"SETITEM on list", "]K\x01K\x02s.", ErrMalformed, "SETITEM", 5, "SETITEM on a list"},
		{"unhashable key", "}]K\x01s.", ErrMalformed, "SETITEM", 4, "unhashable"},
		{"unhashable set element", "\x8f(]\x90.", ErrMalformed, "ADDITEMS", 3, "unhashable"},
		{"ADDITEMS to frozenset", "(\x91(K\x01\x90.", ErrMalformed, "ADDITEMS", 5, "ADDITEMS to a frozenset"},
		{"TUPLE2 across mark", "K\x01(K\x02\x86.", ErrMalformed, "TUPLE2", 5, "underflow"},
		{"MEMOIZE on empty", "\x94.", ErrMalformed, "MEMOIZE", 0, "underflow"},
		{"BINGET missing", "h\x03.", ErrMalformed, "BINGET", 0, "never stored"},
		{"LONG_BINGET missing", "j\x00\x00\x01\x00.", ErrMalformed, "LONG_BINGET", 0, "never stored"},
		{"GET not a number", "gx\n.", ErrMalformed, "GET", 0, "memo index"},
		{"INT not a number", "I1x\n.", ErrMalformed, "INT", 0, "integer"},
		{"INT leading zero", "I010\n.", ErrMalformed, "INT", 0, "leading zero"},
		{"INT empty", "I\n.", ErrMalformed, "INT", 0, "integer"},
		{"FLOAT not a number", "Fx\n.", ErrMalformed, "FLOAT", 0, "FLOAT"},
		{"LONG4 negative", "\x8b\xff\xff\xff\xff.", ErrMalformed, "LONG4", 0, "negative"},
		{"BINSTRING negative", "T\xff\xff\xff\xff.", ErrMalformed, "BINSTRING", 0, "negative"},
		{"BINSTRING not ASCII", "U\x01\xe9.", ErrMalformed, "SHORT_BINSTRING", 0, "not ASCII"},
		{"invalid UTF-8", "X\x02\x00\x00\x00\xff\xfe.", ErrMalformed, "BINUNICODE", 0, "UTF-8"},
		{"short invalid UTF-8", "\x8c\x01\x80.", ErrMalformed, "SHORT_BINUNICODE", 0, "UTF-8"},
		{"unknown opcode", "\x80\x02\xff.", ErrMalformed, "0xff", 2, "unknown opcode"},
		{"protocol 6", "\x80\x06N.", ErrUnsupported, "PROTO", 0, "protocol 6"},
		{"STRING", "S'a'\n.", ErrUnsupported, "STRING", 0, "protocol 0"},
		{"UNICODE", "Va\n.", ErrUnsupported, "UNICODE", 0, "protocol 0"},
		{"append to self", "]q\x00h\x00a.", ErrMalformed, "APPEND", 5, "self-referencing"},
		{"append DUP to self", "]2a.", ErrMalformed, "APPEND", 2, "self-referencing"},
		{"setitem self", "}q\x00K\x01h\x00s.", ErrMalformed, "SETITEM", 7, "self-referencing"},
		{"changed after shared", "]q\x00]h\x00ah\x00K\x01a.", ErrMalformed, "APPEND", 11, "self-referencing"},
		{"dict changed after shared", "}q\x00]h\x00ah\x00K\x01K\x01s.", ErrMalformed, "SETITEM", 13, "self-referencing"},
		{"truncated BININT", "J\x01\x02", io.ErrUnexpectedEOF, "BININT", 0, "truncated"},
		{"truncated SHORT_BINUNICODE", "\x8c\x05ab", io.ErrUnexpectedEOF, "SHORT_BINUNICODE", 0, "truncated"},
		{"truncated FRAME", "\x95\x10\x00\x00\x00\x00\x00\x00\x00N.", io.ErrUnexpectedEOF, "FRAME", 0, "frame of 16 bytes"},
		{"truncated text", "I12", io.ErrUnexpectedEOF, "INT", 0, "no newline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Decode([]byte(tt.pickle))
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("got %v, %v; want a *DecodeError", v, err)
			}
			if !errors.Is(err, tt.cause) || de.Op != tt.op || de.Offset != tt.offset || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got %v (op %q, offset %d); want cause %v, op %q, offset %d, message with %q",
					err, de.Op, de.Offset, tt.cause, tt.op, tt.offset, tt.msg)
			}
		})
	}
}

// TestRefused checks that every opcode that would run code or needs out-of-band data is refused by name and
// offset, before anything it names is looked at.
func TestRefused(t *testing.T) {
	ops := map[string]byte{
		"GLOBAL": opGlobal, "STACK_GLOBAL": opStackGlobal, "REDUCE": opReduce, "BUILD": opBuild,
		"INST": opInst, "OBJ": opObj, "NEWOBJ": opNewObj, "NEWOBJ_EX": opNewObjEx, "PERSID": opPersID,
		"BINPERSID": opBinPersID, "EXT1": opExt1, "EXT2": opExt2, "EXT4": opExt4,
		"NEXT_BUFFER": opNextBuffer, "READONLY_BUFFER": opReadonlyBuffer,
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			data := []byte{opProto, 5, opNone, op, 'x', '\n', 'y', '\n', opStop}
			_, err := Decode(data)
			var de *DecodeError
			if !errors.As(err, &de) || !errors.Is(err, ErrRefused) || de.Op != name || de.Offset != 3 {
				t.Fatalf("got %v; want %s refused at offset 3", err, name)
			}
			want := "would run code; snapshots never contain it"
			if op == opNextBuffer || op == opReadonlyBuffer {
				want = "needs out-of-band buffers"
			}
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("message %q lacks %q", err, want)
			}
		})
	}
	t.Run("message", func(t *testing.T) {
		_, err := Decode([]byte("\x80\x02cos\nsystem\n."))
		want := "pickle: opcode GLOBAL at offset 2: would run code; snapshots never contain it"
		if err == nil || err.Error() != want {
			t.Fatalf("got %v; want %q", err, want)
		}
	})
}

// TestDictLookup pins Dict lookups on small (scanned) and large (indexed) dicts, and with non-string keys.
func TestDictLookup(t *testing.T) {
	var b strings.Builder
	b.WriteString("\x80\x04}(")
	for i := range 40 {
		k := string(rune('a'+i%26)) + string(rune('0'+i/26))
		b.WriteString("\x8c\x02" + k + "K" + string(rune(i)))
	}
	b.WriteString("\x8c\x02a0K\x63") // a repeated key replaces, keeping the position
	b.WriteString("K\x01K\x64")      // the int key 1
	b.WriteString("K\x00K\x00\x86K\x65u.")
	v, err := Decode([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	d := v.(*Dict)
	tests := []struct {
		key  any
		want int64
		ok   bool
	}{
		{"a0", 99, true}, {"b0", 1, true}, {"n1", 39, true}, {"zz", 0, false},
		{int64(1), 100, true}, {true, 100, true}, {1.0, 100, true}, {"1", 0, false},
		{Tuple{int64(0), int64(0)}, 101, true}, {Tuple{int64(0)}, 0, false}, {&List{}, 0, false},
	}
	for _, tt := range tests {
		got, ok := d.Lookup(tt.key)
		n, _ := AsInt64(got)
		if ok != tt.ok || n != tt.want {
			t.Errorf("Lookup(%#v) = %v, %v; want %d, %v", tt.key, got, ok, tt.want, tt.ok)
		}
	}
	if d.Len() != 42 {
		t.Errorf("Len = %d; want 42", d.Len())
	}
	if k := d.Items()[0].Key; k != "a0" {
		t.Errorf("first key %v; want a0 (replacing keeps the position)", k)
	}
	if s, ok := d.GetString("a0"); ok {
		t.Errorf("GetString on an int = %q, true", s)
	}
}
