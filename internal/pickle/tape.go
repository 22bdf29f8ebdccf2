package pickle

import (
	"math"
	"math/big"
	"unsafe"
)

// Doc is a decoded pickle in compact form: every value is a 64-bit Value, and the contents of strings and
// containers live in a few flat slices that hold no pointers. A snapshot decodes into millions of small dicts,
// lists and ints; as Go objects they would cost an allocation each and a garbage collector that scans them
// all, while here they cost a few appends to slices the collector never looks inside. Importers read a Doc
// through its methods; Any turns a value into the Go types of Decode when a tree is more convenient.
//
// A Doc is immutable once decoded and safe for concurrent reads. Strings and byte slices it returns share its
// storage: they stay valid as long as they are used, and keep the whole Doc's text alive, so copy the few that
// outlive it (strings.Clone).
type Doc struct {
	root Value

	chunks [][]Value // elements of lists, tuples and sets, values (and keys) of dicts, by container
	cur    int       // the chunk new containers start in
	shapes []shape   // the key sequences of dicts (shapes.go)
	conts  [][]cont  // every list, tuple, dict and set, numbered in creation order, in blocks of contBlock
	spans  []span    // str, bytes and bytearray payloads: where their bytes are in text
	text   []byte    // the bytes of every str, bytes and bytearray, copied from the input
	wides  []int64   // ints that do not fit a Value's 60-bit payload
	floats []float64
	bigs   []*big.Int

	intern    internTable // each distinct short str, once: equal short strs are equal Values
	index     map[uint32]map[any]int32
	indexKeys int   // entries of all the index maps
	size      int64 // bytes of input decoded, up to and including STOP
}

// Value is one value of a Doc: a tag in the top 4 bits, and either the value itself (None, bools, ints of up
// to 60 bits) or the index of its contents in the Doc. Two Values of one Doc are equal when they are the same
// container, or equal scalars; short strs (up to 48 bytes, every key a snapshot has) are interned, so equal
// short strs are equal Values too.
type Value uint64

// Kind is the Python type of a Value.
type Kind uint8

const (
	KindNone Kind = iota
	KindBool
	KindInt
	KindFloat
	KindStr
	KindBytes
	KindByteArray
	KindList
	KindTuple
	KindDict
	KindSet
	KindFrozenSet
)

// Tags, in a Value's top 4 bits.
const (
	tNone uint64 = iota
	tFalse
	tTrue
	tInt   // payload: the int, two's complement in 60 bits
	tWide  // payload: index in wides
	tBig   // payload: index in bigs
	tFloat // payload: index in floats
	tStr   // payload: index in spans
	tBytes
	tByteArray
	tList // payload: index in conts
	tTuple
	tDict
	tSet
	tFrozenSet

	tagShift = 60
	payload  = 1<<tagShift - 1
)

// noValue is a Value no decode produces (tag 15): a key that cannot match.
const noValue = Value(math.MaxUint64)

var kinds = [16]Kind{tNone: KindNone, tFalse: KindBool, tTrue: KindBool, tInt: KindInt, tWide: KindInt, tBig: KindInt,
	tFloat: KindFloat, tStr: KindStr, tBytes: KindBytes, tByteArray: KindByteArray, tList: KindList,
	tTuple: KindTuple, tDict: KindDict, tSet: KindSet, tFrozenSet: KindFrozenSet, 15: KindNone}

func mk(tag, p uint64) Value    { return Value(tag<<tagShift | p) }
func (v Value) tag() uint64     { return uint64(v) >> tagShift }
func (v Value) payload() uint64 { return uint64(v) & payload }

// Kind returns v's Python type.
func (v Value) Kind() Kind { return kinds[v.tag()] }

// IsNone reports whether v is None.
func (v Value) IsNone() bool { return v == 0 }

// Bool returns v if it is a bool.
func (v Value) Bool() (b, ok bool) {
	switch v.tag() {
	case tTrue:
		return true, true
	case tFalse:
		return false, true
	}
	return false, false
}

// cont is one container: its elements (for a dict, its key/value pairs) are n Values of a chunk, from an
// offset, both in off (see chunkShift). It takes 16 bytes: a snapshot has a container per 40 bytes of pickle.
// The decoder keeps its depth (decoder.meta).
type cont struct {
	off     uint32 // chunk<<chunkShift | offset in the chunk
	n       uint32 // Values used: elements, the values of a shaped dict, twice the entries of another or a set
	cap     uint32 // Values reserved at off: appends fit in place up to cap
	indexed bool   // dicts and sets: Doc.index holds a hash index of the keys
	shape   uint16 // dicts: the shape of their keys (shapes.go), or pairsForm
}

// entries returns the entries of a dict or set.
func (d *Doc) entries(c *cont) int {
	if c.shape != pairsForm {
		return int(c.n)
	}
	return int(c.n) / 2
}

