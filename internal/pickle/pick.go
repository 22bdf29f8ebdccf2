package pickle

// Picker looks up the same few keys in many dicts, as an importer reads a million trace entries: where a
// shape's dicts hold each key is worked out once per shape, so a Pick is a few loads. It is not safe for
// concurrent use; a Doc may have any number of Pickers.
type Picker struct {
	doc  *Doc
	keys []Value
	at   []int8   // by shape, for each key: its position in the shape's dicts, or -1
	plan []uint64 // by shape: bit i set when the shape holds keys[i]; planned once bit 63 is set
}

const planned = 1 << 63

// Picker returns a Picker of keys (Values from Key, at most 32), for a Doc that is complete.
func (d *Doc) Picker(keys ...Value) *Picker {
	if len(keys) > 32 {
		panic("pickle: a Picker of more than 32 keys")
	}
	n := len(d.shapes) // a complete Doc makes no more
	return &Picker{doc: d, keys: keys, at: make([]int8, n*len(keys)), plan: make([]uint64, n)}
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
	if p.plan[s] == 0 {
		p.makePlan(s)
	}
	dv := p.doc.elems(c)
	for i, j := range p.at[s*len(p.keys) : (s+1)*len(p.keys)] {
		if j >= 0 {
			vals[i] = dv[j]
		}
	}
	return uint32(p.plan[s])
}

// makePlan works out where shape s holds the keys.
func (p *Picker) makePlan(s int) {
	at := p.at[s*len(p.keys) : (s+1)*len(p.keys)]
	plan := uint64(planned)
	for i, k := range p.keys {
		j := p.doc.keyAt(uint16(s), k)
		at[i] = int8(j)
		if j >= 0 {
			plan |= 1 << i
		}
	}
	p.plan[s] = plan
}
