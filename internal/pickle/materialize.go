package pickle

import "strings"

// Any returns v as the Go values of Decode (see the package documentation): a container shared in the pickle
// becomes one *List, *Dict, *Set or Tuple however often it appears. It copies: the result does not share the
// Doc's storage.
func (d *Doc) Any(v Value) any {
	m := materializer{doc: d}
	return m.value(v)
}

// materializer turns Values into Go values, remembering each container it made so that shared ones stay
// shared (and a tuple key hashed twice is one Tuple, which keyHasher remembers).
type materializer struct {
	doc  *Doc
	made []any // by container number
}

func (m *materializer) value(v Value) any {
	d := m.doc
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
		return strings.Clone(d.str(v)) // not a view of the Doc's text
	case tBytes:
		b, _ := d.Bytes(v)
		return append([]byte{}, b...)
	case tByteArray:
		b, _ := d.Bytes(v)
		return ByteArray(append([]byte{}, b...))
	}
	id := v.payload()
	if id < uint64(len(m.made)) && m.made[id] != nil {
		return m.made[id]
	}
	if id >= uint64(len(m.made)) {
		m.made = growN(m.made, int(id)+1-len(m.made))
		m.made = m.made[:cap(m.made)]
	}
	c := *d.cont(id)
	elems := d.pool[c.off : c.off+c.n]
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
		x.fillFrom(m, elems)
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
