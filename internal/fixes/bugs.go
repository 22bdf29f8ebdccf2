package fixes

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/oomdbg/oomdbg/internal/table"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// BugCheck is one recording of oomdbg bugs and its checks.
type BugCheck struct {
	Bug       string        // "" for the fixed loop
	Check     *triage.Check // as oomdbg check FILE
	Strict    *triage.Check // as oomdbg check FILE --max-held 0
	Result    *leaks.Result
	Steps     int  // the steps the recording ran
	Truncated bool // it ran out of memory or was interrupted
}

// CheckBugs records cfg fixed and with each of train.Bugs, written by toolVersion, and checks each recording
// read back, as oomdbg check does, with warmup iterations left out.
func CheckBugs(ctx context.Context, cfg train.Config, warmup int, toolVersion string) ([]BugCheck, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var rows []BugCheck
	for _, bug := range append([]string{""}, train.Bugs...) {
		c := cfg
		c.Bug = bug
		var buf bytes.Buffer
		res, err := train.Record(ctx, c, &buf, train.RecordOptions{ToolVersion: toolVersion})
		if err != nil {
			return nil, fmt.Errorf("bug %q: %w", bug, err)
		}
		s, err := snapshot.Read(&buf)
		if err != nil {
			return nil, fmt.Errorf("bug %q: reading the recording back: %w", bug, err)
		}
		tl := timeline.New(s)
		zero := int64(0)
		strict := triage.CheckLimits{MaxHeld: &zero}
		r := leaks.Analyze(tl, leaks.Warmup(warmup))
		rows = append(rows, BugCheck{Bug: bug, Result: r, Steps: res.Steps, Truncated: res.OOM != nil || res.Interrupted,
			Check:  triage.NewCheck("", r, triage.CheckLimits{}),
			Strict: triage.NewCheck("", leaks.Analyze(tl, append([]leaks.Option{leaks.Warmup(warmup)}, strict.Options()...)...), strict)})
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
	}
	return rows, nil
}

// WriteBugs writes the checks as a table: the exit codes, the verdict, what grows or is held and what keeps
// it, and the finding on gradients.
func WriteBugs(w io.Writer, cfg train.Config, warmup int, rows []BugCheck, markdown bool) {
	fmt.Fprintf(w, "%s, batch %d, meta device, %d steps, warm-up %d, each recording checked as oomdbg check checks it:\n\n",
		workloadName(cfg), cfg.Batch, cfg.Steps, warmup)
	header := []string{"bug", "the loop", "check", "check --max-held 0", "verdict", "grows or is held", "kept alive by", "gradients"}
	var cells [][]string
	exit := func(c *triage.Check) string {
		if c.Pass {
			return "0 pass"
		}
		return "1 fail"
	}
	for _, b := range rows {
		r := b.Result
		bug := b.Bug
		if bug == "" {
			bug = "none"
		}
		verdict := r.Verdict.Describe()
		if r.Verdict == leaks.Leak {
			verdict += " (" + r.Kind.Describe() + ")"
		}
		if b.Truncated {
			verdict += fmt.Sprintf(", after %d of %d steps", b.Steps, cfg.Steps)
		}
		var amount []string
		if r.Verdict == leaks.Leak {
			amount = append(amount, "+"+units.FormatSize(r.LeakPerIteration)+" per iteration")
		}
		if r.HeldBytes > 0 {
			amount = append(amount, units.FormatSize(r.HeldBytes)+" held")
		}
		if len(amount) == 0 {
			amount = append(amount, units.FormatChange(r.GrowthPerIteration)+" per iteration")
		}
		var keeps []string
		if len(r.Suspects) > 0 && r.Verdict == leaks.Leak && r.Suspects[0].RetainedBy != nil {
			keeps = append(keeps, r.Suspects[0].RetainedBy.Root)
		}
		if len(r.Held) > 0 && r.Held[0].RetainedBy != nil {
			keeps = append(keeps, r.Held[0].RetainedBy.Short(2))
		}
		if len(keeps) == 0 {
			keeps = append(keeps, "-")
		}
		grads := "-"
		if g := r.Gradients; g != nil {
			grads = "never cleared, " + units.FormatSize(g.Bytes)
		}
		cells = append(cells, []string{bug, train.DescribeBug(b.Bug), exit(b.Check), exit(b.Strict), verdict,
			strings.Join(amount, ", "), strings.Join(keeps, "; "), grads})
	}
	table.Write(w, header, cells, markdown, len(header))
}
