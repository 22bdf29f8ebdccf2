package pickle

// arena holds the dicts and lists of one decode, carved from fixed-size blocks. A snapshot decodes into tens
// of thousands of small dicts and lists; block allocation cuts the allocator's per-object work, and numbering
// the dicts lets a list of dicts store 4-byte IDs instead of pointers. Snapshot traceback lists hold about a
// hundred frame references each, millions in a large file: as IDs they take half the memory and, holding no
// pointers, cost the garbage collector nothing to scan.
//
// A block stays alive while any object in it is reachable, and a list of dicts reaches every dict block
// through its arena pointer: what a caller holding the decoded tree wants anyway.
type arena struct {
	dicts [][]Dict // block b holds the dicts with IDs b*arenaBlock …
	lists []List   // free room for lists, which need no ID lookup: blocks start small and double
	nDict uint32
	nList uint32

	items     []Item   // free room for dict entries
	ids       []uint32 // free room for list elements stored as dict IDs
	itemsNext int      // size of the next block of entries: blocks start at a size fitted to the input and
	idsNext   int      // double, so a tiny pickle does not pay for a large block
}

const (
	arenaBlock = 32   // dicts per block; a power of two so ID → block is a shift
	listBlock  = 128  // lists per block, at most
	itemBlock  = 2048 // dict entries per block, at most
	idBlock    = 8192 // dict IDs per block, at most
)

// newArena returns an arena whose first blocks suit an input of n bytes: a snapshot has about one dict entry
// per 8 to 16 bytes.
func newArena(n int) *arena {
	return &arena{itemsNext: min(n/32, itemBlock/2), idsNext: min(n/32, idBlock/2)}
}

func (a *arena) newDict() *Dict {
	b := a.nDict / arenaBlock
	if int(b) == len(a.dicts) {
		a.dicts = append(a.dicts, make([]Dict, arenaBlock))
	}
	m := &a.dicts[b][a.nDict%arenaBlock]
	m.id, m.depth = a.nDict, 1
	a.nDict++
	return m
}

func (a *arena) newList() *List {
	if len(a.lists) == 0 {
		a.lists = make([]List, min(max(int(a.nList), 8), listBlock))
	}
	l := &a.lists[0]
	a.lists = a.lists[1:]
	l.id, l.depth, l.arena = a.nList, 1, a
	a.nList++
	return l
}

// dict returns the dict with the given ID.
func (a *arena) dict(id uint32) *Dict { return &a.dicts[id/arenaBlock][id%arenaBlock] }

// itemSlice returns an empty slice with room for n dict entries. Its capacity is exactly n, so growing it
// later reallocates instead of running into a neighbour's entries.
func (a *arena) itemSlice(n int) []Item {
	if n > itemBlock/8 {
		return make([]Item, 0, n)
	}
	if len(a.items) < n {
		a.itemsNext = min(max(2*a.itemsNext, 16), itemBlock)
		a.items = make([]Item, max(a.itemsNext, n))
	}
	s := a.items[:0:n]
	a.items = a.items[n:]
	return s
}

// idSlice returns an empty slice with room for n dict IDs, capacity exactly n.
func (a *arena) idSlice(n int) []uint32 {
	if n > idBlock/8 {
		return make([]uint32, 0, n)
	}
	if len(a.ids) < n {
		a.idsNext = min(max(2*a.idsNext, 64), idBlock)
		a.ids = make([]uint32, max(a.idsNext, n))
	}
	s := a.ids[:0:n]
	a.ids = a.ids[n:]
	return s
}
