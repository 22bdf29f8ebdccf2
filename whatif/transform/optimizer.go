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
	start := -1
	for i := range t.events {
		if e := &t.events[i]; e.Action == snapshot.ActionPhase && e.Phase == snapshot.PhaseOptimizer {
			start = i
			break
		}
	}
	if start < 0 {
		return nil, "", &MissingTagsError{name, "optimizer phase"}
	}
	bs := t.index()
	var grads []uint64 // the gradients alive at the first optimizer step, in order of allocation
	for i := 0; i < start; i++ {
		e := &t.events[i]
		if e.Action != snapshot.ActionAlloc {
			continue
		}
		if b := bs[e.Addr]; b.gradAt >= 0 && b.gradAt < start && (b.free < 0 || b.free > start) {
			grads = append(grads, e.Addr)
		}
	}
	if len(grads) == 0 {
		return nil, "", &MissingTagsError{name, "gradient category"}
	}
	var states []uint64
	var stateBytes int64
	for i := range t.events {
		e := &t.events[i]
		if e.Action == snapshot.ActionAlloc && bs[e.Addr].has(snapshot.CategoryOptimizerState) {
			states = append(states, e.Addr)
			stateBytes += e.Size
		}
	}
	perGrad := float64(len(states)) / float64(len(grads))
	recorded := knob.SGD
	switch {
	case perGrad >= 1.5:
		recorded = knob.AdamW
	case perGrad >= 0.5:
		recorded = knob.Momentum
	}
	var gradBytes int64
	for _, g := range grads {
		gradBytes += bs[g].size
	}
	if recorded == knob.AdamW && stateBytes < gradBytes { // two states in under 4 bytes an element: 8-bit
		recorded = knob.AdamW8bit
	}
	recordedName := map[knob.Optimizer]string{knob.SGD: "SGD", knob.Momentum: "momentum", knob.AdamW: "Adam/AdamW", knob.AdamW8bit: "8-bit AdamW"}[recorded]
	switch {
	case recorded == o:
		return t, fmt.Sprintf("%s: the recording's optimizer keeps the same state (%d blocks, %s: %s): nothing changes",
			name, len(states), units.FormatSize(stateBytes), recordedName), nil
	case recorded == knob.AdamW8bit:
		return nil, "", fmt.Errorf("%s: the recording's optimizer keeps 8-bit state; moving from it is not modelled: "+
			"record with the optimizer instead", name)
	case o == knob.AdamW8bit:
		return to8bit(t, bs, grads, states, start, name, recordedName)
	}
	if recorded.States() == o.States() {
		return t, fmt.Sprintf("%s: the recording's optimizer keeps the same state (%d blocks, %s: %s): nothing changes",
			name, len(states), units.FormatSize(stateBytes), recordedName), nil
	}

	drop := map[uint64]bool{}
	var add int
	var dropTemps int
	var tempBytes int64
	if o.States() < recorded.States() {
		// Keep o.States() buffers the size of each gradient, the first ones made; drop the rest.
		want := map[int64]int{}
		for _, g := range grads {
			want[bs[g].size] += o.States()
		}
		for _, a := range states {
			if b := bs[a]; want[b.size] > 0 {
				want[b.size]--
			} else {
				drop[a] = true
			}
		}
		// The step's temporaries: what the optimizer allocates and never makes anything else.
		for i := range t.events {
			e := &t.events[i]
			if isStepTemporary(e, bs[e.Addr]) {
				drop[e.Addr] = true
				dropTemps++
				tempBytes += e.Size
			}
		}
	} else {
		add = o.States() - recorded.States()
	}
	out := t.derive(len(t.events) + add*len(grads))
	var dropped int
	var droppedBytes, addedBytes int64
	for i := range t.events {
		e := t.events[i]
		switch e.Action {
		case snapshot.ActionAlloc, snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted, snapshot.ActionCategory:
			if drop[e.Addr] {
				if e.Action == snapshot.ActionAlloc && bs[e.Addr].has(snapshot.CategoryOptimizerState) {
					dropped++
					droppedBytes += e.Size
				}
				continue
			}
		}
		out.events = append(out.events, e)
		if i == start && add > 0 { // the new state, made lazily at the first step
			for range add {
				for _, g := range grads {
					ge := t.events[bs[g].alloc]
					s := snapshot.Event{Time: e.Time, Action: snapshot.ActionAlloc, Device: ge.Device, Stream: ge.Stream,
						Addr: out.fresh(), Size: ge.Size, BlockSize: ge.BlockSize, Phase: snapshot.PhaseOptimizer,
						Iteration: e.Iteration, Category: snapshot.CategoryOptimizerState, Scope: ge.Scope}
					out.events = append(out.events, s)
					addedBytes += ge.Size
				}
			}
		}
	}
	var line string
	if add > 0 {
		line = fmt.Sprintf("%s: the recording's optimizer (%s, %d state blocks for %d gradients) gets %d more "+
			"gradient-sized buffers (%s) at its first step; the step's own temporaries are not added, so its peak "+
			"is a lower bound", name, recordedName, len(states), len(grads), add*len(grads), units.FormatSize(addedBytes))
	} else {
		line = fmt.Sprintf("%s: removed %d of the %d optimizer state blocks of the recording's %s (%s) and its "+
			"step's %d temporaries (%s requested in all); assumes no weight decay, which in knob.SGD adds a temporary per "+
			"parameter", name, dropped, len(states), recordedName, units.FormatSize(droppedBytes), dropTemps,
			units.FormatSize(tempBytes))
	}
	return out, line, nil
}

