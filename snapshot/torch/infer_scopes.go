package torch

import (
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Frames name code, not module instances. A module is still told apart by its forward (the function and
// its file) and where its caller called it: the attention of a decoder layer is the forward called at the
// layer's line that calls it, whatever line of the attention's forward allocates, and two norms of a layer
// are two modules. And every decoder layer of a model runs the same lines, so their allocations have the
// same stacks, but a forward pass shows which layer ran: the model's forward calls its layers one after
// another from one line (its loop), and each call runs its forward's lines in order, so a call begins
// where the line of the called forward falls back. layers counts those calls.

// moduleKey is one module: its forward, and the frame of the module forward that called it (0 for the
// outermost).
type moduleKey struct {
	function, file snapshot.StringID
	caller         snapshot.FrameID
}

// scopes gives every block of inf, and every OOM's request, its scope: its module, named by the frame of
// the module's forward at the lowest line that allocated, and the layer it ran in.
func (t *trace) scopes(inf *Inference) {
	keyOf := func(ms []snapshot.FrameID) moduleKey {
		f := t.s.Frame(ms[0])
		k := moduleKey{function: f.Function, file: f.File}
		if len(ms) > 1 {
			k.caller = ms[1]
		}
		return k
	}
	name := map[moduleKey]snapshot.FrameID{} // the frame at the module's lowest line
	see := func(e *snapshot.Event) {
		if ms := t.facts(e).modules; len(ms) > 0 {
			k := keyOf(ms)
			if id, ok := name[k]; !ok || t.s.Frame(ms[0]).Line < t.s.Frame(id).Line {
				name[k] = ms[0]
			}
		}
	}
	for _, l := range t.lives {
		see(t.at(l.alloc))
	}
	var ooms []int
	for i := range t.len() {
		if e := t.at(i); e.Action == snapshot.ActionOOM {
			see(e)
			ooms = append(ooms, i)
		}
	}
	layers, oomLayers := t.layers()
	for k := range inf.Blocks {
		if ms := t.facts(t.at(inf.Blocks[k].Seq)).modules; len(ms) > 0 {
			inf.Blocks[k].Scope = Scope{Module: name[keyOf(ms)], Layer: layers[k]}
		}
	}
	inf.requests = map[int]Scope{}
	for _, i := range ooms {
		if ms := t.facts(t.at(i)).modules; len(ms) > 0 {
			layer, ok := oomLayers[i]
			if !ok {
				layer = noLayer
			}
			inf.requests[i] = Scope{Module: name[keyOf(ms)], Layer: layer}
		}
	}
}

// noLayer is the layer of an allocation no repeated module's call holds.
const noLayer = -1

// layers returns, for every block (in the order of t.lives), the index of the repeated module's call its
// forward allocation ran in, counted from 0 in its forward pass, and the same for the trace's OOM events;
// noLayer where the frames show none. The repeated module is the outermost one called more than once from
// the same line of its caller in one pass (a model's layers, not a layer's heads); a pass is a run of
// allocations in forward (or evaluation) that a new call of the outermost module also ends. A checkpoint's
// recompute runs the layers in backward's order, and is not numbered.
func (t *trace) layers() (blocks []int32, ooms map[int]int32) {
	blocks = make([]int32, len(t.lives))
	for i := range blocks {
		blocks[i] = noLayer
	}
	ooms = map[int]int32{}
	var pass []int            // the events of the pass: allocations, and OOMs' requests
	var root snapshot.FrameID // the outermost module frame of the pass's last item
	flush := func() {
		t.numberLayers(pass, blocks, ooms)
		pass = pass[:0]
		root = 0
	}
	for i := range t.len() {
		e := t.at(i)
		alloc := e.Action == snapshot.ActionAlloc
		if !alloc && e.Action != snapshot.ActionOOM || t.reconstructed(e) {
			continue
		}
		if e.Phase != snapshot.PhaseForward && e.Phase != snapshot.PhaseEval {
			if alloc {
				flush()
			}
			continue
		}
		ms := t.facts(e).modules
		if len(ms) < 2 {
			continue
		}
		// A new call of the outermost module (a second forward of the model) begins a new pass.
		if r := ms[len(ms)-1]; root != 0 && t.fallsBack(root, r) {
			flush()
		}
		root = ms[len(ms)-1]
		pass = append(pass, i)
	}
	flush()
	return blocks, ooms
}

// fallsBack reports whether frame b is in the same function as frame a, at an earlier line: the function
// was called again.
func (t *trace) fallsBack(a, b snapshot.FrameID) bool {
	fa, fb := t.s.Frame(a), t.s.Frame(b)
	return fa.Function == fb.Function && fa.File == fb.File && fb.Line < fa.Line
}

// numberLayers numbers the items of one pass: for each caller frame (a module forward at one line) it counts
// the calls of the module forward it calls, a new call where that forward's line falls back; the
// outermost caller with more than one call numbers the items under it.
func (t *trace) numberLayers(pass []int, blocks []int32, ooms map[int]int32) {
	if len(pass) == 0 {
		return
	}
	calls := t.countCalls(pass, nil)
	t.countCalls(pass, func(ev int, running []int32) {
		ms := t.facts(t.at(ev)).modules
		for level := len(ms) - 1; level >= 1; level-- {
			if calls[ms[level]] == 0 {
				continue
			}
			if t.at(ev).Action == snapshot.ActionOOM {
				ooms[ev] = running[level]
			} else if b, ok := slices.BinarySearchFunc(t.lives, ev, func(l lifetime, ev int) int { return l.alloc - ev }); ok {
				blocks[b] = running[level]
			}
			return
		}
	})
}

// countCalls walks a pass counting, for each caller frame, the calls of the module it calls after the
// first; f, when not nil, sees each item with the count of each level of its modules (level i: the calls
// modules[i] made of modules[i-1]). It returns the counts at the pass's end.
func (t *trace) countCalls(pass []int, f func(ev int, running []int32)) map[snapshot.FrameID]int32 {
	type callee struct {
		last  snapshot.FrameID // the callee's frame at the last item under the caller
		calls int32
	}
	state := map[snapshot.FrameID]*callee{}
	var running []int32
	for _, ev := range pass {
		ms := t.facts(t.at(ev)).modules
		running = slices.Grow(running[:0], len(ms))[:len(ms)]
		clear(running)
		for level := 1; level < len(ms); level++ {
			caller, child := ms[level], ms[level-1]
			c := state[caller]
			switch {
			case c == nil:
				c = &callee{}
				state[caller] = c
			case t.fallsBack(c.last, child):
				c.calls++
			}
			c.last = child
			running[level] = c.calls
		}
		if f != nil {
			f(ev, running)
		}
	}
	out := make(map[snapshot.FrameID]int32, len(state))
	for k, c := range state {
		out[k] = c.calls
	}
	return out
}
