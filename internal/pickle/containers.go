package pickle

// Memo opcodes and the opcodes that build or fill containers.

func (d *decoder) get(i uint64) error {
	v, err := d.memo.get(i)
	if err != nil {
		return err
	}
	return d.push(v)
}

func (d *decoder) put(i uint64) error {
	v, err := d.top()
	if err != nil {
		return err
	}
	return d.memo.put(i, v)
}

// adopt records that v is being placed inside parent, whose nesting depth is *depth. A list, dict or set is
// sealed against later changes (which is what keeps results acyclic), and *depth grows to cover v's depth.
func (d *decoder) adopt(parent any, depth *uint16, v any) error {
	var h uint16
	switch c := v.(type) {
	case *List:
		if any(c) == parent {
			return errCycle
		}
		c.shared = true
		h = c.depth
	case *Dict:
		if any(c) == parent {
			return errCycle
		}
		c.shared = true
		h = c.depth
	case *Set:
		if any(c) == parent {
			return errCycle
		}
		c.d.shared = true
		h = c.d.depth
	case Tuple:
		h = d.tupleDepth(c)
	default:
		return nil // scalars have depth 0
	}
	if h >= *depth {
		if int(h) >= d.lim.MaxDepth {
			return overLimit("nesting depth", int64(h)+1, "MaxDepth", int64(d.lim.MaxDepth))
		}
		*depth = h + 1
	}
	return nil
}

// tupleDepth returns a tuple's nesting depth. A slice has no room for it, so tuples that hold containers have
// it recorded at creation; every other tuple has depth 1.
func (d *decoder) tupleDepth(t Tuple) uint16 {
	if len(t) == 0 {
		return 1
	}
	if h, ok := d.tupleDepths[&t[0]]; ok {
		return h
	}
	return 1
}

// newTuple builds a tuple from items, which it copies.
func (d *decoder) newTuple(items []any) error {
	if len(items) == 0 {
		return d.pushNew(emptyTuple)
	}
	if len(items) > d.lim.MaxItems {
		return overLimit("tuple items", int64(len(items)), "MaxItems", int64(d.lim.MaxItems))
	}
	t := make(Tuple, len(items))
	copy(t, items)
	depth := uint16(1)
	for _, v := range t {
		if err := d.adopt(nil, &depth, v); err != nil {
			return err
		}
	}
	if depth > 1 {
		if d.tupleDepths == nil {
			d.tupleDepths = make(map[*any]uint16)
		}
		d.tupleDepths[&t[0]] = depth
	}
	return d.pushNew(t)
}

// smallTuple is TUPLE1, TUPLE2 and TUPLE3: the top n values, above the fence.
func (d *decoder) smallTuple(n int) error {
	if len(d.stack)-d.fence < n {
		return errUnderflow
	}
	k := len(d.stack) - n
	items := d.stack[k:]
	d.stack = d.stack[:k]
	return d.newTuple(items)
}

// fromMark is DICT, LIST, TUPLE and FROZENSET: a new container of the values above the newest mark.
func (d *decoder) fromMark(op byte) error {
	items, err := d.popMark()
	if err != nil {
		return err
	}
	switch op {
	case opTuple:
		return d.newTuple(items)
	case opList:
		l := d.ar.newList()
		if err := d.extend(l, items); err != nil {
			return err
		}
		return d.pushNew(l)
	case opDict:
		m := d.ar.newDict()
		if err := d.fill(m, items); err != nil {
			return err
		}
		return d.pushNew(m)
	default: // opFrozenSet
		s := &Set{Frozen: true, d: Dict{depth: 1}}
		if err := d.addTo(s, items); err != nil {
			return err
		}
		return d.pushNew(s)
	}
}

// containerBelow returns the value just under the values a mark-ending opcode took: the container it fills.
func (d *decoder) containerBelow() (any, error) {
	if len(d.stack) <= d.fence {
		return nil, errUnderflow
	}
	return d.stack[len(d.stack)-1], nil
}

func (d *decoder) appends() error {
	items, err := d.popMark()
	if err != nil {
		return err
	}
	c, err := d.containerBelow()
	if err != nil {
		return err
	}
	l, ok := c.(*List)
	if !ok {
		return malformed("APPENDS to a %s", typeName(c))
	}
	return d.extend(l, items)
}

func (d *decoder) appendOne() error {
	if len(d.stack)-d.fence < 2 {
		return errUnderflow
	}
	n := len(d.stack)
	l, ok := d.stack[n-2].(*List)
	if !ok {
		return malformed("APPEND to a %s", typeName(d.stack[n-2]))
	}
	if err := d.extend(l, d.stack[n-1:]); err != nil {
		return err
	}
	d.stack = d.stack[:n-1]
	return nil
}

