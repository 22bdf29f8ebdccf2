package whatif

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/allocator/replay"
	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/snapshot"
)

// Baseline is a trace replayed as recorded: what every fix on it is compared with.
type Baseline struct {
	// Worst is the replay of the device a what-if shows: the first that ran out of memory in the
	// recording, else the one whose reserved memory peaks highest.
	Worst replay.Replayed
	// Devices is how many devices the trace has.
	Devices int
	// Recorded is the allocator settings the trace was recorded with.
	Recorded allocator.Config
	// Margin is the share of the capacity a run must leave unreserved to fit (headroom.DefaultMargin, as
	// Before sets it).
	Margin float64
}

// Before replays s as recorded, on gpuMem bytes (0: the capacity the snapshot records or implies).
func Before(s *snapshot.Snapshot, gpuMem uint64) (*Baseline, error) {
	recorded, _ := replay.RecordedSettings(s)
	all, err := replay.Simulate(s, recorded, gpuMem)
	if errors.Is(err, replay.ErrNoTrace) {
		return nil, fmt.Errorf("%w; record one with torch.cuda.memory._record_memory_history()", err)
	}
	if err != nil {
		return nil, err
	}
	b := &Baseline{Worst: all[0], Devices: len(all), Recorded: recorded, Margin: headroom.DefaultMargin}
	for _, r := range all[1:] {
		if worse := r.RecordedOOMs > 0 && b.Worst.RecordedOOMs == 0; worse ||
			(r.RecordedOOMs > 0) == (b.Worst.RecordedOOMs > 0) && r.Outcome.PeakReserved > b.Worst.Outcome.PeakReserved {
			b.Worst = r
		}
	}
	return b, nil
}

// Evaluate applies f to s, replays the trace before and after, and compares: oomdbg whatif. s is not
// changed.
func Evaluate(s *snapshot.Snapshot, f Fix, gpuMem uint64) (*Report, error) {
	// The replay before and the transformation only read s: they run side by side.
	var (
		prep *Prepared
		tErr error
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		prep, tErr = Prepare(s, f.Transforms...)
	}()
	b, err := Before(s, gpuMem)
	<-done
	if err != nil {
		return nil, err
	}
	if tErr != nil {
		return nil, tErr
	}
	return b.replay(f, prep)
}

// AlreadySetError says a fix of allocator settings only asks for settings the trace was recorded with: it
// would change nothing.
type AlreadySetError struct {
	Fix, Recorded string
}

func (e *AlreadySetError) Error() string {
	recorded := e.Recorded
	if recorded == "" {
		recorded = "PyTorch's defaults"
	}
	return fmt.Sprintf("%s: already set: the trace was recorded with %s", e.Fix, recorded)
}

// Apply applies f to s and compares its replay with b, which is s replayed as recorded. A fix of allocator
// settings the recording already has is refused with an *AlreadySetError.
func (b *Baseline) Apply(s *snapshot.Snapshot, f Fix) (*Report, error) {
	if err := b.alreadySet(f); err != nil {
		return nil, err
	}
	prep, err := Prepare(s, f.Transforms...)
	if err != nil {
		return nil, err
	}
	return b.replay(f, prep)
}

// alreadySet refuses a fix of allocator settings the recording already has: it would change nothing.
func (b *Baseline) alreadySet(f Fix) error {
	if f.AllocConf != nil && len(f.Transforms) == 0 && b.Recorded.Includes(*f.AllocConf) {
		name := f.Name
		if name == "" {
			name = "alloc-conf " + f.AllocConf.String()
		}
		return &AlreadySetError{Fix: name, Recorded: b.Recorded.String()}
	}
	return nil
}

