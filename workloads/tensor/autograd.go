package tensor

import (
	"container/heap"
	"errors"
	"math"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Node is a backward function of the autograd graph (PyTorch's grad_fn): it holds what its op saved for
// backward and turns the gradients of the op's outputs into gradients of its inputs.
type Node struct {
	rt    *Runtime
	name  string // PyTorch's class name, e.g. "AddmmBackward0"
	scope string // the module the op ran in
	seq   uint64 // creation order; backward runs the newest ready node first
	next  []edge // one per input: where the input's gradient goes
	saved []*Tensor
	kept  []*Tensor // references the node holds that are not saved tensors (ctx attributes, a leaf)
	// attrs are ctx attributes a custom Function sets that its backward does not clear: the engine releases
	// saved tensors after a node runs, but an attribute goes only with the node, when the graph is freed.
	attrs []*Tensor
	outs  int // number of outputs
	apply backwardFunc
	leaf  *object // for AccumulateGrad: the leaf it accumulates into
	freed bool    // the saved tensors were released by a backward without retain_graph
	// refs counts what keeps the node alive: tensors whose grad_fn it is and nodes with an edge to it.
	// At zero the node goes, releasing what it saved, as a PyTorch Node's refcount does.
	refs int
}

// edge connects an input of a node to the node that takes its gradient, and which of that node's outputs the
// input was.
type edge struct {
	node  *Node
	nr    int
	dtype DType // the input's dtype: its gradient is converted to it
}

// backwardFunc computes the input gradients from the output gradients. grads[i] may be nil for an output
// that got no gradient; needs[i] says whether input i needs one. It returns one gradient per input (nil where
// not needed) and must not release grads.
type backwardFunc func(n *Node, grads []*Tensor, needs []bool) []*Tensor

// Name returns the node's PyTorch name, e.g. "AddmmBackward0".
func (n *Node) Name() string { return n.name }

// Scope returns the module the node's op ran in.
func (n *Node) Scope() string { return n.scope }

// Describe names the node for people and heap dumps: "AddmmBackward0[blocks.3.mlp.c_fc]".
func (n *Node) Describe() string {
	if n.scope == "" {
		return n.name
	}
	return n.name + "[" + n.scope + "]"
}

// Next returns the nodes the node passes gradients to (nil for inputs that need none).
func (n *Node) Next() []*Node {
	out := make([]*Node, len(n.next))
	for i, e := range n.next {
		out[i] = e.node
	}
	return out
}

// Saved returns the tensors the node holds for backward (nil after they were freed).
func (n *Node) Saved() []*Tensor { return n.saved }

// needsGrad reports whether an op on inputs must record a node.
func (rt *Runtime) needsGrad(inputs ...*Tensor) bool {
	if !rt.gradEnabled {
		return false
	}
	for _, t := range inputs {
		if t != nil && t.requiresGrad {
			return true
		}
	}
	return false
}

// node creates the backward node of an op on inputs and makes it the grad_fn of outputs. Call it only when
// needsGrad(inputs...) holds.
func (rt *Runtime) node(name string, inputs []*Tensor, outputs []*Tensor, apply backwardFunc) *Node {
	rt.seq++
	n := &Node{rt: rt, name: name, scope: rt.scope(), seq: rt.seq, outs: len(outputs), apply: apply}
	n.next = make([]edge, len(inputs))
	for i, in := range inputs {
		if in != nil && in.requiresGrad {
			n.next[i] = in.gradEdge()
			acc := n.next[i].node
			acc.refs++
			if acc.leaf != nil && acc.leaf.name == "" && len(acc.kept) == 0 {
				// AccumulateGrad holds its variable: a leaf nothing names (an input made to require grad)
				// lives, with its .grad, as long as the graph does. A parameter is alive anyway.
				acc.hold("variable", in)
			}
		}
	}
	for i, out := range outputs {
		old := out.gradFn // an in-place op rebases its output's history onto the new node
		out.requiresGrad, out.gradFn, out.outputNr = true, n, i
		n.refs++
		if old != nil {
			old.unref()
		}
	}
	return n
}

// unref drops one reference to n; a node nobody references releases what it saved and its references to
// the nodes it feeds, transitively.
func (n *Node) unref() {
	stack := []*Node{n}
	for len(stack) > 0 {
		m := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if m.refs--; m.refs > 0 {
			continue
		}
		if m.leaf != nil { // a leaf holds its AccumulateGrad weakly: the next graph makes a new one
			if m.leaf.accumulate == m {
				m.leaf.accumulate = nil
			}
			m.releaseSaved()
			continue
		}
		if !m.freed {
			m.releaseSaved()
		}
		releaseAll(m.attrs)
		m.attrs = nil
		for _, e := range m.next {
			if e.node != nil {
				stack = append(stack, e.node)
			}
		}
	}
}

// gradEdge returns where a gradient for t goes: its grad_fn, or its leaf's AccumulateGrad node.
func (t *Tensor) gradEdge() edge {
	if t.gradFn != nil {
		return edge{t.gradFn, t.outputNr, t.dtype}
	}
	if t.accumulate == nil {
		t.accumulate = &Node{rt: t.rt, name: "AccumulateGrad", seq: math.MaxUint64, outs: 1, leaf: t.object,
			apply: accumulateGrad}
	}
	return edge{t.accumulate, 0, t.dtype}
}

// save keeps a reference to t for backward, as the slot-th thing the node saved (e.g. "input"). A temporary
// saved by autograd becomes an activation; that is recorded as it happens.
func (n *Node) save(slot string, t *Tensor) *Tensor {
	if o := n.rt.offload; o != nil && o.packing {
		if s := o.pack(n, slot, t); s != nil {
			return s
		}
	}
	return n.saveOnDevice(slot, t)
}

// saveOnDevice is save without the saved-tensor hooks: the tensor stays where it is.
func (n *Node) saveOnDevice(slot string, t *Tensor) *Tensor {
	// An output saved by its own node is kept as a new tensor on the same storage, without the grad_fn, as
	// SavedVariable does: the node must not keep itself alive.
	var s *Tensor
	if t.gradFn == n {
		s = t.Detach()
	} else {
		s = t.Ref()
	}
	s.owner = owner{node: n, slot: slot}
	n.saved = append(n.saved, s)
	if s.st.category == snapshot.CategoryTemporary {
		s.st.setCategory(snapshot.CategoryActivation)
	}
	return s
}

// saveCrossed saves what a product's backward reads: a (as aSlot) only when b requires grad, since only b's
// gradient reads it, and b (as bSlot) only when a does, as derivatives.yaml's mul, mm and bmm save them.
func (n *Node) saveCrossed(a *Tensor, aSlot string, b *Tensor, bSlot string) (sa, sb *Tensor) {
	if b.requiresGrad {
		sa = n.save(aSlot, a)
	}
	if a.requiresGrad {
		sb = n.save(bSlot, b)
	}
	return sa, sb
}

// hold keeps a reference to t that is not a saved tensor: ctx attributes of a custom function, the variable
// of an AccumulateGrad. It goes with the saved tensors.
func (n *Node) hold(slot string, t *Tensor) {
	k := t.Ref()
	k.owner = owner{node: n, slot: slot, kept: true}
	n.kept = append(n.kept, k)
}

// keepAttr keeps t as a ctx attribute (ctx.tensors = (A, B) of a custom Function): not a saved tensor, and
// not released after the node's backward either, but with the node, when nothing references it.
func (n *Node) keepAttr(slot string, t *Tensor) {
	k := t.Ref()
	k.owner = owner{node: n, slot: slot, kept: true}
	n.attrs = append(n.attrs, k)
}

// releaseSaved frees what the node saved and holds.
func (n *Node) releaseSaved() {
	for _, s := range n.saved {
		s.Release()
	}
	for _, k := range n.kept {
		k.Release()
	}
	n.saved, n.kept = nil, nil
	n.freed = true
}

// ErrBackwardTwice is PyTorch's error for a second backward through a graph whose saved tensors were freed.
//
//lint:ignore ST1005 PyTorch's message, verbatim
var ErrBackwardTwice = errors.New("Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if you need to access saved tensors after calling backward.")

// Backward computes the gradient of the scalar t with respect to every leaf that requires one and accumulates
// it into their .grad (loss.backward()). Unless retainGraph, each node's saved tensors are freed as soon as the
// node has run. It panics with ErrBackwardTwice on a graph already freed, like PyTorch raises.
func (t *Tensor) Backward(retainGraph bool) {
	t.check()
	if t.Numel() != 1 {
		errShape("Backward", "grad can be implicitly created only for scalar outputs, not shape %v", t.shape)
	}
	if !t.requiresGrad {
		errShape("Backward", "element 0 of tensors does not require grad and does not have a grad_fn")
	}
	rt := t.rt
	defer rt.enterBackward()()

	// torch.ones_like(loss): the seed gradient is a real allocation.
	seed := rt.Full(t.dtype, t.shape, 1, "grad.seed", snapshot.CategoryAutogradDetail)
	rt.runBackward(t.gradEdge(), seed, retainGraph)
}

// enterBackward puts rt in the backward pass, which runs with grad mode off (no create_graph: the gradient
// math records no graph) and names its allocations autograd_detail; the returned function leaves it.
func (rt *Runtime) enterBackward() (leave func()) {
	prevCat := rt.SetCategory(snapshot.CategoryAutogradDetail)
	prevGrad := rt.SetGradEnabled(false)
	prevBackward := rt.inBackward
	rt.inBackward = true
	return func() { rt.SetCategory(prevCat); rt.SetGradEnabled(prevGrad); rt.inBackward = prevBackward }
}

// runBackward runs the graph from root with gradient g, in PyTorch's engine order: a node runs once every
// gradient for it has arrived, and among ready nodes the newest (highest sequence number) runs first, with
// AccumulateGrad before anything else.
func (rt *Runtime) runBackward(root edge, g *Tensor, retainGraph bool) {
	rt.runBackwardFrom([]edge{root}, []*Tensor{g}, retainGraph)
}

// runBackwardFrom runs the graph from several roots at once, each with its gradient (nil: none), as
// torch.autograd.backward(outputs, grads) does: a root another root reaches runs once the gradients from
// both have arrived.
func (rt *Runtime) runBackwardFrom(roots []edge, gs []*Tensor, retainGraph bool) {
	rt.backwardDepth++
	deps := map[*Node]int{}
	var stack []*Node
	seen := map[*Node]bool{}
	for i, r := range roots {
		if gs[i] != nil && !seen[r.node] {
			seen[r.node] = true
			stack = append(stack, r.node)
		}
	}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, e := range n.next {
			if e.node == nil {
				continue
			}
			deps[e.node]++
			if !seen[e.node] {
				seen[e.node] = true
				stack = append(stack, e.node)
			}
		}
	}

	buffers := map[*Node][]*Tensor{}
	ready := &readyQueue{}
	for i, r := range roots {
		if gs[i] != nil {
			rt.accumulateInto(buffers, r, gs[i])
		}
	}
	queued := map[*Node]bool{}
	for i, r := range roots {
		if gs[i] != nil && deps[r.node] == 0 && !queued[r.node] {
			queued[r.node] = true
			heap.Push(ready, r.node)
		}
	}
	for ready.Len() > 0 {
		n := heap.Pop(ready).(*Node)
		grads := buffers[n]
		delete(buffers, n)
		if n.freed {
			panic(ErrBackwardTwice)
		}
		needs := make([]bool, len(n.next))
		for i, e := range n.next {
			needs[i] = e.node != nil
		}
		if rt.offload != nil {
			rt.offload.unpack(n)
		}
		inGrads := n.run(grads, needs)
		if rt.offload != nil {
			rt.offload.afterNode(n)
		}
		for _, gr := range grads {
			gr.Release()
		}
		if !retainGraph && n.leaf == nil {
			n.releaseSaved()
		}
		for i, e := range n.next {
			var gi *Tensor
			if i < len(inGrads) {
				gi = inGrads[i]
			}
			if e.node == nil {
				gi.Release()
				continue
			}
			if gi != nil {
				rt.accumulateInto(buffers, e, castGrad(gi, e.dtype))
			}
			if deps[e.node]--; deps[e.node] == 0 {
				if buffers[e.node] != nil {
					heap.Push(ready, e.node)
				}
			}
		}
	}
	if rt.backwardDepth--; rt.backwardDepth == 0 && rt.offload != nil {
		rt.offload.endBackward() // the callback queued on the engine: what backward brought back goes
	}
}

// run applies the node, with its module scope entered so its allocations carry it.
func (n *Node) run(grads []*Tensor, needs []bool) []*Tensor {
	if len(grads) < n.outs {
		grads = append(grads, make([]*Tensor, n.outs-len(grads))...)
	}
	leave := n.rt.Scope(n.scope)
	defer leave()
	return n.apply(n, grads, needs)
}

// accumulateInto adds g to the gradient waiting for e's node, as PyTorch's InputBuffer does: the first
// gradient is kept as is; a second is added in place into one the buffer alone holds, else into a new tensor.
func (rt *Runtime) accumulateInto(buffers map[*Node][]*Tensor, e edge, g *Tensor) {
	buf := buffers[e.node]
	if buf == nil {
		buf = make([]*Tensor, e.node.outs)
		buffers[e.node] = buf
	}
	old := buf[e.nr]
	switch {
	case old == nil:
		buf[e.nr] = g
	case old.exclusive():
		addInPlace(old, g)
		g.Release()
	case g.exclusive():
		addInPlace(g, old)
		old.Release()
		buf[e.nr] = g
	default:
		sum := rt.addNoGrad(old, g, "grad.sum")
		old.Release()
		g.Release()
		buf[e.nr] = sum
	}
}

// exclusive reports whether this reference is the only holder of its values, so they may change in place.
func (t *Tensor) exclusive() bool { return t.refs == 1 && t.st.refs == 1 && t.IsContiguous() }

// accumulateGrad is AccumulateGrad's backward: the first gradient of a leaf is stolen when nothing else holds
// it (no copy), else cloned; later ones are added in place (gradient accumulation across micro-batches).
func accumulateGrad(n *Node, grads []*Tensor, _ []bool) []*Tensor {
	leaf, g := n.leaf, grads[0]
	if g == nil {
		return nil
	}
	rt := n.rt
	switch {
	case leaf.grad == nil && g.exclusive():
		if leaf.name != "" { // a parameter's gradient; a checkpoint's detached input keeps autograd_detail
			g.st.setCategory(snapshot.CategoryGradient)
		}
		leaf.grad = g.Ref()
		leaf.grad.owner = owner{gradOf: leaf}
	case leaf.grad == nil:
		cat := snapshot.CategoryGradient
		if leaf.name == "" {
			cat = rt.category
		}
		c := rt.cloneAs(g, "grad", cat)
		c.owner = owner{gradOf: leaf}
		leaf.grad = c
	default:
		addInPlace(leaf.grad, g)
	}
	for _, h := range leaf.gradHooks {
		h()
	}
	return nil
}

// readyQueue orders ready nodes newest first.
type readyQueue []*Node

func (q readyQueue) Len() int           { return len(q) }
func (q readyQueue) Less(i, j int) bool { return q[i].seq > q[j].seq }
func (q readyQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *readyQueue) Push(x any)        { *q = append(*q, x.(*Node)) }
func (q *readyQueue) Pop() any {
	old := *q
	n := old[len(old)-1]
	*q = old[:len(old)-1]
	return n
}
