package transform

import (
	"fmt"
	"slices"

	"github.com/oomdbg/oomdbg/internal/optimrules"
	"github.com/oomdbg/oomdbg/internal/torchrules"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
)

// SwitchOptimizer moves the trace to optimizer o. The recorded optimizer is read off the trace: its
// optimizer_state blocks per gradient alive at the first optimizer step (2 or more: Adam-like, 1: momentum,
// 0: SGD). State is removed down to o's count per gradient (one gradient-sized buffer kept per gradient for
// momentum), or added at the first optimizer step, one gradient-sized buffer per state and gradient. The
// optimizer step's temporaries (Adam's foreach lists) are removed when moving to SGD or momentum, whose
// foreach steps without weight decay work in place; when moving to Adam they are not added, so its step's
// peak is a lower bound.
func SwitchOptimizer(o knob.Optimizer) Transform {
	name := "optimizer " + string(o)
	return Transform{Name: name, apply: func(t *trace) (*trace, string, error) {
		if err := CheckOptimizer(o); err != nil {
			return nil, "", err
		}
		if err := t.requireTags(name, true, true); err != nil {
			return nil, "", err
		}
		return switchOptimizer(t, o, name)
	}}
}

// CheckOptimizer says whether a trace can be moved to optimizer o: a paged optimizer's state lives in CUDA
// unified memory, outside the caching allocator, where a replay cannot place it.
func CheckOptimizer(o knob.Optimizer) error {
	if _, err := knob.ParseOptimizer(string(o)); err != nil {
		return err
	}
	if o.Paged() {
		return fmt.Errorf("optimizer %s: a paged optimizer's state lives in unified memory, outside the caching "+
			"allocator a trace is replayed through (want sgd, momentum, adam, adamw or adamw8bit)", o)
	}
	return nil
}

func switchOptimizer(t *trace, o knob.Optimizer, name string) (*trace, string, error) {
	start := t.firstStep()
	if start < 0 {
		return nil, "", &MissingTagsError{name, "optimizer phase"}
	}
	bs := t.index()
	r := t.readOptimizer(bs, start)
	if len(r.grads) == 0 {
		return nil, "", &MissingTagsError{name, "gradient category"}
	}
	switch {
	case r.kind == o:
		return t, r.unchanged(name), nil
	case r.kind == knob.AdamW8bit:
		return nil, "", fmt.Errorf("%s: the recording's optimizer keeps 8-bit state; moving from it is not modelled: "+
			"record with the optimizer instead", name)
	case o == knob.AdamW8bit:
		return to8bit(t, bs, r, name)
	case r.kind.States() == o.States():
		return t, r.unchanged(name), nil
	case o.States() > r.kind.States():
		return addStates(t, bs, r, o.States()-r.kind.States(), name)
	}
	return dropStates(t, bs, r, o.States(), name)
}

// firstStep returns the index of the first optimizer phase marker, or -1.
func (t *trace) firstStep() int {
	for i := range t.events {
		if e := &t.events[i]; e.Action == snapshot.ActionPhase && e.Phase == snapshot.PhaseOptimizer {
			return i
		}
	}
	return -1
}

// recordedOptimizer is the optimizer a trace recorded, read off its state at the first optimizer step.
type recordedOptimizer struct {
	start      int      // the first optimizer phase marker
	grads      []uint64 // the gradients alive at the first step, in order of allocation
	states     []uint64 // the optimizer state blocks, in order of allocation
	stateBytes int64
	kind       knob.Optimizer // SGD, Momentum, AdamW (any Adam-like) or AdamW8bit
	name       string         // kind in words
}