// Container contents live in chunks of at most chunkMax Values that many containers share, so that a Doc
// grows by adding a chunk rather than by copying all it holds into a buffer twice the size, which would need
// three times the memory at that moment. A container too big for a chunk gets one of its own (a snapshot's
// list of trace entries). A container's offset takes 4 bytes: 12 bits of chunk number and 20 of offset in
// the chunk, 0 in a chunk of its own.
const (
	chunkShift = 20
	chunkMax   = 1 << chunkShift // 8 MiB of Values
	chunkMask  = chunkMax - 1
	maxChunks  = 1 << (32 - chunkShift)
)

// elems returns container c's Values.
func (d *Doc) elems(c *cont) []Value {
	ch := d.chunks[c.off>>chunkShift]
	o := c.off & chunkMask
	return ch[o : o+c.n : o+c.n]
}

// contBlock is the number of containers per block of Doc.conts. Blocks never move, so the memory a decode
// allocates for containers is what it holds plus at most one block, whatever the input.
const (
	contShift = 10
	contBlock = 1 << contShift
)

// cont returns container id.
func (d *Doc) cont(id uint64) *cont { return &d.conts[id>>contShift][id&(contBlock-1)] }

// span is where a str's, bytes' or bytearray's bytes are in Doc.text.
type span struct {
	off, n int
}

// Footprint returns the bytes the Doc holds: the capacity of its slices, and for its hash indexes and big
// ints an estimate (see Limits.MaxMemory, which counts the same way).
func (d *Doc) Footprint() int64 {
	n := 8*int64(len(d.intern.slots)) + 16*int64(cap(d.spans)) + int64(cap(d.text)) +
		8*int64(cap(d.wides)+cap(d.floats)+cap(d.bigs)) + int64(d.indexKeys)*mapEntryBytes
	for _, ch := range d.chunks {
		n += 8 * int64(cap(ch))
	}
	for _, b := range d.conts {
		n += contBytes * int64(cap(b))
	}
	for _, x := range d.bigs {
		n += bigBytes(x)
	}
	return n + shapeBytes*int64(cap(d.shapes))
}

// InputSize returns the bytes of pickle decoded into the Doc, up to and including its STOP opcode.
func (d *Doc) InputSize() int64 { return d.size }

// Root returns the pickle's top-level value.
func (d *Doc) Root() Value { return d.root }

// Int returns v if it is an int, through AsInt64's mapping: PyTorch's unsigned 2^64-1 comes back as -1. It
// reports false for any other type (a bool is not an int here) and for an int outside that range.
func (d *Doc) Int(v Value) (int64, bool) {
	switch v.tag() {
	case tInt:
		return int64(v<<(64-tagShift)) >> (64 - tagShift), true
	case tWide:
		return d.wides[v.payload()], true
	case tBig:
		return AsInt64(d.bigs[v.payload()])
	}
	return 0, false
}

// BigInt returns v as a *big.Int if it is an int of any size.
func (d *Doc) BigInt(v Value) (*big.Int, bool) {
	if v.tag() == tBig {
		return d.bigs[v.payload()], true
	}
	if i, ok := d.Int(v); ok {
		return big.NewInt(i), true
	}
	return nil, false
}

// Float returns v if it is a float.
func (d *Doc) Float(v Value) (float64, bool) {
	if v.tag() == tFloat {
		return d.floats[v.payload()], true
	}
	return 0, false
}

// Str returns v if it is a str. The string shares the Doc's storage.
func (d *Doc) Str(v Value) (string, bool) {
	if v.tag() != tStr {
		return "", false
	}
	return d.str(v), true
}

func (d *Doc) str(v Value) string {
	s := d.spans[v.payload()]
	if s.n == 0 {
		return ""
	}
	return unsafe.String(&d.text[s.off], s.n)
}

// Bytes returns v if it is a bytes or a bytearray. The slice shares the Doc's storage: do not modify it.
func (d *Doc) Bytes(v Value) ([]byte, bool) {
	if t := v.tag(); t != tBytes && t != tByteArray {
		return nil, false
	}
	s := d.spans[v.payload()]
	return d.text[s.off : s.off+s.n : s.off+s.n], true
}

// isCont reports whether a tag is a container's.
func isCont(t uint64) bool { return t >= tList && t <= tFrozenSet }

// Len returns the number of elements of a list, tuple, set or dict (its entries), and 0 for anything else.
func (d *Doc) Len(v Value) int {
	t := v.tag()
	if !isCont(t) {
		return 0
	}
	c := d.cont(v.payload())
	if t >= tDict {
		return d.entries(c)
	}
	return int(c.n)
}

// Elems returns the elements of a list or tuple, and nil for anything else. The slice is the Doc's storage: do
// not modify it.
func (d *Doc) Elems(v Value) []Value {
	if t := v.tag(); t != tList && t != tTuple {
		return nil
	}
	return d.elems(d.cont(v.payload()))
}

