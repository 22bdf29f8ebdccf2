package whatif

import (
	"sync"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/allocator/replay"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/whatif/transform"
)

// Fails reports whether the program fails under an outcome's settings, and PyTorch's message: the first
// allocation the model could not serve, or a recorded out-of-memory error that still happens.
func Fails(o replay.Outcome) (bool, string) {
	if o.OOM != nil {
		return true, o.OOM.Message
	}
	for _, r := range o.RecordedOOMs {
		if r.StillHappens {
			return true, r.Message
		}
	}
	return false, ""
}

// Prepared is a trace transformed by a fix, ready to replay.
type Prepared struct {
	// Changed is the trace transformed, with releases it does not record at the early end
	// (transform.ApplyEnds): the estimate.
	Changed *snapshot.Snapshot
	// Held is the same at the late end; nil where the fix places no such releases.
	Held *snapshot.Snapshot
	// Assumptions has one line per transformation, then, where the trace is a PyTorch snapshot's, one
	// naming the tags the importer inferred.
	Assumptions []string
}

// Prepare applies ts to s, at both ends where they differ. s is not changed.
func Prepare(s *snapshot.Snapshot, ts ...transform.Transform) (*Prepared, error) {
	changed, held, lines, err := transform.ApplyEnds(s, ts...)
	if err != nil {
		return nil, err
	}
	if tags := InferredTags(s); tags != "" && len(ts) > 0 {
		lines = append(lines, tags)
	}
	return &Prepared{Changed: changed, Held: held, Assumptions: lines}, nil
}

// Result is a prepared fix replayed on one device.
type Result struct {
	After replay.Outcome
	// Held is the replay of Prepared.Held; nil without one.
	Held *replay.Outcome
}

// Edge reports whether the verdict depends on where the releases the trace does not record lie: the run
// fits at one end and fails at the other.
func (r Result) Edge() bool {
	if r.Held == nil {
		return false
	}
	a, _ := Fails(r.After)
	h, _ := Fails(*r.Held)
	return a != h
}

// Replay replays p under cfg on device's trace with the given capacity (0: unlimited), both ends side by
// side.
func (p *Prepared) Replay(cfg allocator.Config, device int, capacity uint64) (Result, error) {
	var r Result
	var held replay.Outcome
	var heldErr error
	var wg sync.WaitGroup
	if p.Held != nil {
		r.Held = &held
		wg.Go(func() { held, heldErr = outcomeOn(p.Held, cfg, device, capacity) })
	}
	var err error
	r.After, err = outcomeOn(p.Changed, cfg, device, capacity)
	wg.Wait()
	if err == nil {
		err = heldErr
	}
	if err != nil {
		return Result{}, err
	}
	return r, nil
}

// outcomeOn replays s and returns device's outcome (the zero outcome when s has no events on it).
func outcomeOn(s *snapshot.Snapshot, cfg allocator.Config, device int, capacity uint64) (replay.Outcome, error) {
	all, err := replay.Simulate(s, cfg, capacity)
	if err != nil {
		return replay.Outcome{}, err
	}
	for _, a := range all {
		if a.Device == device {
			return a.Outcome, nil
		}
	}
	return replay.Outcome{}, nil
}
