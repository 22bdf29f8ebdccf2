package triage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// CheckFormat is the value of a Check's "format" field.
const CheckFormat = "oomdbg-check/1"

// Check is oomdbg check's verdict on a snapshot, as its --json prints it (docs/report-json.md): pass or fail,
// the one-line reason, each failure, the limits it was held to (null for one not given) and the leak report.
type Check struct {
	Format        string   `json:"format"`
	File          string   `json:"file"`
	Pass          bool     `json:"pass"`
	Reason        string   `json:"reason"`
	Failures      []string `json:"failures"`
	MaxGrowth     *int64   `json:"max_growth"`
	MaxPeak       *int64   `json:"max_peak"`
	MaxHeld       *int64   `json:"max_held"`
	PeakAllocated int64    `json:"peak_allocated"`
	Leaks         Leaks    `json:"leaks"`

	result *leaks.Result // the analysis, for WriteText's detail
}

// CheckLimits are the limits a check was given; nil for one not given.
type CheckLimits struct {
	MaxGrowth, MaxPeak, MaxHeld *int64
}

// Options returns the limits as leak-analysis options.
func (l CheckLimits) Options() []leaks.Option {
	var opts []leaks.Option
	if l.MaxGrowth != nil {
		opts = append(opts, leaks.MaxGrowth(*l.MaxGrowth))
	}
	if l.MaxPeak != nil {
		opts = append(opts, leaks.MaxPeak(*l.MaxPeak))
	}
	if l.MaxHeld != nil {
		opts = append(opts, leaks.MaxHeld(*l.MaxHeld))
	}
	return opts
}

// NewCheck returns the check of analysis r, which was given lim's options, of the snapshot file.
func NewCheck(file string, r *leaks.Result, lim CheckLimits) *Check {
	c := &Check{Format: CheckFormat, File: file, Pass: true, Failures: []string{}, PeakAllocated: r.PeakAllocated,
		MaxGrowth: lim.MaxGrowth, MaxPeak: lim.MaxPeak, MaxHeld: lim.MaxHeld, result: r}
	c.Leaks = LeakReport(r)
	var f *leaks.Failure
	if err := r.Err(); errors.As(err, &f) {
		c.Pass = false
		c.Reason = f.Reason
		c.Failures = strings.Split(f.Reason, "; ")
		return c
	}
	c.Reason = r.Reason
	if r.Verdict == leaks.Leak && lim.MaxGrowth != nil {
		c.Reason += ", within the limit of " + units.FormatSize(*lim.MaxGrowth) + " per iteration"
	}
	if lim.MaxHeld != nil {
		c.Reason += fmt.Sprintf("; %s held across iterations is within the limit of %s", units.FormatSize(r.HeldBytes), units.FormatSize(*lim.MaxHeld))
	}
	if lim.MaxPeak != nil {
		c.Reason += fmt.Sprintf("; peak %s is within the limit of %s", units.FormatSize(r.PeakAllocated), units.FormatSize(*lim.MaxPeak))
	}
	return c
}

// FirstOOM is where a run first ran out of memory.
type FirstOOM struct {
	Seq       int
	Iteration int32
	Phase     snapshot.Phase
}

// FirstOOMOf returns the first oom event tl indexes, or nil.
func FirstOOMOf(tl *timeline.Timeline) *FirstOOM {
	ooms := tl.OOMs()
	if len(ooms) == 0 {
		return nil
	}
	e := tl.Snapshot().Events.At(ooms[0])
	return &FirstOOM{Seq: ooms[0], Iteration: e.Iteration, Phase: e.Phase}
}

// FailOnOOM fails the check of a run that ran out of memory: a snapshot that ends in an OOM has too few
// iterations for the leak check to pass it.
func (c *Check) FailOnOOM(oom *FirstOOM) {
	if oom == nil {
		return
	}
	reason := fmt.Sprintf("oom: the run ran out of memory at event %d (iteration %d, %s)", oom.Seq, oom.Iteration, oom.Phase)
	c.Failures = append([]string{reason}, c.Failures...)
	c.Reason, c.Pass = strings.Join(c.Failures, "; "), false
}

// FailInconclusive fails a check whose leak verdict is inconclusive (too few iterations after the warm-up
// to tell), for a caller that wants a verdict, not a pass by default.
func (c *Check) FailInconclusive() {
	if c.result == nil || c.result.Verdict != leaks.Inconclusive {
		return
	}
	c.Failures = append(c.Failures, c.result.Reason+", and a conclusive verdict is required")
	c.Reason, c.Pass = strings.Join(c.Failures, "; "), false
}

// WriteText writes the verdict line, PASS or FAIL and why, then the leak analysis's detail.
func (c *Check) WriteText(w io.Writer) error {
	verdict := "PASS"
	if !c.Pass {
		verdict = "FAIL"
	}
	if _, err := fmt.Fprintf(w, "%s: %s\n", verdict, c.Reason); err != nil {
		return err
	}
	if fix := c.result.Advice(); !c.Pass && fix != "" {
		fmt.Fprintf(w, "fix: %s\n", fix)
	}
	c.result.WriteText(w, 10)
	return nil
}

// WriteJSON writes the check as JSON, format oomdbg-check/1.
func (c *Check) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(c)
}
