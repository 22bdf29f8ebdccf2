package allocator

// blockTree is an ordered set of blocks: an intrusive treap whose links live in the blocks themselves, so
// inserting and erasing allocate nothing. It gives std::set's lower_bound and neighbour steps in
// O(log n) for the tens of thousands of free blocks a long training run can cache. Keys must not change
// while a block is in the tree, which the allocator guarantees by taking a block out before it moves or
// grows, as PyTorch does with its std::set.
type blockTree struct {
	root  *block
	n     int
	order treeOrder
	rng   uint64 // xorshift state for priorities: deterministic, so runs are reproducible
}

// treeOrder selects a tree's comparator. A switch rather than a func value lets the compiler inline the
// comparisons, which are most of the hot path's work.
type treeOrder uint8

const (
	orderSizeAddress treeOrder = iota // bySizeAddress
	orderSizeSegment                  // bySizeSegment
	orderAddress                      // byAddress
)

func newBlockTree(order treeOrder, seed uint64) blockTree {
	return blockTree{order: order, rng: seed | 1}
}

// cmp compares two blocks in the tree's order.
func (t *blockTree) cmp(a, b *block) int {
	switch t.order {
	case orderSizeAddress:
		return bySizeAddress(a, b)
	case orderSizeSegment:
		return bySizeSegment(a, b)
	default:
		return byAddress(a, b)
	}
}

// Len returns the number of blocks in the tree.
func (t *blockTree) Len() int { return t.n }

func (t *blockTree) nextPrio() uint32 {
	x := t.rng
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	t.rng = x
	return uint32(x >> 32)
}

// insert adds b, which must not be in any tree.
func (t *blockTree) insert(b *block) {
	b.left, b.right = nil, nil
	b.prio = t.nextPrio()
	t.root = t.insertAt(t.root, b)
	t.n++
}

func (t *blockTree) insertAt(n, b *block) *block {
	if n == nil {
		return b
	}
	if t.cmp(b, n) < 0 {
		n.left = t.insertAt(n.left, b)
		if n.left.prio > n.prio {
			n = rotateRight(n)
		}
	} else {
		n.right = t.insertAt(n.right, b)
		if n.right.prio > n.prio {
			n = rotateLeft(n)
		}
	}
	return n
}

func rotateRight(n *block) *block {
	l := n.left
	n.left = l.right
	l.right = n
	return l
}

func rotateLeft(n *block) *block {
	r := n.right
	n.right = r.left
	r.left = n
	return r
}

// erase removes b and reports whether it was in the tree.
func (t *blockTree) erase(b *block) bool {
	link := &t.root
	for *link != nil && *link != b {
		if t.cmp(b, *link) < 0 {
			link = &(*link).left
		} else {
			link = &(*link).right
		}
	}
	if *link == nil {
		return false
	}
	*link = mergeTreaps(b.left, b.right)
	b.left, b.right = nil, nil
	t.n--
	return true
}

// mergeTreaps joins two treaps whose keys are all ordered a < b.
func mergeTreaps(a, b *block) *block {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.prio > b.prio:
		a.right = mergeTreaps(a.right, b)
		return a
	default:
		b.left = mergeTreaps(a, b.left)
		return b
	}
}

// lowerBound returns the first block not less than key, or nil.
func (t *blockTree) lowerBound(key *block) *block {
	var res *block
	for n := t.root; n != nil; {
		if t.cmp(n, key) >= 0 {
			res, n = n, n.left
		} else {
			n = n.right
		}
	}
	return res
}

// after returns the first block greater than b (std::next), or nil.
func (t *blockTree) after(b *block) *block {
	var res *block
	for n := t.root; n != nil; {
		if t.cmp(n, b) > 0 {
			res, n = n, n.left
		} else {
			n = n.right
		}
	}
	return res
}

// before returns the last block less than key (std::prev of lower_bound), or nil.
func (t *blockTree) before(key *block) *block {
	var res *block
	for n := t.root; n != nil; {
		if t.cmp(n, key) < 0 {
			res, n = n, n.right
		} else {
			n = n.left
		}
	}
	return res
}

// appendTo appends the blocks in order to dst. Callers that change the tree while walking it walk such a
// copy, which is what PyTorch's iterate-then-erase loops amount to.
func (t *blockTree) appendTo(dst []*block) []*block {
	return appendInOrder(dst, t.root)
}

func appendInOrder(dst []*block, n *block) []*block {
	for n != nil {
		dst = appendInOrder(dst, n.left)
		dst = append(dst, n)
		n = n.right
	}
	return dst
}
