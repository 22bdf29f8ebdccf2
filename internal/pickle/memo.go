package pickle

// memo is the unpickler's memo table. Python's picklers number entries 0, 1, 2, … in order, so entries live
// in a dense slice; an out-of-order index (legal, but only a hand-made pickle writes one) goes to a map, so
// a 5-byte LONG_BINPUT of index 2^32-1 costs one map entry, not a 64 GiB slice.
type memo struct {
	dense  []any
	sparse map[uint64]any // indices >= len(dense)
	max    int
}

// len is the number of entries, which is also the index MEMOIZE assigns next (as in Python, len(memo)).
func (m *memo) len() int { return len(m.dense) + len(m.sparse) }

// put stores v at index i, replacing any entry there.
func (m *memo) put(i uint64, v any) error {
	if i < uint64(len(m.dense)) {
		m.dense[i] = v
		return nil
	}
	if _, ok := m.sparse[i]; !ok && m.len() >= m.max {
		return overLimit("memo entries", int64(m.len())+1, "MaxMemo", int64(m.max))
	}
	if i > uint64(len(m.dense)) {
		if m.sparse == nil {
			m.sparse = make(map[uint64]any)
		}
		m.sparse[i] = v
		return nil
	}
	m.dense = append(grow(m.dense), v)
	// Entries put early may now continue the dense run.
	for len(m.sparse) > 0 {
		next, ok := m.sparse[uint64(len(m.dense))]
		if !ok {
			break
		}
		delete(m.sparse, uint64(len(m.dense)))
		m.dense = append(grow(m.dense), next)
	}
	return nil
}

// get returns the entry at index i.
func (m *memo) get(i uint64) (any, error) {
	if i < uint64(len(m.dense)) {
		return m.dense[i], nil
	}
	if v, ok := m.sparse[i]; ok {
		return v, nil
	}
	return nil, malformed("memo entry %d was never stored", i)
}