// readOptimizer reads the recorded optimizer off its state blocks per gradient alive at the first step
// (start): 2 or more: Adam-like (8-bit when they take under 4 bytes an element), 1: momentum, 0: SGD.
func (t *trace) readOptimizer(bs map[uint64]*block, start int) recordedOptimizer {
	r := recordedOptimizer{start: start, kind: knob.SGD}
	for i := 0; i < start; i++ {
		e := &t.events[i]
		if e.Action != snapshot.ActionAlloc {
			continue
		}
		if b := bs[e.Addr]; b.gradAt >= 0 && b.gradAt < start && (b.free < 0 || b.free > start) {
			r.grads = append(r.grads, e.Addr)
		}
	}
	if len(r.grads) == 0 {
		return r
	}
	for i := range t.events {
		e := &t.events[i]
		if e.Action == snapshot.ActionAlloc && bs[e.Addr].has(snapshot.CategoryOptimizerState) {
			r.states = append(r.states, e.Addr)
			r.stateBytes += e.Size
		}
	}
	perGrad := float64(len(r.states)) / float64(len(r.grads))
	switch {
	case perGrad >= 1.5:
		r.kind = knob.AdamW
	case perGrad >= 0.5:
		r.kind = knob.Momentum
	}
	var gradBytes int64
	for _, g := range r.grads {
		gradBytes += bs[g].size
	}
	if r.kind == knob.AdamW && r.stateBytes < gradBytes { // two states in under 4 bytes an element: 8-bit
		r.kind = knob.AdamW8bit
	}
	r.name = map[knob.Optimizer]string{knob.SGD: "SGD", knob.Momentum: "momentum", knob.AdamW: "Adam/AdamW", knob.AdamW8bit: "8-bit AdamW"}[r.kind]
	return r
}

// unchanged is the line of a move to an optimizer that keeps the same state.
func (r *recordedOptimizer) unchanged(name string) string {
	return fmt.Sprintf("%s: the recording's optimizer keeps the same state (%d blocks, %s: %s): nothing changes",
		name, len(r.states), units.FormatSize(r.stateBytes), r.name)
}

// addStates adds add gradient-sized buffers per gradient at the first step, where the optimizer makes its
// state lazily.
func addStates(t *trace, bs map[uint64]*block, r recordedOptimizer, add int, name string) (*trace, string, error) {
	out := t.derive(len(t.events) + add*len(r.grads))
	var addedBytes int64
	for i := range t.events {
		e := t.events[i]
		out.events = append(out.events, e)
		if i != r.start {
			continue
		}
		for range add {
			for _, g := range r.grads {
				ge := &t.events[bs[g].alloc]
				out.events = append(out.events, newState(&e, ge, out.fresh(), ge.Size, ge.BlockSize))
				addedBytes += ge.Size
			}
		}
	}
	line := fmt.Sprintf("%s: the recording's optimizer (%s, %d state blocks for %d gradients) gets %d more "+
		"gradient-sized buffers (%s) at its first step; the step's own temporaries are not added, so its peak "+
		"is a lower bound", name, r.name, len(r.states), len(r.grads), add*len(r.grads), units.FormatSize(addedBytes))
	return out, line, nil
}

// dropStates keeps keep buffers the size of each gradient, the first ones made, and drops the other state
// blocks and the step's temporaries.
func dropStates(t *trace, bs map[uint64]*block, r recordedOptimizer, keep int, name string) (*trace, string, error) {
	drop := map[uint64]bool{}
	want := map[int64]int{}
	for _, g := range r.grads {
		want[bs[g].size] += keep
	}
	var removed int
	var removedBytes int64
	for _, a := range r.states {
		if b := bs[a]; want[b.size] > 0 {
			want[b.size]--
		} else {
			drop[a] = true
			removed++
			removedBytes += b.size
		}
	}
	temps, tempBytes := t.dropTemporaries(drop, bs)
	out := t.derive(len(t.events))
	for i := range t.events {
		if e := &t.events[i]; !dropped(e, drop) {
			out.events = append(out.events, *e)
		}
	}
	line := fmt.Sprintf("%s: removed %d of the %d optimizer state blocks of the recording's %s (%s) and its "+
		"step's %d temporaries (%s requested in all); assumes no weight decay, which in knob.SGD adds a temporary per "+
		"parameter", name, removed, len(r.states), r.name, units.FormatSize(removedBytes), temps,
		units.FormatSize(tempBytes))
	return out, line, nil
}

