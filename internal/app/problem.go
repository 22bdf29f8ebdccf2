package app

import (
	"fmt"
	"strings"

	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/triage"
)

// ReportProblem is the problem a report found, which makes oomdbg report exit 1: the run ran out of memory,
// or it fails check's leak verdict (allocated memory grows from iteration to iteration). nil when neither:
// memory held across iterations, fragmentation and an inconclusive verdict are findings, not problems, as
// they are for check.
func ReportProblem(r *triage.Report) error {
	file := r.Source.File
	switch {
	case r.OOM != nil:
		return &ProblemError{Msg: fmt.Sprintf("%s: the run ran out of memory in %s", file, where(r.OOM.Iteration, r.OOM.Phase))}
	case r.Leaks.Verdict == string(leaks.Leak):
		return &ProblemError{Msg: fmt.Sprintf("%s leaks: %s", file, firstClause(r.Leaks.Reason))}
	}
	return nil
}

// where says when something happened: "iteration 3, forward", or the phase alone outside any iteration.
func where(iteration int32, phase string) string {
	switch {
	case iteration < 0:
		return phase
	case phase == "" || phase == "none": // an imported trace's phase may be unknown
		return fmt.Sprintf("iteration %d", iteration)
	}
	return fmt.Sprintf("iteration %d, %s", iteration, phase)
}

// firstClause is a reason up to its parenthesised detail, for a line on stderr: "leak: allocated memory
// grows 75.50 KiB per iteration over iterations 2-19 (retained autograd graph: ...)" loses the parenthesis.
func firstClause(reason string) string {
	reason, _ = strings.CutPrefix(reason, "leak: ")
	if i := strings.Index(reason, " ("); i > 0 {
		return reason[:i]
	}
	return reason
}