// isStepTemporary reports whether b is one of an optimizer step's temporaries: allocated in the optimizer
// phase as nothing that outlives the step.
func isStepTemporary(e *snapshot.Event, b *block) bool {
	const temp = 1<<snapshot.CategoryTemporary | 1<<snapshot.CategoryUnknown | 1<<snapshot.CategoryAutogradDetail
	return e.Action == snapshot.ActionAlloc && e.Phase == snapshot.PhaseOptimizer && b.cats&^temp == 0
}

// to8bit replaces an optimizer's state with bitsandbytes' AdamW8bit's, made at the first step (start) for
// each gradient in parameter order (backward made them last to first): the two quantization maps once,
// then per parameter its two states and their block maxima as optimrules.Blockwise8bit says. The recorded step's
// temporaries go: the 8-bit update is one kernel per parameter, in place.
func to8bit(t *trace, bs map[uint64]*block, grads, states []uint64, start int, name, recordedName string) (*trace, string, error) {
	drop := map[uint64]bool{}
	var droppedBytes, tempBytes int64
	for _, a := range states {
		drop[a] = true
		droppedBytes += bs[a].size
	}
	var temps int
	for i := range t.events {
		if e := &t.events[i]; e.Action == snapshot.ActionAlloc && isStepTemporary(e, bs[e.Addr]) {
			drop[e.Addr] = true
			temps++
			tempBytes += e.Size
		}
	}
	out := t.derive(len(t.events) + 4*len(grads) + 2)
	var made int
	var madeBytes int64
	var eightBit int
	for i := range t.events {
		e := t.events[i]
		switch e.Action {
		case snapshot.ActionAlloc, snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted, snapshot.ActionCategory:
			if drop[e.Addr] {
				continue
			}
		}
		out.events = append(out.events, e)
		if i != start {
			continue
		}
		add := func(ge *snapshot.Event, size int64) {
			s := snapshot.Event{Time: e.Time, Action: snapshot.ActionAlloc, Device: ge.Device, Stream: ge.Stream,
				Addr: out.fresh(), Size: size, BlockSize: int64(torchrules.RoundSize(uint64(size), nil)),
				Phase: snapshot.PhaseOptimizer, Iteration: e.Iteration, Category: snapshot.CategoryOptimizerState,
				Scope: ge.Scope}
			out.events = append(out.events, s)
			made++
			madeBytes += size
		}
		qmaps := false
		for _, g := range slices.Backward(grads) {
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
		"assumes float32 parameters (4 bytes an element)", name, len(states), recordedName,
		units.FormatSize(droppedBytes), temps, units.FormatSize(tempBytes), made, units.FormatSize(madeBytes),
		eightBit, len(grads))
	return out, line, nil
}
