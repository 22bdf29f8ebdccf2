package timeline

import "github.com/oomdbg/oomdbg/snapshot"

// Retainer paths: who keeps a block alive, as the nearest heap dump recorded it.

// Retainer is one holder on a retainer path.
type Retainer struct {
	Seq         int // the retain event
	Holder      uint64
	Parent      uint64 // 0 for a root
	Description string // e.g. "AddmmBackward0[net.2] saved mat1", "loss_history[7]"
}

// RetainerPath is the chain of holders that kept a block alive at a heap dump: Holders[0] holds the block,
// each next one holds the one before, and the last is a root (a parameter, an optimizer, a user variable).
type RetainerPath struct {
	Dump    HeapDump
	Holders []Retainer
}

// Root returns the root holder's description, "" for an empty path.
func (p *RetainerPath) Root() string {
	if len(p.Holders) == 0 {
		return ""
	}
	return p.Holders[len(p.Holders)-1].Description
}

// maxRetainerDepth caps a path, against cycles in a hostile file.
const maxRetainerDepth = 256

// RetainerPath returns who retained block b at the heap dump nearest to event at among those taken while b
// was allocated, and whether one recorded it. Heap dumps list holders breadth-first from the roots, so the
// first holder of the block a dump names gives a shortest path.
func (t *Timeline) RetainerPath(b Allocation, at int) (RetainerPath, bool) {
	best := NearestDump(t.dumps, b, at)
	if best < 0 {
		return RetainerPath{}, false
	}
	d := t.dumps[best]
	return WalkRetainers(t.s, d, t.s.Events.Slice(d.Seq+1, d.Seq+1+d.Edges), b)
}

// NearestDump returns the index in dumps of the heap dump nearest to event at among those taken while b was
// allocated, or -1.
func NearestDump(dumps []HeapDump, b Allocation, at int) int {
	best, dist := -1, 0
	for i, d := range dumps {
		if d.Seq < b.Alloc || b.Free >= 0 && d.Seq >= b.Free {
			continue
		}
		dd := d.Seq - at
		if dd < 0 {
			dd = -dd
		}
		if best < 0 || dd < dist {
			best, dist = i, dd
		}
	}
	return best
}

// WalkRetainers returns the path of holders that dump d (its retain events are edges; s names them) records
// from block b to a root, and whether d names b.
func WalkRetainers(s *snapshot.Snapshot, d HeapDump, edges []snapshot.Event, b Allocation) (RetainerPath, bool) {
	start := -1
	for i := range edges {
		if edges[i].Addr == b.Addr && edges[i].Device == b.Device && b.Addr != 0 {
			start = i
			break
		}
	}
	if start < 0 {
		return RetainerPath{Dump: d}, false
	}
	// Holders are numbered from 1 in walk order; look a parent up by its number first, by a scan if not.
	find := func(holder uint64) int {
		if i := int(holder) - 1; holder > 0 && i < len(edges) && edges[i].Holder == holder {
			return i
		}
		for i := range edges {
			if edges[i].Holder == holder {
				return i
			}
		}
		return -1
	}
	p := RetainerPath{Dump: d}
	for i := start; i >= 0 && len(p.Holders) < maxRetainerDepth; {
		e := &edges[i]
		p.Holders = append(p.Holders, Retainer{Seq: d.Seq + 1 + i, Holder: e.Holder, Parent: e.Parent, Description: s.String(e.Text)})
		if e.Parent == 0 {
			break
		}
		i = find(e.Parent)
	}
	return p, true
}
