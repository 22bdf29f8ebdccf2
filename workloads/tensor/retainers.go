package tensor

import (
	"cmp"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Retainer is one edge of the heap graph at a heap dump: Holder (described by Description) is held by Parent
// (0: a root, such as a parameter or a user variable) and, when Addr is not 0, keeps the block at Addr alive.
type Retainer struct {
	Holder      uint64
	Parent      uint64
	Description string
	Addr        uint64
}

// Retainers walks the heap graph from its roots and returns, for every live reference and every autograd
// node reachable from one, the holder that keeps it alive: a parameter, an optimizer slot, a gradient, a user
// variable, a node's saved slot ("AddmmBackward0[fc1] saved mat1"), or a local reference of the running code.
// Each holder appears once, under the first parent found breadth-first, so the path from any block to its
// root is a shortest one. The order is deterministic.
func (rt *Runtime) Retainers() []Retainer {
	w := retainerWalk{
		rt:    rt,
		refID: map[*Tensor]uint64{},
		objOf: map[*object]uint64{},
		node:  map[*Node]uint64{},
	}
	roots := make([]*Tensor, 0, rt.nHandles)
	for t := rt.handles; t != nil; t = t.next {
		if t.owner.node == nil && t.owner.gradOf == nil {
			roots = append(roots, t)
		}
	}
	// Named roots first (parameters, optimizer state, user variables), then locals; each in creation order.
	slices.SortFunc(roots, func(a, b *Tensor) int {
		if (a.owner.name == "") != (b.owner.name == "") {
			if a.owner.name != "" {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.id, b.id)
	})
	for _, t := range roots {
		w.visitRef(t, 0)
	}
	for len(w.queue) > 0 {
		item := w.queue[0]
		w.queue = w.queue[1:]
		item()
	}
	return w.out
}

type retainerWalk struct {
	rt    *Runtime
	next  uint64
	refID map[*Tensor]uint64
	objOf map[*object]uint64 // the first reference holder seen for an object
	node  map[*Node]uint64
	queue []func()
	out   []Retainer
}

func (w *retainerWalk) id() uint64 { w.next++; return w.next }

// visitRef records reference t held by parent, then queues what the reference's object holds: its gradient
// and its autograd history.
func (w *retainerWalk) visitRef(t *Tensor, parent uint64) {
	if _, seen := w.refID[t]; seen {
		return
	}
	id := w.id()
	w.refID[t] = id
	addr := t.st.addr
	if t.st.managed { // not a block of the caching allocator
		addr = 0
	}
	w.out = append(w.out, Retainer{Holder: id, Parent: parent, Description: t.holderName(), Addr: addr})
	if _, seen := w.objOf[t.object]; seen {
		return
	}
	w.objOf[t.object] = id
	o := t.object
	w.queue = append(w.queue, func() {
		if o.grad != nil {
			w.visitRef(o.grad, id)
		}
		if o.gradFn != nil {
			w.visitNode(o.gradFn, id)
		}
	})
}

// visitNode records autograd node n held by parent, then queues its saved tensors and the nodes it feeds.
func (w *retainerWalk) visitNode(n *Node, parent uint64) {
	if _, seen := w.node[n]; seen {
		return
	}
	id := w.id()
	w.node[n] = id
	w.out = append(w.out, Retainer{Holder: id, Parent: parent, Description: n.Describe()})
	w.queue = append(w.queue, func() {
		for _, s := range n.saved {
			if s != nil { // taken back by a selective recompute
				w.visitRef(s, id)
			}
		}
		for _, k := range n.kept {
			w.visitRef(k, id)
		}
		for _, a := range n.attrs { // ctx attributes: they live as long as the node does
			w.visitRef(a, id)
		}
		for _, e := range n.next {
			// AccumulateGrad holds only its leaf: a parameter, already a root, or an input it keeps alive.
			if e.node != nil && (e.node.leaf == nil || len(e.node.kept) > 0) {
				w.visitNode(e.node, id)
			}
		}
	})
}

// holderName describes who holds a reference.
func (t *Tensor) holderName() string {
	switch {
	case t.owner.node != nil && t.owner.kept:
		return t.owner.node.Describe() + " holds " + t.owner.slot
	case t.owner.node != nil:
		return t.owner.node.Describe() + " saved " + t.owner.slot
	case t.owner.gradOf != nil && t.owner.gradOf.name != "":
		return t.owner.gradOf.name + ".grad"
	case t.owner.gradOf != nil:
		return "grad of " + t.owner.gradOf.describe()
	case t.owner.name != "":
		return t.owner.name
	}
	return "local " + t.describe()
}

// SavedTensor is one block autograd keeps for backward.
type SavedTensor struct {
	Label    string
	Bytes    uint64 // the storage's bytes (elements x element size)
	Category string
	Holders  []string // the saved slots holding it, e.g. "AddmmBackward0[net.0] saved mat1"
}

// SavedTensors returns the distinct storages live autograd nodes hold for backward, other than parameters
// (which are kept anyway), in creation order: what torch.autograd.graph.saved_tensors_hooks would see,
// counted once per storage.
func (rt *Runtime) SavedTensors() []SavedTensor {
	refs := make([]*Tensor, 0)
	for t := rt.handles; t != nil; t = t.next {
		if t.owner.node != nil && !t.owner.kept && t.st.category != snapshot.CategoryParameter && t.st.bytes > 0 &&
			t.st.offload == nil { // an offloaded one is in host memory
			refs = append(refs, t)
		}
	}
	slices.SortFunc(refs, func(a, b *Tensor) int { return cmp.Compare(a.id, b.id) })
	index := map[*storage]int{}
	var out []SavedTensor
	for _, t := range refs {
		i, ok := index[t.st]
		if !ok {
			i = len(out)
			index[t.st] = i
			out = append(out, SavedTensor{Label: t.st.labelText(), Bytes: t.st.bytes, Category: t.st.category.String()})
		}
		out[i].Holders = append(out[i].Holders, t.holderName())
	}
	return out
}

// HeldTensors lists the storages autograd nodes hold in the slot named slot and nowhere else a node saves
// them (ctx attributes such as MatMul4Bit's "ctx.tensors": what holding them adds), once per storage,
// parameters left out.
func (rt *Runtime) HeldTensors(slot string) []SavedTensor {
	saved := map[*storage]bool{}
	for t := rt.handles; t != nil; t = t.next {
		if t.owner.node != nil && !t.owner.kept {
			saved[t.st] = true
		}
	}
	index := map[*storage]int{}
	var out []SavedTensor
	for t := rt.handles; t != nil; t = t.next {
		if t.owner.node == nil || !t.owner.kept || t.owner.slot != slot || t.st.category == snapshot.CategoryParameter || saved[t.st] {
			continue
		}
		i, ok := index[t.st]
		if !ok {
			i = len(out)
			index[t.st] = i
			out = append(out, SavedTensor{Label: t.st.labelText(), Bytes: t.st.bytes, Category: t.st.category.String()})
		}
		out[i].Holders = append(out[i].Holders, t.holderName())
	}
	return out
}
