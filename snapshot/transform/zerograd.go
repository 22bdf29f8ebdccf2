package transform

import (
	"fmt"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
)

// ZeroGradMode is what optimizer.zero_grad does with the gradients.
type ZeroGradMode string

// The modes.
const (
	SetToNone ZeroGradMode = "none" // release them (PyTorch's default): they live from backward to zero_grad
	Zeroing   ZeroGradMode = "zero" // zero them in place: they live from the first backward on
)

// ParseZeroGradMode reads a zero_grad mode.
func ParseZeroGradMode(s string) (ZeroGradMode, error) {
	switch m := ZeroGradMode(s); m {
	case SetToNone, Zeroing:
		return m, nil
	}
	return "", fmt.Errorf("unknown zero_grad mode %q (want none or zero)", s)
}

// ZeroGrad moves the trace to zero_grad mode m. The recorded mode is read off the trace: whether its
// zero_grad phases release gradients. From set_to_none to zeroing, the gradients made by the first backward
// are kept to the end; a later backward adds its gradients to them in place (AccumulateGrad), so a gradient
// it would have made is released as soon as it is added, and a copy made into .grad is not made. From
// zeroing to set_to_none is not modelled: which of a backward's temporaries would have become gradients is
// not in the trace.
func ZeroGrad(m ZeroGradMode) Transform {
	name := "zero_grad " + string(m)
	return Transform{Name: name, apply: func(t *trace) (*trace, string, error) {
		if _, err := ParseZeroGradMode(string(m)); err != nil {
			return nil, "", err
		}
		if err := t.requireTags(name, true, true); err != nil {
			return nil, "", err
		}
		return zeroGrad(t, m, name)
	}}
}

func zeroGrad(t *trace, m ZeroGradMode, name string) (*trace, string, error) {
	bs := t.index()
	first := -1 // the first zero_grad phase
	var released int
	for i := range t.events {
		e := &t.events[i]
		if e.Action == snapshot.ActionPhase && e.Phase == snapshot.PhaseZeroGrad && first < 0 {
			first = i
		}
		if e.Action == snapshot.ActionFreeRequested && e.Phase == snapshot.PhaseZeroGrad {
			if b := bs[e.Addr]; b != nil && b.gradAt >= 0 {
				released++
			}
		}
	}
	if first < 0 {
		return nil, "", &MissingTagsError{name, "zero_grad phase"}
	}
	recorded := Zeroing
	if released > 0 {
		recorded = SetToNone
	}
	if recorded == m {
		return t, fmt.Sprintf("%s: the recording's zero_grad already does this: nothing changes", name), nil
	}
	if m == SetToNone {
		return nil, "", fmt.Errorf("%s: the recording zeroes its gradients; which temporaries of its backward "+
			"would have become new gradients is not in the trace: record with set_to_none instead", name)
	}
	out := t.derive(len(t.events))
	skip := map[uint64]bool{}
	var kept, addedInPlace, notMade int
	var keptBytes int64
	for i := range t.events {
		e := t.events[i]
		b := bs[e.Addr]
		isGrad := e.Action != snapshot.ActionPhase && e.Action != snapshot.ActionIteration && b != nil && b.gradAt >= 0
		switch {
		case !isGrad:
		case skip[e.Addr]:
			continue
		case (e.Action == snapshot.ActionFreeRequested || e.Action == snapshot.ActionFreeCompleted) && e.Phase == snapshot.PhaseZeroGrad:
			if e.Action == snapshot.ActionFreeRequested && b.alloc < first {
				kept++
				keptBytes += b.size
			}
			continue // zeroed in place, not released
		case b.alloc > first && b.gradAt == i && e.Action == snapshot.ActionAlloc:
			skip[e.Addr] = true // the copy into .grad: the gradient exists and is added to
			notMade++
			continue
		case b.alloc > first && b.gradAt == i && e.Action == snapshot.ActionCategory:
			f := freeEvents(e, e.Addr, b.size, t.events[b.alloc].BlockSize)
			out.events = append(out.events, f[0], f[1])
			skip[e.Addr] = true
			addedInPlace++
			continue
		}
		out.events = append(out.events, e)
	}
	line := fmt.Sprintf("%s: the %d gradients of the first backward (%s) stay allocated from then on; later "+
		"backwards added %d gradients in place and released them, and made %d fewer copies into .grad",
		name, kept, units.FormatSize(keptBytes), addedInPlace, notMade)
	return out, line, nil
}
