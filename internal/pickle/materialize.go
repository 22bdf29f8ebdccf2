package pickle

import (
	"math"
	"strings"
)

// Any returns v as the Go values of Decode (see the package documentation): a container shared in the pickle
// becomes one *List, *Dict, *Set or Tuple however often it appears. It copies: the result does not share the
// Doc's storage.
func (d *Doc) Any(v Value) any {
	m := materializer{doc: d, mem: &meter{max: math.MaxInt64}}
	return m.value(v)
}

// materializer turns Values into Go values, remembering each container it made so that shared ones stay
// shared (and a tuple key hashed twice is one Tuple, which keyHasher remembers).
type materializer struct {
	doc  *Doc
	made []any  // by container number
	mem  *meter // counts what it makes; past the ceiling it stops with err
	err  error
}

// Bytes counted for each Go value made: an interface's 16, and the object behind it.
const (
	goValueBytes = 16
	goContBytes  = 64 // a List, Dict or Set struct
)

// count counts n bytes, and reports whether the ceiling allows them.
func (m *materializer) count(n int64) bool {
	if m.err == nil {
		m.err = m.mem.add(n)
	}
	return m.err == nil
}

func (m *materializer) value(v Value) any {
	d := m.doc
	if m.err != nil {
		return nil
	}
	switch t := v.tag(); t {
	case tNone:
		return nil
	case tFalse:
		return false
	case tTrue:
		return true
	case tInt, tWide:
		i, _ := d.Int(v)
		return i
	case tBig:
		return d.bigs[v.payload()]
	case tFloat:
		return d.floats[v.payload()]
	case tStr:
		if !m.count(goValueBytes + int64(d.spans[v.payload()].n)) {
			return nil
		}
		return strings.Clone(d.str(v)) // not a view of the Doc's text
	case tBytes, tByteArray:
		b, _ := d.Bytes(v)
		if !m.count(goValueBytes + 24 + int64(len(b))) {
			return nil
		}
		if t == tByteArray {
			return ByteArray(append([]byte{}, b...))
		}
		return append([]byte{}, b...)
	}
	id := v.payload()
	if id < uint64(len(m.made)) && m.made[id] != nil {
		return m.made[id]
	}
	if id >= uint64(len(m.made)) {
		var err error
		if m.made, err = growSlice(m.mem, m.made, int(id)+1-len(m.made), goValueBytes); err != nil {
			m.err = err
			return nil
		}
		m.made = m.made[:cap(m.made)]
	}
	c := *d.cont(id)
	elems := d.elems(&c)
	if !m.count(goContBytes + goValueBytes*int64(len(elems))) {
		return nil
	}
	switch v.tag() {
	case tList:
		l := &List{items: make([]any, len(elems)), id: uint32(id), onlyDicts: true}
		m.made[id] = l
		for i, e := range elems {
			l.items[i] = m.value(e)
			l.onlyDicts = l.onlyDicts && e.tag() == tDict
		}
		return l
	case tTuple:
		t := make(Tuple, len(elems))
		m.made[id] = t
		for i, e := range elems {
			t[i] = m.value(e)
		}
		return t
	case tDict:
		x := &Dict{id: uint32(id)}
		m.made[id] = x
		x.fillFrom(m, d.Pairs(v))
		return x
	default: // tSet, tFrozenSet
		s := &Set{Frozen: v.tag() == tFrozenSet}
		m.made[id] = s
		s.d.fillFrom(m, elems)
		return s
	}
}

// fillFrom stores the key/value pairs of a decoded dict, whose keys are distinct.
func (x *Dict) fillFrom(m *materializer, pairs []Value) {
	x.items = make([]Item, 0, len(pairs)/2)
	h := keyHasher{budget: 1 << 62} // the decode already charged for these keys
	for i := 0; i < len(pairs); i += 2 {
		if err := x.set(m.value(pairs[i]), m.value(pairs[i+1]), &h); err != nil {
			panic("pickle: a decoded dict key does not hash: " + err.Error())
		}
	}
}
