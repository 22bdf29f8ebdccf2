package leaks

import (
	"fmt"
	"io"
	"strings"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
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

// Verify returns a *Failure when the snapshot leaks or breaks a limit, nil otherwise. An inconclusive,
// fragmentation or held verdict is not a failure (MaxHeld makes held memory one).
func Verify(s *snapshot.Snapshot, opts ...Option) error {
	return Find(s, opts...).Err()
}

// Failure is a check that failed: a one-line Reason, the Detail that explains it, and the Result.
type Failure struct {
	Reason string
	Detail string
	Result *Result
}

// Error returns the reason, then the code change that fixes it when one is known (Result.Advice, what the
// report and the TUI give), then the detail on the lines after it.
func (f *Failure) Error() string {
	if f.Result != nil {
		if fix := f.Result.Advice(); fix != "" {
			return f.Reason + "\nfix: " + fix + "\n" + f.Detail
		}
	}
	return f.Reason + "\n" + f.Detail
}

// Err returns a *Failure when the result breaks a limit: a leak (growing faster than MaxGrowth, when
// given), more held across iterations than MaxHeld, or a peak above MaxPeak; nil otherwise. Memory held
// across iterations and gradients never cleared are findings, not failures, unless MaxHeld says so.
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
	if r.cfg.maxHeld >= 0 && r.HeldBytes > r.cfg.maxHeld {
		reasons = append(reasons, fmt.Sprintf("held: %s held across iterations, over the limit of %s",
			units.FormatSize(r.HeldBytes), units.FormatSize(r.cfg.maxHeld)))
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

// Detail returns the findings, the measurements, up to ten suspects and up to ten groups held across
// iterations as text, as WriteText writes them.
func (r *Result) Detail() string {
	var b strings.Builder
	r.WriteText(&b, 10)
	return b.String()
}

// WriteText writes the finding on gradients, if any, the measurements at each iteration's end, and up to
// maxSuspects suspects and as many groups held across iterations (all when maxSuspects <= 0), each with its
// bytes, an example block, its allocating stack and what retains it.
func (r *Result) WriteText(w io.Writer, maxSuspects int) {
	if r.Gradients != nil {
		fmt.Fprintln(w, r.Gradients.Reason)
	}
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
	r.writeSuspects(w, maxSuspects)
	r.writeHeld(w, maxSuspects)
}

func (r *Result) writeSuspects(w io.Writer, max int) {
	if len(r.Suspects) == 0 {
		return
	}
	shown := shownOf(len(r.Suspects), max)
	fmt.Fprintf(w, "suspects, by bytes per iteration (%d of %d shown):\n", shown, len(r.Suspects))
	for _, sp := range r.Suspects[:shown] {
		site := ""
		if s := sp.Site(); s != "" {
			site = " at " + s
		}
		fmt.Fprintf(w, "- %s per iteration (%.1f %s) of %s in %s%s: %s\n", units.FormatSize(sp.BytesPerIteration),
			sp.CountPerIteration, blocksWord(sp.CountPerIteration), sp.Category, sp.Scope, site, sp.Kind.Describe())
		writeExample(w, sp.Label, sp.Example)
		fmt.Fprintf(w, "    left alive by iterations %s\n", iterationList(sp.Survivors))
		writeHolder(w, sp.RetainedBy, sp.Stack)
	}
}

func (r *Result) writeHeld(w io.Writer, max int) {
	if len(r.Held) == 0 {
		return
	}
	shown := shownOf(len(r.Held), max)
	fmt.Fprintf(w, "held across iterations, by bytes (%d of %d shown, %s in all):\n", shown, len(r.Held), units.FormatSize(r.HeldBytes))
	for _, h := range r.Held[:shown] {
		site := ""
		if s := h.Site(); s != "" {
			site = " at " + s
		}
		fmt.Fprintf(w, "- %s (%d %s) of %s in %s%s\n", units.FormatSize(h.Bytes), h.Count, plural(h.Count, "block"), h.Category, h.Scope, site)
		writeExample(w, h.Label, h.Example)
		fmt.Fprintf(w, "    allocated in iterations %s\n", iterationList(h.Iterations))
		writeHolder(w, h.RetainedBy, h.Stack)
	}
}

func shownOf(n, max int) int {
	if max > 0 {
		return min(n, max)
	}
	return n
}

// writeExample writes a group's example block, when it has a label.
func writeExample(w io.Writer, label string, b timeline.Allocation) {
	if label != "" {
		fmt.Fprintf(w, "    e.g. %s (%s), allocated in iteration %d, %s\n", label, units.FormatSize(b.Size), b.Iteration, b.Phase)
	}
}

// writeHolder writes what retained a group's example block and the stack that allocated the group.
func writeHolder(w io.Writer, r *RetainerPath, stack []string) {
	if r != nil {
		fmt.Fprintf(w, "    retained by %s\n", r.Short(6))
	} else {
		fmt.Fprintf(w, "    retained by: no heap dump names it\n")
	}
	if len(stack) > 0 {
		fmt.Fprintf(w, "    allocated at:\n")
		for _, f := range stack[:min(len(stack), 5)] {
			fmt.Fprintf(w, "      %s\n", f)
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
