package pickle

import "fmt"

// The opcodes that build or fill containers. A container's elements live in a chunk of Doc.chunks (see
// reserve).

// newCont creates an empty container with the given tag.
// Its contents have no place until the first reserve finds them one (place).
func (d *decoder) newCont(tag uint64) (Value, error) {
	if len(d.meta) == cap(d.meta) {
		var err error
		if d.meta, err = growSlice(&d.mem, d.meta, 1, 2); err != nil {
			return 0, err
		}
	}
	var c cont
	if tag == tDict {
		c.shape = emptyShape
	}
	id, err := d.addCont(c)
	if err != nil {
		return 0, err
	}
	d.meta = append(d.meta, 1) // depth 1, not shared
	return mk(tag, id), nil
}

// addCont adds a container and returns its number. The first block starts at a size fitted to the input
// (docStart) and doubles, so a small pickle does not pay for a whole block.
func (d *decoder) addCont(c cont) (uint64, error) {
	doc := d.doc
	n := len(doc.conts) // docStart made the first block
	if len(doc.conts[n-1]) == contBlock {
		if err := d.mem.add(contBlock * contBytes); err != nil {
			return 0, err
		}
		doc.conts = append(doc.conts, make([]cont, 0, contBlock))
		n++
	}
	b := &doc.conts[n-1]
	if len(*b) == cap(*b) {
		c := min(2*cap(*b), contBlock)
		if err := d.mem.swap(int64(cap(*b))*contBytes, int64(c)*contBytes); err != nil {
			return 0, err
		}
		*b = append(make([]cont, 0, c), *b...)
	}
	*b = append(*b, c)
	return uint64((n-1)<<contShift + len(*b) - 1), nil
}

// contBytes is the size of a cont.
const contBytes = 16

// errPool is the cause when a Doc would need more chunks than a container's offset can number.
var errPool = fmt.Errorf("%w: more than %d chunks of container elements (32 GiB decoded)", ErrLimit, maxChunks)

// reserve makes room for n more Values in container ci and returns where they go. A container grows in
// place while it is the last in its chunk and the chunk has room; otherwise it moves to the end of the
// current chunk, or to a new one, with room to double when it has grown before (a list filled in batches),
// so a list whose elements are built between its batches moves O(log n) times.
func (d *decoder) reserve(ci uint64, n int) ([]Value, error) {
	doc := d.doc
	c := doc.cont(ci)
	used := int(c.n)
	k, off := int(c.off>>chunkShift), int(c.off&chunkMask)
	ch := doc.chunks[k]
	end := off + used
	switch {
	case used+n <= int(c.cap): // room reserved earlier
	case used == 0: // the first elements: placed where the current chunk ends
		if cur := doc.chunks[doc.cur]; len(cur)+n <= cap(cur) {
			k, off = doc.cur, len(cur)
			doc.chunks[k] = cur[:off+n]
		} else {
			to, err := d.place(n)
			if err != nil {
				return nil, err
			}
			k, off = to>>chunkShift, to&chunkMask
		}
		c.off, c.cap = uint32(k<<chunkShift|off), uint32(n)
	case end == len(ch) && end+n <= cap(ch): // the chunk's last container: grow in place
		doc.chunks[k] = ch[:end+n]
		c.cap = uint32(used + n)
	case end == len(ch) && cap(ch) > chunkMax: // alone in its chunk: a larger one replaces it
		grown, err := growSlice(&d.mem, ch, n, 8)
		if err != nil {
			return nil, err
		}
		doc.chunks[k] = grown[:end+n]
		c.cap = uint32(used + n)
	default:
		size := used + n
		if used > 0 {
			size = max(2*size, 8)
		}
		to, err := d.place(size)
		if err != nil {
			return nil, err
		}
		k2, off2 := to>>chunkShift, to&chunkMask
		copy(doc.chunks[k2][off2:], ch[off:end])
		k, off = k2, off2
		c.off, c.cap = uint32(to), uint32(size)
	}
	c.n = uint32(used + n)
	return doc.chunks[k][off+used : off+used+n], nil
}

// place finds room for size Values: at the end of the current chunk, in a new chunk that becomes current,
// or, past chunkMax, in a chunk of their own. It returns where, as a cont.off, with the room counted in the
// chunk's length.
func (d *decoder) place(size int) (int, error) {
	doc := d.doc
	if size > chunkMax {
		if len(doc.chunks) == maxChunks {
			return 0, errPool
		}
		if err := d.mem.add(8 * int64(size)); err != nil {
			return 0, err
		}
		doc.chunks = append(doc.chunks, make([]Value, size)) // a capacity over chunkMax marks a chunk of its own
		return (len(doc.chunks) - 1) << chunkShift, nil
	}
	cur := doc.chunks[doc.cur]
	if len(cur)+size > cap(cur) {
		if len(doc.chunks) == maxChunks {
			return 0, errPool
		}
		// Chunks double from the first, which docStart fits to the input, up to chunkMax.
		c := min(max(2*cap(cur), size), chunkMax)
		if err := d.mem.add(8 * int64(c)); err != nil {
			return 0, err
		}
		doc.chunks = append(doc.chunks, make([]Value, 0, c))
		doc.cur = len(doc.chunks) - 1
		cur = doc.chunks[doc.cur]
	}
	at := len(cur)
	doc.chunks[doc.cur] = cur[:at+size]
	return doc.cur<<chunkShift | at, nil
}

