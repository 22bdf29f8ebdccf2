// Package app is what oomdbg's commands do beyond their flags, as pprof's internal/driver is for pprof: it
// records a workload into a file (with the signals that stop it, the host-memory check of the cpu device,
// NVML's readings and the summary), records a job's ranks and reports them side by side, checks a snapshot
// for leaks and budgets, opens snapshots read only in part, and runs the report, diff, export, replay and
// what-if commands on files. cmd/oomdbg parses the flags into typed values, calls one function here and
// hands the result to a writer; everything here writes to the io.Writers it is given.
package app

import (
	"errors"
	"fmt"
	"io"

	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
)

// ExitProblem is the exit status of a command that ran fine but found a problem: the run ran out of memory,
// a check failed.
const ExitProblem = 1

// ProblemError is returned by a command that ran fine but found a problem; it exits ExitProblem.
type ProblemError struct{ Msg string }

func (e *ProblemError) Error() string { return e.Msg }

// ExitCode is the process's exit status.
func (e *ProblemError) ExitCode() int { return ExitProblem }

// Open reads the snapshot at path, of any format oomdbg reads (load.File), within the memory lim gives a
// command whose events cost perEvent bytes each (load.CostAnalyse, ...). A file damaged part-way comes back
// with the events read before the damage, and the damage (load.Partial); a file cut short comes back whole
// up to the cut, with Snapshot.Warning; a file that cannot be used is the error, with what to do when it is
// over the budget.
func Open(path string, lim *hostmem.Limit, perEvent int64) (s *snapshot.Snapshot, damage, err error) {
	return open(path, lim, lim.Budget(perEvent))
}

func open(path string, lim *hostmem.Limit, b load.Budget) (*snapshot.Snapshot, error, error) {
	s, err := load.File(path, load.WithBudget(b))
	switch {
	case err == nil:
		return s, nil, nil
	case s != nil && load.Partial(s.Events.Len(), err):
		return s, err, nil
	}
	return nil, nil, lim.Explain(err)
}

// GiveCapacity gives the GPUs of s the capacity --gpu-mem says (0: none given) where the snapshot records
// none, as a PyTorch snapshot does not: the OOM's message, the replays, the what-if and the TUI then use it.
func GiveCapacity(s *snapshot.Snapshot, capacity uint64) error {
	if capacity == 0 {
		return nil
	}
	var ce *snapshot.CapacityError
	if err := s.Meta.GiveCapacity(int64(capacity)); errors.As(err, &ce) {
		return fmt.Errorf("--gpu-mem %s: the snapshot records %s's memory, %s; --gpu-mem is for snapshots that do not (PyTorch's)",
			units.FormatSize(ce.Given), ce.Device, units.FormatSize(ce.Recorded))
	} else if err != nil {
		return err
	}
	return nil
}

// warn writes a warning line to stderr, as every command words them: "oomdbg: warning: ...".
func warn(stderr io.Writer, format string, args ...any) {
	fmt.Fprintf(stderr, "oomdbg: warning: "+format+"\n", args...)
}
