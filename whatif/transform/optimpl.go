package transform

import (
	"fmt"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
)

// OptimizerImpl moves an Adam or AdamW step from torch.optim's foreach implementation (_multi_tensor_adam:
// each temporary made for all parameters at once) to the for-loop one (_single_tensor_adam, foreach=False:
// one parameter at a time). The parameters are read off the state the first step made, two blocks of a
// parameter's size each, in parameter order; the recorded step's temporaries (a square root of exp_avg_sq
// per parameter, and with Adam's L2 weight decay a decayed gradient per parameter) are replaced, where the
// step made its first, by the loop's: for each parameter, the decayed gradient (kept until the next
// parameter's), the square root and the denominator made from it, the root released at once and the
// denominator when the next one is made.
func OptimizerImpl(impl knob.OptimizerImpl) Transform {
	name := "optimizer-impl " + string(impl)
	return Transform{Name: name, apply: func(t *trace) (*trace, string, error) {
		if impl != knob.ForLoop && impl != knob.Foreach {
			return nil, "", fmt.Errorf("%s: only foreach and for-loop are modelled", name)
		}
		if err := t.requireTags(name, true, true); err != nil {
			return nil, "", err
		}
		return optimizerImpl(t, impl, name)
	}}
}

// adamStep is one optimizer step of a trace: where it begins and its temporaries.
type adamStep struct {
	start int      // its phase marker
	temps []uint64 // its temporaries, in order of allocation
	most  int      // the most of them alive at once
}

func optimizerImpl(t *trace, impl knob.OptimizerImpl, name string) (*trace, string, error) {
	bs := t.index()
	var steps []*adamStep
	var params []*snapshot.Event // the first of each parameter's two state blocks
	var states []*snapshot.Event
	var cur *adamStep
	live := 0
	for i := range t.events {
		e := &t.events[i]
		switch {
		case e.Action == snapshot.ActionPhase:
			cur = nil
			if e.Phase == snapshot.PhaseOptimizer {
				cur = &adamStep{start: i}
				steps = append(steps, cur)
				live = 0
			}
		case cur == nil:
		case e.Action == snapshot.ActionAlloc && bs[e.Addr].has(snapshot.CategoryOptimizerState):
			states = append(states, e)
		case e.Action == snapshot.ActionAlloc && isStepTemporary(e, bs[e.Addr]):
			cur.temps = append(cur.temps, e.Addr)
			live++
			cur.most = max(cur.most, live)
		case e.Action == snapshot.ActionFreeRequested && bs[e.Addr] != nil && isStepTemporary(&t.events[bs[e.Addr].alloc], bs[e.Addr]):
			live--
		}
	}
	if len(steps) == 0 {
		return nil, "", &MissingTagsError{name, "optimizer phase"}
	}
	for k := 0; k+1 < len(states); k += 2 {
		if states[k].Size != states[k+1].Size {
			return nil, "", fmt.Errorf("%s: the recording's optimizer state does not come in pairs of a parameter's "+
				"size (exp_avg, exp_avg_sq): only Adam and AdamW are modelled", name)
		}
		params = append(params, states[k])
	}
	if len(params) == 0 || len(states)%2 != 0 {
		return nil, "", fmt.Errorf("%s: the recording's optimizer keeps no Adam state (two blocks of each "+
			"parameter's size): only Adam and AdamW are modelled", name)
	}
	first := steps[0]
	perParam := len(first.temps) / len(params)
	// foreach makes one temporary per parameter (two with Adam's L2 decay), each kind alive for all
	// parameters together; the loop makes two (three), at most three (four) alive at once.
	recorded := knob.Foreach
	switch {
	case perParam == 3, perParam == 2 && first.most <= 3 && first.most != len(params):
		recorded = knob.ForLoop
	}
	if recorded == impl {
		return t, fmt.Sprintf("%s: the recording's step already runs %s (at most %d temporaries alive at once): "+
			"nothing changes", name, impl, first.most), nil
	}
	if impl == knob.Foreach {
		return nil, "", fmt.Errorf("%s: the recording's step runs for-loop; moving it to foreach is not modelled: "+
			"record with foreach (PyTorch's default on CUDA) instead", name)
	}
	if perParam < 1 || perParam > 2 || len(first.temps)%len(params) != 0 {
		return nil, "", fmt.Errorf("%s: the recording's step makes %d temporaries for %d parameters; foreach Adam "+
			"makes one or two per parameter: not modelled", name, len(first.temps), len(params))
	}
	decayed := perParam == 2

	drop := map[uint64]bool{}
	at := map[int]*adamStep{} // the index of each step's first temporary
	var tempBytes int64
	var kept int // steps whose temporaries are not the first step's: left as recorded
	for _, s := range steps {
		if len(s.temps) != len(first.temps) {
			kept++
			continue
		}
		for _, a := range s.temps {
			drop[a] = true
			tempBytes += bs[a].size
		}
		at[bs[s.temps[0]].alloc] = s
	}
	out := t.derive(len(t.events) + 4*len(params)*len(at))
	var made int
	for i := range t.events {
		e := t.events[i]
		if s := at[i]; s != nil {
			made += out.forLoop(&e, params, decayed)
		}
		if dropped(&e, drop) {
			continue
		}
		out.events = append(out.events, e)
	}
	what := "a square root and a denominator"
	if decayed {
		what = "a decayed gradient (Adam's L2 weight decay), a square root and a denominator"
	}
	line := fmt.Sprintf("%s: the %d foreach temporaries of %d steps (%s requested, up to %d alive at once) become "+
		"%d made one parameter at a time (%s per parameter, %d parameters read off the Adam state)", name,
		len(drop), len(steps)-kept, units.FormatSize(tempBytes), first.most, made, what, len(params))
	if kept > 0 {
		line += fmt.Sprintf("; %d steps whose temporaries differ from the first step's are left as recorded", kept)
	}
	return out, line, nil
}

// forLoop appends _single_tensor_adam's temporaries for params at event at, and returns how many it made:
// per parameter, grad = grad.add(param, alpha=wd) when decayed (the previous one released first, as the
// loop rebinds grad), exp_avg_sq.sqrt(), its quotient by the bias correction (the root then released), and
// the previous denominator released; the last ones at the end.
func (t *trace) forLoop(at *snapshot.Event, params []*snapshot.Event, decayed bool) int {
	alloc := func(p *snapshot.Event) snapshot.Event {
		return snapshot.Event{Time: at.Time, Action: snapshot.ActionAlloc, Device: p.Device, Stream: p.Stream,
			Addr: t.fresh(), Size: p.Size, BlockSize: p.BlockSize, Phase: at.Phase, Iteration: at.Iteration,
			Category: snapshot.CategoryTemporary, Scope: at.Scope, Stack: at.Stack}
	}
	release := func(e *snapshot.Event) {
		if e != nil {
			f := freeEvents(*at, e.Addr, e.Size, e.BlockSize)
			t.events = append(t.events, f[0], f[1])
		}
	}
	var grad, denom *snapshot.Event
	made := 0
	for _, p := range params {
		if decayed {
			release(grad)
			g := alloc(p)
			t.events = append(t.events, g)
			grad = &g
			made++
		}
		root, q := alloc(p), alloc(p)
		t.events = append(t.events, root, q)
		made += 2
		release(&root)
		release(denom)
		denom = &q
	}
	release(grad)
	release(denom)
	return made
}