// Pairs returns the entries of a dict as keys and values alternating, in insertion order, and nil for anything
// else. A set's elements are its keys, with None values. The slice may be the Doc's storage: do not modify
// it. For the usual dict, whose keys are short strs, it is made on each call: Pick and Get read it in place.
func (d *Doc) Pairs(v Value) []Value {
	if t := v.tag(); t < tDict || t > tFrozenSet {
		return nil
	}
	c := d.cont(v.payload())
	if c.shape == pairsForm {
		return d.elems(c)
	}
	keys, vals := d.shapeKeys(c), d.elems(c)
	p := make([]Value, 2*len(vals))
	for j, v := range vals {
		p[2*j], p[2*j+1] = keys[j], v
	}
	return p
}

// ID numbers the containers (lists, tuples, dicts, sets) of one Doc densely from 0 in the order they were
// created, so a consumer interning shared ones (PyTorch's tracebacks and frames) can index a slice. It
// returns -1 for a value that is not a container.
func (d *Doc) ID(v Value) int {
	if !isCont(v.tag()) {
		return -1
	}
	return int(v.payload())
}

// Containers returns the number of containers, one more than the largest ID.
func (d *Doc) Containers() int {
	if len(d.conts) == 0 {
		return 0
	}
	return (len(d.conts)-1)*contBlock + len(d.conts[len(d.conts)-1])
}

// Key returns the Value of the short str s (at most 48 bytes) if the Doc holds it, or a Value that matches
// no key. Looking a key up once and passing its Value to Pick saves comparing strings per dict.
func (d *Doc) Key(s string) Value {
	if len(s) > internMaxLen {
		return noValue
	}
	if v, _ := d.intern.find(d, s); v != 0 {
		return v
	}
	return noValue
}

// Get returns the value stored in dict m under the str key.
func (d *Doc) Get(m Value, key string) (Value, bool) {
	if m.tag() != tDict {
		return 0, false
	}
	if len(key) <= internMaxLen {
		k, _ := d.intern.find(d, key)
		if k == 0 {
			return 0, false
		}
		return d.lookup(m, k)
	}
	c := d.cont(m.payload())
	if c.indexed {
		return d.indexed(m, key)
	}
	if c.shape != pairsForm {
		return 0, false // a shaped dict's keys are short
	}
	p := d.elems(c)
	for i := 0; i < len(p); i += 2 {
		if p[i].tag() == tStr && d.str(p[i]) == key {
			return p[i+1], true
		}
	}
	return 0, false
}

// lookup finds the interned str key k in dict m.
func (d *Doc) lookup(m Value, k Value) (Value, bool) {
	if k.tag() != tStr {
		return 0, false
	}
	c := d.cont(m.payload())
	if c.indexed {
		return d.indexed(m, d.str(k))
	}
	if c.shape != pairsForm {
		if j := d.keyAt(c.shape, k); j >= 0 {
			return d.elems(c)[j], true
		}
		return 0, false
	}
	p := d.elems(c)
	for i := 0; i < len(p); i += 2 {
		if p[i] == k {
			return p[i+1], true
		}
	}
	return 0, false
}

// indexed finds the str key in dict m through its hash index.
func (d *Doc) indexed(m Value, key string) (Value, bool) {
	if i, ok := d.index[uint32(m.payload())][key]; ok {
		return d.elems(d.cont(m.payload()))[2*i+1], true
	}
	return 0, false
}

// Pick looks up several keys of dict m in one pass: vals[i] gets the value under keys[i] (Values from Key),
// and bit i of the result says whether it was there. Snapshot dicts have a handful of keys, so one scan
// comparing each against the few wanted beats a lookup per key. It returns 0 if m is not a dict.
func (d *Doc) Pick(m Value, keys []Value, vals []Value) uint32 {
	if m.tag() != tDict {
		return 0
	}
	var found uint32
	c := d.cont(m.payload())
	if c.indexed {
		for i, k := range keys {
			if v, ok := d.lookup(m, k); ok {
				vals[i], found = v, found|1<<i
			}
		}
		return found
	}
	if c.shape != pairsForm {
		dv := d.elems(c)
		for s := c.shape; s > emptyShape; s = d.shapes[s].parent {
			sh := &d.shapes[s]
			for i, want := range keys {
				if sh.key == want {
					vals[i] = dv[sh.n-1]
					found |= 1 << i
					break
				}
			}
		}
		return found
	}
	p := d.elems(c)
	for j := 0; j < len(p); j += 2 {
		k := p[j]
		for i, want := range keys {
			if k == want {
				vals[i] = p[j+1]
				found |= 1 << i
				break
			}
		}
	}
	return found
}

// TypeName names v's Python type, for error messages.
func (v Value) TypeName() string {
	switch v.tag() {
	case tNone:
		return "NoneType"
	case tFalse, tTrue:
		return "bool"
	case tInt, tWide, tBig:
		return "int"
	case tFloat:
		return "float"
	case tStr:
		return "str"
	case tBytes:
		return "bytes"
	case tByteArray:
		return "bytearray"
	case tList:
		return "list"
	case tTuple:
		return "tuple"
	case tDict:
		return "dict"
	case tSet:
		return "set"
	case tFrozenSet:
		return "frozenset"
	}
	return "unknown"
}
