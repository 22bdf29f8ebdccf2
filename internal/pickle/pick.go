package pickle

// Picker looks up the same few keys in many dicts, as an importer reads a million trace entries: where a
// shape's dicts hold each key is worked out once per shape, so a Pick is a few loads. It is not safe for
// concurrent use; a Doc may have any number of Pickers.
type Picker struct {
	doc     *Doc
	keys    []Value
	at      []int8   // by shape, for each key: its position in the shape's dicts, or -1
	found   []uint32 // by shape: bit i set when the shape holds keys[i]
	planned []bool   // by shape
}

// Picker returns a Picker of keys (Values from Key, at most 32).
func (d *Doc) Picker(keys ...Value) *Picker {
	if len(keys) > 32 {
		panic("pickle: a Picker of more than 32 keys")
	}
	return &Picker{doc: d, keys: keys}
}

// Pick is Doc.Pick for the Picker's keys: vals[i] gets the value under key i, and bit i of the result says
// whether it was there.
func (p *Picker) Pick(m Value, vals []Value) uint32 {
	if m.tag() != tDict {
		return 0
	}
	c := p.doc.cont(m.payload())
	if c.shape == pairsForm {
		return p.doc.Pick(m, p.keys, vals)
	}
	s := int(c.shape)
	if s >= len(p.planned) || !p.planned[s] {
		p.plan(s)
	}
	dv := p.doc.elems(c)
	for i, j := range p.at[s*len(p.keys) : (s+1)*len(p.keys)] {
		if j >= 0 {
			vals[i] = dv[j]
		}
	}
	return p.found[s]
}

// plan works out where shape s holds the keys.
func (p *Picker) plan(s int) {
	if s >= len(p.planned) {
		n := max(s+1, 2*len(p.planned), 8)
		p.planned = append(p.planned, make([]bool, n-len(p.planned))...)
		p.found = append(p.found, make([]uint32, n-len(p.found))...)
		p.at = append(p.at, make([]int8, n*len(p.keys)-len(p.at))...)
	}
	at := p.at[s*len(p.keys) : (s+1)*len(p.keys)]
	var found uint32
	for i, k := range p.keys {
		j := p.doc.keyAt(uint16(s), k)
		at[i] = int8(j)
		if j >= 0 {
			found |= 1 << i
		}
	}
	p.found[s], p.planned[s] = found, true
}
