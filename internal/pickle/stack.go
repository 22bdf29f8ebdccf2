package pickle

// The unpickling stack. As in CPython, MARK starts a new region and opcodes may not pop below the newest mark
// (the fence); the opcodes that end a region (APPENDS, SETITEMS, TUPLE, …) take everything above it.

// push adds an existing value (from the memo or DUP).
func (d *decoder) push(v Value) error {
	if len(d.stack)+len(d.marks) >= d.lim.MaxStack {
		return overLimit("stack size", int64(len(d.stack)+len(d.marks))+1, "MaxStack", int64(d.lim.MaxStack))
	}
	if len(d.stack) == cap(d.stack) {
		var err error
		if d.stack, err = growSlice(&d.mem, d.stack, 1, 8); err != nil {
			return err
		}
	}
	d.stack = append(d.stack, v)
	return nil
}

// pushNew adds a value the current opcode created, counting it against MaxObjects.
func (d *decoder) pushNew(v Value) error {
	d.objects++
	if d.objects > d.lim.MaxObjects {
		return overLimit("values created", d.objects, "MaxObjects", d.lim.MaxObjects)
	}
	return d.push(v)
}

// pop removes and returns the top value, which must be above the fence.
func (d *decoder) pop() (Value, error) {
	n := len(d.stack)
	if n <= d.fence {
		return 0, errUnderflow
	}
	v := d.stack[n-1]
	d.stack = d.stack[:n-1]
	return v, nil
}

// top returns the top value without removing it.
func (d *decoder) top() (Value, error) {
	if len(d.stack) <= d.fence {
		return 0, errUnderflow
	}
	return d.stack[len(d.stack)-1], nil
}

// popOne is POP. Like CPython, with nothing above the fence it discards the mark instead.
func (d *decoder) popOne() error {
	if len(d.stack) > d.fence {
		_, err := d.pop()
		return err
	}
	if len(d.marks) > 0 {
		_, err := d.popMark()
		return err
	}
	return errUnderflow
}

// mark is MARK: it starts a new region of the stack.
func (d *decoder) mark() error {
	if len(d.stack)+len(d.marks) >= d.lim.MaxStack {
		return overLimit("stack size", int64(len(d.stack)+len(d.marks))+1, "MaxStack", int64(d.lim.MaxStack))
	}
	var err error
	if d.marks, err = growSlice(&d.mem, d.marks, 1, 8); err != nil {
		return err
	}
	d.marks = append(d.marks, len(d.stack))
	d.fence = len(d.stack)
	return nil
}

// popMark removes the newest mark and the values above it, and returns those values. The returned slice
// aliases the stack's storage: use it before the next push.
func (d *decoder) popMark() ([]Value, error) {
	n := len(d.marks)
	if n == 0 {
		return nil, errNoMark
	}
	k := d.marks[n-1]
	d.marks = d.marks[:n-1]
	if n > 1 {
		d.fence = d.marks[n-2]
	} else {
		d.fence = 0
	}
	items := d.stack[k:]
	d.stack = d.stack[:k]
	return items, nil
}

// The memo. Python's picklers number entries 0, 1, 2, … in order, so entries live in a dense slice; an
// out-of-order index (legal, but only a hand-made pickle writes one) goes to a map, so a 5-byte LONG_BINPUT of
// index 2^32-1 costs one map entry, not a 32 GiB slice.

// memoLen is the number of entries, which is also the index MEMOIZE assigns next (as in Python, len(memo)).
func (d *decoder) memoLen() int { return len(d.memo) + len(d.sparse) }

func (d *decoder) get(i uint64) error {
	if i < uint64(len(d.memo)) {
		return d.push(d.memo[i])
	}
	if v, ok := d.sparse[i]; ok {
		return d.push(v)
	}
	return malformed("memo entry %d was never stored", i)
}

// put stores the top of the stack at memo index i, replacing any entry there.
func (d *decoder) put(i uint64) error {
	v, err := d.top()
	if err != nil {
		return err
	}
	if i < uint64(len(d.memo)) {
		d.memo[i] = v
		return nil
	}
	if _, ok := d.sparse[i]; !ok && d.memoLen() >= d.lim.MaxMemo {
		return overLimit("memo entries", int64(d.memoLen())+1, "MaxMemo", int64(d.lim.MaxMemo))
	}
	if i > uint64(len(d.memo)) {
		if _, ok := d.sparse[i]; !ok {
			if err := d.mem.add(mapEntryBytes); err != nil {
				return err
			}
		}
		if d.sparse == nil {
			d.sparse = make(map[uint64]Value)
		}
		d.sparse[i] = v
		return nil
	}
	if d.memo, err = growSlice(&d.mem, d.memo, 1, 8); err != nil {
		return err
	}
	d.memo = append(d.memo, v)
	// Entries put early may now continue the dense run.
	for len(d.sparse) > 0 {
		next, ok := d.sparse[uint64(len(d.memo))]
		if !ok {
			break
		}
		if d.memo, err = growSlice(&d.mem, d.memo, 1, 8); err != nil {
			return err
		}
		delete(d.sparse, uint64(len(d.memo)))
		d.mem.release(mapEntryBytes)
		d.memo = append(d.memo, next)
	}
	return nil
}
