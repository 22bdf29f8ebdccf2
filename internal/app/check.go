package app

import (
	"fmt"
	"io"

	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
)

// CheckRequest is what oomdbg check holds a snapshot to.
type CheckRequest struct {
	Limits triage.CheckLimits
	Warmup int // iterations left out before growth is measured
	// IgnoreScopes and IgnoreFunctions leave out memory allocated in those module scopes, or with those
	// functions on its stack.
	IgnoreScopes, IgnoreFunctions []string
	// AllowTruncated checks a snapshot cut short or damaged part-way on the events it holds, with a warning
	// on stderr; otherwise such a file is an error: its missing iterations could hold the leak or the peak.
	AllowTruncated bool
	// RequireConclusive fails a snapshot with too few iterations to tell whether it leaks (a PyTorch
	// snapshot without iterations, a run shorter than the warm-up); otherwise it passes as inconclusive.
	RequireConclusive bool
	Memory            *hostmem.Limit
}

// Check checks the snapshot at path for leaks and req's limits, as oomdbg check does: a run that ran out of
// memory fails whatever else it shows.
func Check(path string, req CheckRequest, stderr io.Writer) (*triage.Check, error) {
	opts := append([]leaks.Option{leaks.Warmup(req.Warmup)}, req.Limits.Options()...)
	if len(req.IgnoreScopes) > 0 {
		opts = append(opts, leaks.IgnoreScopes(req.IgnoreScopes...))
	}
	if len(req.IgnoreFunctions) > 0 {
		opts = append(opts, leaks.IgnoreFunctions(req.IgnoreFunctions...))
	}
	r, oom, events, warning, err := findLeaks(path, req.Memory, opts)
	incomplete := err
	if incomplete == nil {
		incomplete = warning
	}
	switch {
	case err != nil && (r == nil || !load.Partial(events, err) || !req.AllowTruncated):
		return nil, err
	case incomplete != nil && !req.AllowTruncated:
		return nil, fmt.Errorf("%s is incomplete: %v; --allow-truncated checks the %d events it holds", path, incomplete, events)
	case incomplete != nil:
		warn(stderr, "%v; checking the %d events before it", incomplete, events)
	}
	c := triage.NewCheck(path, r, req.Limits)
	c.FailOnOOM(oom)
	if req.RequireConclusive {
		c.FailInconclusive()
	}
	return c, nil
}

// checkPage is how many events check indexes at a time: it streams oomdbg's own snapshots page by page, in
// the memory of a few pages and a little per iteration, whatever their length.
const checkPage = 1 << 18

// findLeaks analyzes the snapshot at path for leaks and says how many events it read: an oomdbg snapshot
// streamed page by page, which no number of events makes need more memory (only the readers' density caps
// bound it); a PyTorch snapshot imported whole within lim. A damaged snapshot returns the analysis of what
// came before the damage with the error; one cut short, with its warning.
func findLeaks(path string, lim *hostmem.Limit, opts []leaks.Option) (r *leaks.Result, oom *triage.FirstOOM, events int, warning, err error) {
	in, err := load.Open(path, load.WithBudget(lim.Budget(load.CostAnalyse)))
	if err != nil {
		return nil, nil, 0, nil, err
	}
	defer in.Close()
	if in.Format != load.FormatNative {
		s, err := in.Load()
		if s == nil {
			return nil, nil, 0, nil, lim.Explain(err)
		}
		tl := timeline.New(s)
		return leaks.Analyze(tl, opts...), triage.FirstOOMOf(tl), s.Events.Len(), s.Warning, lim.Explain(err)
	}
	rd, err := snapshot.NewReader(in.Reader(), snapshot.WithLimits(snapshot.Limits{Events: snapshot.MaxEvents}))
	if err != nil {
		return nil, nil, 0, nil, fmt.Errorf("%s: %w", path, err)
	}
	st := leaks.NewStream(opts...)
	s, err := timeline.Scan(rd, checkPage, func(tl *timeline.Timeline) {
		if oom == nil {
			oom = triage.FirstOOMOf(tl)
		}
		st.Observe(tl)
	})
	if err != nil {
		err = fmt.Errorf("%s: %w", path, err)
	}
	return st.Result(s), oom, s.Events.Len(), s.Warning, err
}
