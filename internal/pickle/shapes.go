package pickle

// Shapes. A snapshot is mostly dicts with the same few str keys in the same order (a million trace entries
// of action, addr, size, stream, time_us, frames): stored as pairs, half of a Doc would be those keys again
// and again. A dict whose keys are all short strs, up to smallDict of them, instead points to a shape, the
// sequence of its keys, which every dict with those keys in that order shares, and holds its values alone.
// Any other dict, and every set, holds keys and values alternating (the pairs form).
//
// Shapes form a tree from the empty one, one key per step: a shape is its last key and the shape of the keys
// before it, 16 bytes in one flat slice. Filling a dict steps from shape to shape through the children of
// each; reading one walks from its shape to the root, which for a dozen keys in a few hundred bytes of
// shapes costs no more than scanning the pairs did.

// shape is one sequence of keys: the shape parent's, then key.
type shape struct {
	key     Value
	parent  uint16
	n       uint16 // keys
	child   uint16 // the first shape one key longer, or 0
	sibling uint16 // the next shape with the same parent, or 0
}

// Shape numbers: 0 marks a dict in the pairs form; emptyShape, the root, is the dict without keys.
const (
	pairsForm  = 0
	emptyShape = 1
	maxShapes  = 1<<16 - 1
	shapeBytes = 16
)

// newShapes returns the shapes every Doc starts with: none, and the empty one, with room for a snapshot's
// few dozen.
func newShapes() []shape { return make([]shape, 2, initialShapes) }

const initialShapes = 32

// keyAt returns the position of key k in shape s, or -1.
func (d *Doc) keyAt(s uint16, k Value) int {
	for ; s > emptyShape; s = d.shapes[s].parent {
		if d.shapes[s].key == k {
			return int(d.shapes[s].n) - 1
		}
	}
	return -1
}

// shapeKeys returns the keys of a shaped dict, in order, in a new slice.
func (d *Doc) shapeKeys(c *cont) []Value {
	keys := make([]Value, d.shapes[c.shape].n)
	for s := c.shape; s > emptyShape; s = d.shapes[s].parent {
		keys[d.shapes[s].n-1] = d.shapes[s].key
	}
	return keys
}

// child returns the shape of shape s's keys followed by k if there is one, else 0. A key with a child of s
// is never one of s's: a child is made only for a key its parent lacks. The child found moves to the front
// of its siblings, so the dicts of a long run with the same keys find theirs first.
func (d *decoder) child(s uint16, k Value) uint16 {
	sh := d.doc.shapes
	c := sh[s].child
	if c == 0 || sh[c].key == k {
		return c
	}
	prev := c
	for c = sh[c].sibling; c != 0; prev, c = c, sh[c].sibling {
		if sh[c].key == k {
			sh[prev].sibling, sh[c].sibling, sh[s].child = sh[c].sibling, sh[s].child, c
			return c
		}
	}
	return 0
}

// newShape makes the shape of shape s's keys followed by k, which it lacks; 0 when no more shapes may be
// made, so the dict must take the pairs form.
func (d *decoder) newShape(s uint16, k Value) (uint16, error) {
	doc := d.doc
	if len(doc.shapes) == maxShapes {
		return 0, nil
	}
	var err error
	if doc.shapes, err = growSlice(&d.mem, doc.shapes, 1, shapeBytes); err != nil {
		return 0, err
	}
	to := uint16(len(doc.shapes))
	doc.shapes = append(doc.shapes, shape{key: k, parent: s, n: doc.shapes[s].n + 1, sibling: doc.shapes[s].child})
	doc.shapes[s].child = to
	return to, nil
}

// fillShaped stores the pairs of items into the shaped dict m for as long as they keep it shaped: keys that
// are short strs, at most smallDict of them. It returns how many items it stored; the caller turns the dict
// into the pairs form for the rest. Room for every pair is reserved at once (a dict is usually pickled in
// one SETITEMS), and what a repeated key leaves over stays reserved.
func (d *decoder) fillShaped(m Value, items []Value) (int, error) {
	doc := d.doc
	ci := m.payload()
	have := int(doc.cont(ci).n)
	if have == 0 {
		if s := d.recentShape(items); s != 0 {
			return len(items), d.fillAs(m, s, items)
		}
	}
	room := have + min(len(items)/2, smallDict-have)
	if room > have {
		if _, err := d.reserve(ci, room-have); err != nil {
			return 0, err
		}
	}
	c := doc.cont(ci)
	vals := doc.elems(c)
	s, n := c.shape, have
	depth := d.meta[ci]
	i := 0
	for ; i < len(items); i += 2 {
		k, v := items[i], items[i+1]
		if k.tag() != tStr || doc.spans[k.payload()].n > internMaxLen {
			break
		}
		j := -1
		next := doc.shapes[s].child // the first child is the usual one
		if next == 0 || doc.shapes[next].key != k {
			if next = d.child(s, k); next == 0 {
				j = doc.keyAt(s, k)
			}
		}
		if j < 0 {
			if n == room {
				break
			}
			if next == 0 {
				var err error
				if next, err = d.newShape(s, k); err != nil {
					return 0, err
				}
				if next == pairsForm {
					break
				}
			}
			s, j = next, n
			n++
		}
		if err := d.adopt(m, &depth, v); err != nil {
			return 0, err // the decode fails: nothing stored need be kept
		}
		vals[j] = v
	}
	c.n, c.shape = uint32(n), s
	d.meta[ci] = depth
	if have == 0 && i == len(items) {
		d.recent = [len(d.recent)]uint16{s, d.recent[0], d.recent[1], d.recent[2]}
	}
	return i, nil
}

// recentShape returns the shape of the keys in items if it is one of the last few a dict was filled with in
// one go, else 0. A snapshot's dicts come in a few kinds, each pickled with all its keys at once.
func (d *decoder) recentShape(items []Value) uint16 {
	sh := d.doc.shapes
	n := len(items) / 2
next:
	for _, s := range d.recent {
		if s == 0 || int(sh[s].n) != n {
			continue
		}
		for t, j := s, 2*n-2; t > emptyShape; t, j = sh[t].parent, j-2 {
			if sh[t].key != items[j] {
				continue next
			}
		}
		return s
	}
	return 0
}

// fillAs fills the empty dict m with the pairs of items, whose keys are those of shape s in order.
func (d *decoder) fillAs(m Value, s uint16, items []Value) error {
	ci := m.payload()
	vals, err := d.reserve(ci, len(items)/2)
	if err != nil {
		return err
	}
	depth := d.meta[ci]
	for j := range vals {
		v := items[2*j+1]
		if err := d.adopt(m, &depth, v); err != nil {
			return err
		}
		vals[j] = v
	}
	d.doc.cont(ci).shape = s
	d.meta[ci] = depth
	return nil
}

// unshape turns the shaped dict ci into the pairs form, with room for one more pair.
func (d *decoder) unshape(ci uint64) error {
	doc := d.doc
	c := doc.cont(ci)
	keys, vals := doc.shapeKeys(c), doc.elems(c)
	size := 2*len(keys) + 2
	to, err := d.place(size)
	if err != nil {
		return err
	}
	p := doc.chunks[to>>chunkShift][to&chunkMask:][:size]
	for j, k := range keys {
		p[2*j], p[2*j+1] = k, vals[j]
	}
	c.off, c.n, c.cap, c.shape = uint32(to), uint32(2*len(keys)), uint32(size), pairsForm
	return nil
}
