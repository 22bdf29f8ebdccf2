package replay

// spanSet is a set of address ranges that do not overlap, ordered by their start: a treap in one slice, so
// that adding, removing and finding the range that holds an address take O(log n) however the ranges come.
// A replay keeps every segment of a trace in such sets, and a final state may hold hundreds of thousands of
// them: a sorted slice, which shifts its tail on every insert and delete, made the replay quadratic in them.
type spanSet struct {
	nodes []spanNode
	root  int32 // -1: empty
	free  []int32
	n     int
	rng   uint64 // xorshift state for priorities: deterministic, so replays are reproducible
}

type spanNode struct {
	s           span
	prio        uint32
	left, right int32
}

func newSpanSet(capacity int) spanSet {
	return spanSet{nodes: make([]spanNode, 0, capacity), root: -1, rng: 0x9E3779B97F4A7C15}
}

// Len returns the number of ranges in the set.
func (t *spanSet) Len() int { return t.n }

func (t *spanSet) nextPrio() uint32 {
	x := t.rng
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	t.rng = x
	return uint32(x >> 32)
}

// split cuts the tree at n into the ranges that start before addr and the others.
func (t *spanSet) split(n int32, addr uint64) (lo, hi int32) {
	if n < 0 {
		return -1, -1
	}
	if t.nodes[n].s.addr < addr {
		l, r := t.split(t.nodes[n].right, addr)
		t.nodes[n].right = l
		return n, r
	}
	l, r := t.split(t.nodes[n].left, addr)
	t.nodes[n].left = r
	return l, n
}

// merge joins two trees whose ranges are in order, all of a's before all of b's.
func (t *spanSet) merge(a, b int32) int32 {
	switch {
	case a < 0:
		return b
	case b < 0:
		return a
	case t.nodes[a].prio > t.nodes[b].prio:
		t.nodes[a].right = t.merge(t.nodes[a].right, b)
		return a
	}
	t.nodes[b].left = t.merge(a, t.nodes[b].left)
	return b
}

// add puts s in the set, in place of a range that starts where it does.
func (t *spanSet) add(s span) {
	t.remove(s.addr)
	var n int32
	if k := len(t.free); k > 0 {
		n, t.free = t.free[k-1], t.free[:k-1]
		t.nodes[n] = spanNode{s: s, prio: t.nextPrio(), left: -1, right: -1}
	} else {
		n = int32(len(t.nodes))
		t.nodes = append(t.nodes, spanNode{s: s, prio: t.nextPrio(), left: -1, right: -1})
	}
	lo, hi := t.split(t.root, s.addr)
	t.root = t.merge(t.merge(lo, n), hi)
	t.n++
}

// remove takes out the range that starts at addr, and reports whether there was one.
func (t *spanSet) remove(addr uint64) bool {
	lo, rest := t.split(t.root, addr)
	mid, hi := rest, int32(-1) // at the top of the address space nothing starts above addr
	if addr < ^uint64(0) {
		mid, hi = t.split(rest, addr+1)
	}
	if mid >= 0 { // starts are unique: mid is one node
		t.free = append(t.free, mid)
		t.n--
	}
	t.root = t.merge(lo, hi)
	return mid >= 0
}

// floor returns the range that starts last at or below addr.
func (t *spanSet) floor(addr uint64) (span, bool) {
	best, found := span{}, false
	for n := t.root; n >= 0; {
		if nd := &t.nodes[n]; nd.s.addr <= addr {
			best, found = nd.s, true
			n = nd.right
		} else {
			n = nd.left
		}
	}
	return best, found
}

// ceil returns the range that starts first at or above addr.
func (t *spanSet) ceil(addr uint64) (span, bool) {
	best, found := span{}, false
	for n := t.root; n >= 0; {
		if nd := &t.nodes[n]; nd.s.addr >= addr {
			best, found = nd.s, true
			n = nd.left
		} else {
			n = nd.right
		}
	}
	return best, found
}

// holding returns the range that holds addr.
func (t *spanSet) holding(addr uint64) (span, bool) {
	if s, ok := t.floor(addr); ok && addr < s.end() {
		return s, true
	}
	return span{}, false
}

// overlaps reports whether a range of the set meets [addr, addr+size).
func (t *spanSet) overlaps(addr, size uint64) bool {
	if _, ok := t.holding(addr); ok {
		return true
	}
	s, ok := t.ceil(addr)
	return ok && s.addr-addr < size
}