// replay replays a prepared fix on b's device and writes the report.
func (b *Baseline) replay(f Fix, prep *Prepared) (*Report, error) {
	if err := b.alreadySet(f); err != nil {
		return nil, err
	}
	w := b.Worst
	after := b.Recorded
	if f.AllocConf != nil {
		after = *f.AllocConf
	}
	res, err := prep.Replay(after, w.Device, w.Capacity)
	if err != nil {
		return nil, err
	}
	rep := &Report{Fixes: f.names(), Device: w.Device, Capacity: w.Capacity, CapacityFrom: w.CapacityFrom,
		Before: sideOf(w.Outcome, w.Capacity, b.Margin), After: sideOf(res.After, w.Capacity, b.Margin),
		Assumptions: prep.Assumptions, Margin: b.Margin}
	if w.Capacity > 0 {
		rep.Limit = headroom.Limit(int64(w.Capacity), b.Margin)
	}
	if f.AllocConf != nil {
		was := b.Recorded.String()
		if was == "" {
			was = "PyTorch's defaults"
		}
		rep.Assumptions = append(rep.Assumptions, fmt.Sprintf("alloc-conf: the requests replayed after under %s, "+
			"before under the recorded settings (%s)", f.AllocConf.String(), was))
	}
	if res.Held != nil {
		held := sideOf(*res.Held, w.Capacity, b.Margin)
		rep.AfterHeld = &held
	}
	switch {
	case w.Capacity == 0:
		rep.Verdict = VerdictUnknown
	case res.Edge():
		rep.Verdict = VerdictEdge
	case rep.AfterHeld != nil && rep.AfterHeld.Verdict == VerdictTight:
		rep.Verdict = VerdictTight // the late end is the worse of the two: where it is tight, so is the run
	default:
		rep.Verdict = rep.After.Verdict
	}
	if b.Devices > 1 {
		which := "whose reserved memory peaks highest"
		if w.RecordedOOMs > 0 {
			which = "which ran out of memory"
		}
		rep.Notes = append(rep.Notes, fmt.Sprintf("the trace has %d devices: device %d, %s, is shown", b.Devices, w.Device, which))
	}
	if w.Capacity == 0 {
		rep.Notes = append(rep.Notes, "no device capacity is known: give --gpu-mem to see whether the run fits")
	}
	if w.RecordedOOMs > 0 {
		rep.Unrecorded = "the recording ends in an out-of-memory error: the figures are for the part that was " +
			"recorded; what would have come after it was never recorded (record with a fix that lets the step " +
			"finish, or simulate the model with oomdbg run)"
	}
	return rep, nil
}

// Outcome is one fix of a list, evaluated: its report, or why the trace could not take it.
type Outcome struct {
	Fix    Fix
	Report *Report // nil when Err is set
	Err    error
}

// Fits reports whether the run fits after the fix, by the headroom rule, wherever the releases the trace
// does not record lie.
func (o Outcome) Fits() bool { return o.Err == nil && o.Report.Verdict == VerdictFits }

// EvaluateAll evaluates each fix against one replay of s as recorded, and ranks them: those that fit
// first, by how much of the run they keep; then those that run inside the margin (tight), those at the
// edge, then the others, lowest peak reserved first, and last those the trace could not take. It stops with
// ctx's error when ctx is done.
func EvaluateAll(ctx context.Context, s *snapshot.Snapshot, fixes []Fix, gpuMem uint64) (*Baseline, []Outcome, error) {
	b, err := Before(s, gpuMem)
	if err != nil {
		return nil, nil, err
	}
	out := make([]Outcome, 0, len(fixes))
	for _, f := range fixes {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		rep, err := b.Apply(s, f)
		out = append(out, Outcome{Fix: f, Report: rep, Err: err})
	}
	Rank(out)
	return b, out, nil
}

// Rank orders outcomes as EvaluateAll does.
func Rank(out []Outcome) {
	slices.SortStableFunc(out, func(a, b Outcome) int {
		switch {
		case a.Fits() != b.Fits():
			if a.Fits() {
				return -1
			}
			return 1
		case a.Fits():
			return cmp.Compare(a.Fix.Cost, b.Fix.Cost)
		case (a.Err == nil) != (b.Err == nil):
			if a.Err == nil {
				return -1
			}
			return 1
		case a.Err != nil:
			return 0
		case (a.Report.Verdict == VerdictTight) != (b.Report.Verdict == VerdictTight):
			if a.Report.Verdict == VerdictTight {
				return -1
			}
			return 1
		case (a.Report.Verdict == VerdictEdge) != (b.Report.Verdict == VerdictEdge):
			if a.Report.Verdict == VerdictEdge {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Report.After.PeakReserved, b.Report.After.PeakReserved)
	})
}