// Each container's nesting depth and whether it was shared are kept in decoder.meta, two bytes per container
// that adopt reads for every element placed.
const (
	sharedBit = 1 << 15 // already placed inside another container: no more changes (keeps results acyclic)
	depthMask = sharedBit - 1
)

// adopt records that v is being placed inside parent, whose nesting depth is *depth. A list, dict or set is
// sealed against later changes (which is what keeps results acyclic), and *depth grows to cover v's depth.
func (d *decoder) adopt(parent Value, depth *uint16, v Value) error {
	t := v.tag()
	if !isCont(t) {
		return nil // scalars have depth 0
	}
	if v == parent {
		return errCycle
	}
	m := &d.meta[v.payload()]
	if t != tTuple && *m&sharedBit == 0 { // only write when needed: most elements are shared frames, already sealed
		*m |= sharedBit
	}
	if h := *m & depthMask; h >= *depth {
		if int(h) >= d.lim.MaxDepth {
			return overLimit("nesting depth", int64(h)+1, "MaxDepth", int64(d.lim.MaxDepth))
		}
		*depth = h + 1
	}
	return nil
}

// newTuple builds a tuple from items, which it copies.
func (d *decoder) newTuple(items []Value) error {
	if len(items) == 0 {
		if d.emptyTuple == 0 {
			t, err := d.newCont(tTuple) // the one empty tuple, as in Python
			if err != nil {
				return err
			}
			d.emptyTuple = t
		}
		return d.pushNew(d.emptyTuple)
	}
	if len(items) > d.lim.MaxItems {
		return overLimit("tuple items", int64(len(items)), "MaxItems", int64(d.lim.MaxItems))
	}
	depth := uint16(1)
	for _, v := range items {
		if err := d.adopt(noValue, &depth, v); err != nil {
			return err
		}
	}
	t, err := d.newCont(tTuple)
	if err != nil {
		return err
	}
	dst, err := d.reserve(t.payload(), len(items))
	if err != nil {
		return err
	}
	copy(dst, items)
	d.meta[t.payload()] = depth
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
		l, err := d.newCont(tList)
		if err != nil {
			return err
		}
		if err := d.extend(l, items); err != nil {
			return err
		}
		return d.pushNew(l)
	case opDict:
		m, err := d.newCont(tDict)
		if err != nil {
			return err
		}
		if err := d.fill(m, items); err != nil {
			return err
		}
		return d.pushNew(m)
	default: // opFrozenSet
		s, err := d.newCont(tFrozenSet)
		if err != nil {
			return err
		}
		if err := d.addTo(s, items); err != nil {
			return err
		}
		return d.pushNew(s)
	}
}

// intoBelowMark is APPENDS, SETITEMS and ADDITEMS: the values above the newest mark go, by add, into the
// container just under them, which must carry tag (what names the opcode in the error).
func (d *decoder) intoBelowMark(tag uint64, what string, add func(Value, []Value) error) error {
	items, err := d.popMark()
	if err != nil {
		return err
	}
	if len(d.stack) <= d.fence {
		return errUnderflow
	}
	c := d.stack[len(d.stack)-1]
	if c.tag() != tag {
		return malformed("%s a %s", what, c.TypeName())
	}
	return add(c, items)
}

// intoBelowTop is APPEND (n = 1) and SETITEM (n = 2): the top n values go, by add, into the container just
// under them, which must carry tag, and leave the stack.
func (d *decoder) intoBelowTop(n int, tag uint64, what string, add func(Value, []Value) error) error {
	if len(d.stack)-d.fence < n+1 {
		return errUnderflow
	}
	k := len(d.stack) - n
	c := d.stack[k-1]
	if c.tag() != tag {
		return malformed("%s a %s", what, c.TypeName())
	}
	if err := add(c, d.stack[k:]); err != nil {
		return err
	}
	d.stack = d.stack[:k]
	return nil
}

// extend appends items to list l, checking the list may still change and stays within the limits.
func (d *decoder) extend(l Value, items []Value) error {
	ci := l.payload()
	c := d.doc.cont(ci)
	if d.meta[ci]&sharedBit != 0 {
		return errCycle
	}
	if int(c.n)+len(items) > d.lim.MaxItems {
		return overLimit("list items", int64(int(c.n)+len(items)), "MaxItems", int64(d.lim.MaxItems))
	}
	depth := d.meta[ci]
	for _, v := range items {
		if err := d.adopt(l, &depth, v); err != nil {
			return err
		}
	}
	d.meta[ci] = depth
	dst, err := d.reserve(ci, len(items))
	if err != nil {
		return err
	}
	copy(dst, items)
	return nil
}