// extend appends items to l, checking the list may still change and stays within the limits.
func (d *decoder) extend(l *List, items []any) error {
	if l.shared {
		return errCycle
	}
	if l.Len()+len(items) > d.lim.MaxItems {
		return overLimit("list items", int64(l.Len()+len(items)), "MaxItems", int64(d.lim.MaxItems))
	}
	if l.items == nil && d.extendDicts(l, items) {
		return nil
	}
	for _, v := range items {
		if err := d.adopt(l, &l.depth, v); err != nil {
			return err
		}
	}
	if l.items == nil {
		// The first element that is not a dict: move to the general form.
		all := make([]any, 0, len(l.ids)+len(items))
		for _, id := range l.ids {
			all = append(all, d.ar.dict(id))
		}
		l.items, l.ids = all, nil
	}
	l.items = append(l.items, items...)
	return nil
}

// extendDicts is extend's fast path for the common case: a list of dicts receiving more dicts. It reports
// false, having changed nothing visible, when items do not fit that case or would break a limit (which the
// general path then reports).
func (d *decoder) extendDicts(l *List, items []any) bool {
	var depth uint16
	for _, v := range items {
		m, ok := v.(*Dict)
		if !ok || int(m.depth) >= d.lim.MaxDepth {
			return false
		}
		depth = max(depth, m.depth)
	}
	ids := l.ids
	if ids == nil {
		ids = d.ar.idSlice(len(items))
	}
	for _, v := range items {
		m := v.(*Dict)
		if !m.shared { // only write when needed: most elements are shared frames, already sealed
			m.shared = true
		}
		ids = append(ids, m.id)
	}
	l.ids = ids
	l.depth = max(l.depth, depth+1)
	return true
}

func (d *decoder) setItems() error {
	items, err := d.popMark()
	if err != nil {
		return err
	}
	c, err := d.containerBelow()
	if err != nil {
		return err
	}
	m, ok := c.(*Dict)
	if !ok {
		return malformed("SETITEMS on a %s", typeName(c))
	}
	return d.fill(m, items)
}

func (d *decoder) setItem() error {
	if len(d.stack)-d.fence < 3 {
		return errUnderflow
	}
	n := len(d.stack)
	m, ok := d.stack[n-3].(*Dict)
	if !ok {
		return malformed("SETITEM on a %s", typeName(d.stack[n-3]))
	}
	if err := d.fill(m, d.stack[n-2:]); err != nil {
		return err
	}
	d.stack = d.stack[:n-2]
	return nil
}

// fill stores the key/value pairs in items into m.
func (d *decoder) fill(m *Dict, items []any) error {
	if len(items)%2 != 0 {
		return malformed("odd number of items (%d) for a dict", len(items))
	}
	if m.shared {
		return errCycle
	}
	if len(m.items)+len(items)/2 > d.lim.MaxItems {
		return overLimit("dict entries", int64(len(m.items)+len(items)/2), "MaxItems", int64(d.lim.MaxItems))
	}
	if m.items == nil {
		m.items = d.ar.itemSlice(len(items) / 2)
	}
	for i := 0; i < len(items); i += 2 {
		k, v := items[i], items[i+1]
		if _, ok := k.(string); !ok { // a str key, the usual case, has nothing to adopt
			if err := d.adopt(m, &m.depth, k); err != nil {
				return err
			}
		}
		if err := d.adopt(m, &m.depth, v); err != nil {
			return err
		}
		if err := m.set(k, v, &d.keys); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) addItems() error {
	items, err := d.popMark()
	if err != nil {
		return err
	}
	c, err := d.containerBelow()
	if err != nil {
		return err
	}
	s, ok := c.(*Set)
	if !ok || s.Frozen {
		return malformed("ADDITEMS to a %s", typeName(c))
	}
	return d.addTo(s, items)
}

// addTo adds items to the set s.
func (d *decoder) addTo(s *Set, items []any) error {
	if s.d.shared {
		return errCycle
	}
	if s.Len()+len(items) > d.lim.MaxItems {
		return overLimit("set items", int64(s.Len()+len(items)), "MaxItems", int64(d.lim.MaxItems))
	}
	for _, v := range items {
		if err := d.adopt(s, &s.d.depth, v); err != nil {
			return err
		}
		if err := s.d.set(v, nil, &d.keys); err != nil {
			return err
		}
	}
	return nil
}
