package leaks

import (
	"fmt"
	"io"
	"strings"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
)

// TestingT is the part of *testing.T that Check uses.
type TestingT interface {
	Helper()
	Errorf(format string, args ...any)
}

// Check fails t when the snapshot leaks (more than MaxGrowth per iteration, when given) or its peak exceeds
// MaxPeak. The failure reads as a one-line reason followed by the detail: the measurements and the suspects
// with their stacks and retainers. Check keeps no state between calls, so tests using it may run in parallel.
func Check(t TestingT, s *snapshot.Snapshot, opts ...Option) {
	t.Helper()
	if err := Verify(s, opts...); err != nil {
		t.Errorf("%v", err)
	}
}

// Verify returns a *Failure when the snapshot leaks or breaks a limit, nil otherwise. An inconclusive or
// fragmentation verdict is not a failure.
func Verify(s *snapshot.Snapshot, opts ...Option) error {
	return Find(s, opts...).Err()
}

// Failure is a check that failed: a one-line Reason, the Detail that explains it, and the Result.
type Failure struct {
	Reason string
	Detail string
	Result *Result
}

// Error returns the reason, then the detail on the lines after it.
func (f *Failure) Error() string { return f.Reason + "\n" + f.Detail }

// Err returns a *Failure when the result breaks a limit: a leak (growing faster than MaxGrowth, when
// given), or a peak above MaxPeak; nil otherwise.
func (r *Result) Err() error {
	var reasons []string
	if r.Verdict == Leak {
		switch {
		case r.cfg.maxGrowth < 0:
			reasons = append(reasons, r.Reason)
		case r.LeakPerIteration > r.cfg.maxGrowth:
			reasons = append(reasons, r.Reason+", over the limit of "+units.FormatSize(r.cfg.maxGrowth)+" per iteration")
		}
	}
	if r.cfg.maxPeak >= 0 && r.PeakAllocated > r.cfg.maxPeak {
		reasons = append(reasons, fmt.Sprintf("peak: allocated memory peaked at %s, over the limit of %s",
			units.FormatSize(r.PeakAllocated), units.FormatSize(r.cfg.maxPeak)))
	}
	if len(reasons) == 0 {
		return nil
	}
	return &Failure{Reason: strings.Join(reasons, "; "), Detail: r.Detail(), Result: r}
}

// Detail returns the measurements and up to ten suspects as text, as WriteText writes them.
func (r *Result) Detail() string {
	var b strings.Builder
	r.WriteText(&b, 10)
	return b.String()
}

// WriteText writes the measurements at each iteration's end and up to maxSuspects suspects (all when
// maxSuspects <= 0), each with its bytes and blocks per iteration, an example block, its allocating stack
// and what retains it.
func (r *Result) WriteText(w io.Writer, maxSuspects int) {
	if len(r.Points) > 0 {
		fmt.Fprintf(w, "allocated and reserved memory at the end of each iteration (warm-up %d):\n", r.Warmup)
		for i, p := range r.Points {
			note := ""
			if i == 0 {
				note = "  (baseline)"
			}
			it := fmt.Sprint(p.Iteration)
			if p.Iteration < 0 {
				it = "setup"
			}
			fmt.Fprintf(w, "  %9s  %12s  %12s%s\n", it, units.FormatSize(p.Allocated), units.FormatSize(p.Reserved), note)
		}
	}
	if len(r.Suspects) == 0 {
		return
	}
	shown := len(r.Suspects)
	if maxSuspects > 0 {
		shown = min(shown, maxSuspects)
	}
	fmt.Fprintf(w, "suspects, by bytes per iteration (%d of %d shown):\n", shown, len(r.Suspects))
	for _, sp := range r.Suspects[:shown] {
		site := ""
		if s := sp.Site(); s != "" {
			site = " at " + s
		}
		fmt.Fprintf(w, "- %s per iteration (%.1f %s) of %s in %s%s: %s\n", units.FormatSize(sp.BytesPerIteration),
			sp.CountPerIteration, blocksWord(sp.CountPerIteration), sp.Category, sp.Scope, site, sp.Kind.Describe())
		if sp.Label != "" {
			fmt.Fprintf(w, "    e.g. %s (%s), allocated in iteration %d, %s\n", sp.Label, units.FormatSize(sp.Example.Size),
				sp.Example.Iteration, sp.Example.Phase)
		}
		fmt.Fprintf(w, "    left alive by iterations %s\n", iterationList(sp.Survivors))
		if sp.RetainedBy != nil {
			fmt.Fprintf(w, "    retained by %s\n", sp.RetainedBy.Short(6))
		} else {
			fmt.Fprintf(w, "    retained by: no heap dump names it\n")
		}
		if len(sp.Stack) > 0 {
			fmt.Fprintf(w, "    allocated at:\n")
			for _, f := range sp.Stack[:min(len(sp.Stack), 5)] {
				fmt.Fprintf(w, "      %s\n", f)
			}
		}
	}
}

// iterationList prints iterations compactly: "2-7", "0, 3, 5-6".
func iterationList(its []int32) string {
	var parts []string
	for i := 0; i < len(its); {
		j := i
		for j+1 < len(its) && its[j+1] == its[j]+1 {
			j++
		}
		switch {
		case j == i:
			parts = append(parts, fmt.Sprint(its[i]))
		default:
			parts = append(parts, fmt.Sprintf("%d-%d", its[i], its[j]))
		}
		i = j + 1
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// blocksWord is "block" for exactly one block, "blocks" otherwise: "1.0 block", "0.5 blocks".
func blocksWord(n float64) string {
	if n == 1 {
		return "block"
	}
	return "blocks"
}