// fill stores the key/value pairs in items into dict m: in its shape while it has one (fillShaped), and as
// pairs from the first key that does not fit a shape on.
func (d *decoder) fill(m Value, items []Value) error {
	if len(items)%2 != 0 {
		return malformed("odd number of items (%d) for a dict", len(items))
	}
	ci := m.payload()
	c := d.doc.cont(ci)
	if d.meta[ci]&sharedBit != 0 {
		return errCycle
	}
	if n := d.doc.entries(c) + len(items)/2; n > d.lim.MaxItems {
		return overLimit("dict entries", int64(n), "MaxItems", int64(d.lim.MaxItems))
	}
	if c.shape != pairsForm {
		n, err := d.fillShaped(m, items)
		if err != nil || n == len(items) {
			return err
		}
		items = items[n:]
		if err := d.unshape(ci); err != nil {
			return err
		}
	}
	for i := 0; i < len(items); i += 2 {
		k, v := items[i], items[i+1]
		depth := d.meta[ci]
		if k.tag() != tStr { // a str key, the usual case, has nothing to adopt
			if err := d.adopt(m, &depth, k); err != nil {
				return err
			}
		}
		if err := d.adopt(m, &depth, v); err != nil {
			return err
		}
		d.meta[ci] = depth
		if err := d.set(ci, k, v); err != nil {
			return err
		}
	}
	return nil
}

// addTo adds items to the set s.
func (d *decoder) addTo(s Value, items []Value) error {
	ci := s.payload()
	c := d.doc.cont(ci)
	if d.meta[ci]&sharedBit != 0 {
		return errCycle
	}
	if int(c.n)/2+len(items) > d.lim.MaxItems {
		return overLimit("set items", int64(int(c.n)/2+len(items)), "MaxItems", int64(d.lim.MaxItems))
	}
	for _, v := range items {
		depth := d.meta[ci]
		if err := d.adopt(s, &depth, v); err != nil {
			return err
		}
		d.meta[ci] = depth
		if err := d.set(ci, v, 0); err != nil {
			return err
		}
	}
	return nil
}

// set inserts or replaces key k in the dict or set ci as Python's d[k] = v does: a replaced entry keeps its
// position and its original key. Snapshot dicts are small and keyed by interned strs, which a scan of a few
// Values settles; a dict past smallDict entries, or with any other key, gets a hash index. It fails for an
// unhashable key, or when the key budget runs out.
func (d *decoder) set(ci uint64, k, v Value) error {
	doc := d.doc
	c := doc.cont(ci)
	if k.tag() == tStr && !c.indexed && doc.spans[k.payload()].n <= internMaxLen {
		p := doc.elems(c)
		for j := 0; j < len(p); j += 2 {
			if p[j] == k {
				p[j+1] = v
				return nil
			}
		}
		if int(c.n)/2 < smallDict {
			kv, err := d.reserve(ci, 2)
			if err != nil {
				return err
			}
			kv[0], kv[1] = k, v
			return nil
		}
	}
	hk, err := d.hashKey(k)
	if err != nil {
		return err
	}
	if !c.indexed {
		if err := d.buildIndex(ci); err != nil {
			return err
		}
	}
	idx := doc.index[uint32(ci)]
	if i, ok := idx[hk]; ok {
		doc.elems(c)[2*int(i)+1] = v
		return nil
	}
	if err := d.mem.add(mapEntryBytes); err != nil {
		return err
	}
	idx[hk] = int32(c.n / 2)
	doc.indexKeys++
	kv, err := d.reserve(ci, 2)
	if err != nil {
		return err
	}
	kv[0], kv[1] = k, v
	return nil
}

// longKey is the length above which a str key's length is charged to the key budget: hashing it is no longer
// free.
const longKey = 64

// hashKey returns k's hash key: the string itself for a str, keyHasher's comparable form for anything else.
// Hashing may take keyWorkPerByte bytes of work per input byte decoded so far.
func (d *decoder) hashKey(k Value) (any, error) {
	if at := d.base + int64(d.pos); at > d.credited {
		d.keys.budget += keyWorkPerByte * (at - d.credited)
		d.credited = at
	}
	if k.tag() == tStr {
		s := d.doc.str(k)
		if len(s) > longKey {
			if err := d.keys.charge(len(s)); err != nil {
				return nil, err
			}
		}
		return s, nil
	}
	x := d.mat.value(k)
	if d.mat.err != nil {
		return nil, d.mat.err
	}
	return d.keys.hashKey(x)
}

// buildIndex indexes the keys of dict or set ci, which until now held only short strs.
func (d *decoder) buildIndex(ci uint64) error {
	doc := d.doc
	c := doc.cont(ci)
	if err := d.mem.add(int64(c.n/2) * mapEntryBytes); err != nil {
		return err
	}
	doc.indexKeys += int(c.n / 2)
	idx := make(map[any]int32, c.n/2+1)
	p := doc.elems(c)
	for j := 0; j < len(p); j += 2 {
		idx[doc.str(p[j])] = int32(j / 2)
	}
	if doc.index == nil {
		doc.index = make(map[uint32]map[any]int32)
	}
	doc.index[uint32(ci)] = idx
	c.indexed = true
	return nil
}