// newState returns the allocation of an optimizer state block of the given sizes for the parameter whose
// gradient is like, made at event at of the optimizer step.
func newState(at, like *snapshot.Event, addr uint64, size, blockSize int64) snapshot.Event {
	return snapshot.Event{Time: at.Time, Action: snapshot.ActionAlloc, Device: like.Device, Stream: like.Stream,
		Addr: addr, Size: size, BlockSize: blockSize, Phase: snapshot.PhaseOptimizer, Iteration: at.Iteration,
		Category: snapshot.CategoryOptimizerState, Scope: like.Scope}
}

// dropTemporaries adds the optimizer steps' temporaries to drop and returns how many they are and their
// requested bytes.
func (t *trace) dropTemporaries(drop map[uint64]bool, bs map[uint64]*block) (n int, bytes int64) {
	for i := range t.events {
		if e := &t.events[i]; isStepTemporary(e, bs[e.Addr]) {
			drop[e.Addr] = true
			n++
			bytes += e.Size
		}
	}
	return n, bytes
}

// dropped reports whether e is an event of one of the blocks in drop: its allocation, a release or a
// category change.
func dropped(e *snapshot.Event, drop map[uint64]bool) bool {
	switch e.Action {
	case snapshot.ActionAlloc, snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted, snapshot.ActionCategory:
		return drop[e.Addr]
	}
	return false
}

// isStepTemporary reports whether b is one of an optimizer step's temporaries: allocated in the optimizer
// phase as nothing that outlives the step.
func isStepTemporary(e *snapshot.Event, b *block) bool {
	const temp = 1<<snapshot.CategoryTemporary | 1<<snapshot.CategoryUnknown | 1<<snapshot.CategoryAutogradDetail
	return e.Action == snapshot.ActionAlloc && e.Phase == snapshot.PhaseOptimizer && b.cats&^temp == 0
}

// to8bit replaces an optimizer's state with bitsandbytes' AdamW8bit's, made at the first step for each
// gradient in parameter order (backward made them last to first): the two quantization maps once, then per
// parameter its two states and their block maxima as optimrules.Blockwise8bit says. The recorded step's
// temporaries go: the 8-bit update is one kernel per parameter, in place.
func to8bit(t *trace, bs map[uint64]*block, r recordedOptimizer, name string) (*trace, string, error) {
	drop := map[uint64]bool{}
	var droppedBytes int64
	for _, a := range r.states {
		drop[a] = true
		droppedBytes += bs[a].size
	}
	temps, tempBytes := t.dropTemporaries(drop, bs)
	out := t.derive(len(t.events) + 4*len(r.grads) + 2)
	var made int
	var madeBytes int64
	var eightBit int
	for i := range t.events {
		e := t.events[i]
		if dropped(&e, drop) {
			continue
		}
		out.events = append(out.events, e)
		if i != r.start {
			continue
		}
		add := func(ge *snapshot.Event, size int64) {
			out.events = append(out.events, newState(&e, ge, out.fresh(), size, int64(torchrules.RoundSize(uint64(size), nil))))
			made++
			madeBytes += size
		}
		qmaps := false
		for _, g := range slices.Backward(r.grads) {
			ge := &t.events[bs[g].alloc]
			eight, absmax := optimrules.Blockwise8bit(int(ge.Size / 4))
			if !eight {
				add(ge, ge.Size)
				add(ge, ge.Size)
				continue
			}
			if !qmaps {
				add(ge, 4*optimrules.QMapEntries)
				add(ge, 4*optimrules.QMapEntries)
				qmaps = true
			}
			eightBit++
			add(ge, ge.Size/4)
			add(ge, ge.Size/4)
			add(ge, 4*int64(absmax))
			add(ge, 4*int64(absmax))
		}
	}
	line := fmt.Sprintf("%s: the %d state blocks of the recording's %s (%s) and its step's %d temporaries (%s) "+
		"become %d blocks of 8-bit state (%s: %d of %d parameters in 8 bits, blockwise, the others in float32); "+
		"assumes float32 parameters (4 bytes an element)", name, len(r.states), r.name,
		units.FormatSize(droppedBytes), temps, units.FormatSize(tempBytes), made, units.FormatSize(madeBytes),
		eightBit, len(r.grads))
	return out, line, nil
}
