package pickle

import "hash/maphash"

// internTable finds a short str's one Value by its bytes: an open-addressing hash table of Values whose bytes
// are in the Doc's text. It holds no pointers, so it costs the garbage collector nothing, and starts small
// for a small input.
type internTable struct {
	slots []Value // 0 is an empty slot (no str is Value 0, which is None)
	n     int
}

// internSeed is one seed for every table: the hashes only need to be unpredictable to the input.
var internSeed = maphash.MakeSeed()

// find returns the Value of the str with bytes b, or the slot where it would go.
func (t *internTable) find(d *Doc, b string) (Value, int) {
	if len(t.slots) == 0 {
		return 0, -1
	}
	mask := len(t.slots) - 1
	i := int(maphash.String(internSeed, b)) & mask
	for {
		v := t.slots[i]
		if v == 0 {
			return 0, i
		}
		if d.str(v) == b {
			return v, i
		}
		i = (i + 1) & mask
	}
}

// add puts v, a str not in the table, in slot i (from find), growing the table when it is half full, as m
// allows.
func (t *internTable) add(d *Doc, v Value, i int, m *meter) error {
	if i < 0 || 2*(t.n+1) > len(t.slots) {
		size := max(2*len(t.slots), 16)
		if err := m.swap(8*int64(len(t.slots)), 8*int64(size)); err != nil {
			return err
		}
		t.rehash(d, size)
		_, i = t.find(d, d.str(v))
	}
	t.slots[i] = v
	t.n++
	return nil
}

func (t *internTable) rehash(d *Doc, size int) {
	old := t.slots
	t.slots = make([]Value, size)
	mask := size - 1
	for _, v := range old {
		if v == 0 {
			continue
		}
		i := int(maphash.String(internSeed, d.str(v))) & mask
		for t.slots[i] != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = v
	}
}
