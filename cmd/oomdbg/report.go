package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/internal/backend"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/triage"
)

func newReportCmd() *cobra.Command {
	var format string
	var measure, measureOld bool
	var measureTimeout time.Duration
	var warmup int
	var gpuMem uint64
	var mem memory
	cmd := &cobra.Command{
		Use:   "report FILE...",
		Short: "Explain a snapshot: the peak, the OOM, every phase, leaks and fixes",
		Long: `Explain a snapshot file (oomdbg's own, or a PyTorch memory snapshot pickle): the exact peak and what
was alive at it, the out-of-memory error with PyTorch's message, every phase of every iteration (peak
inside it, bytes at its end, change by category), the CUDA-context and fragmentation gaps, the leak
verdict with its suspects and retainers, and the fixes that would bring the peak down.

The savings of the fixes are estimated from what was alive at the peak. For a snapshot of oomdbg's
workload, --measure-fixes measures them instead: the workload the snapshot's metadata describes is
re-run with each fix on the meta device (a fraction of a second per fix), within --measure-timeout.
Reading a file never runs anything by itself: a shared file cannot make the reader do unbounded work.
An out-of-memory error is told apart as capacity or fragmentation at the failing request, and the trace is
replayed up to it through the allocator model under other settings (expandable_segments:True,
max_split_size_mb, garbage_collection_threshold) to say which would have served it: work in proportion
to the file.

--gpu-mem gives the GPU's memory where the snapshot does not record it (PyTorch's do not): the OOM's
message is then PyTorch's own, and the fixes say whether the run would fit.

--format text is for a terminal, markdown for an issue or a pull request, json for scripts (the schema is
docs/report-json.md).

With several files, the snapshots of a data-parallel job's ranks (oomdbg's, or PyTorch's per-rank dumps),
it reports every rank side by side instead: peak and where it came, model states, activations, host
memory, the OOM; names the rank that ran out of memory or peaks highest, and what differs there from the
median rank. The files are read in parallel, one per core (docs/distributed.md: gathering a job's
snapshots, and thousands of ranks).

Exit codes: 0 the report found no problem, 1 the run ran out of memory or leaks (check's leak verdict;
with several files, any rank), with a line on stderr that says which; 2 bad usage or a file that cannot be
read.`,
		Example: `  oomdbg report run.oomdbg
  oomdbg report run.oomdbg --measure-fixes --format markdown > report.md
  oomdbg report dump_snapshot.pickle --format json | jq .peak
  oomdbg report snapshots/rank*.pickle`,
		Args: snapshotArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if warmup < 0 {
				return fmt.Errorf("--warmup %d: must be at least 0", warmup)
			}
			if len(args) > 1 {
				if measure || measureOld {
					return fmt.Errorf("--measure-fixes measures one snapshot's workload; give one file")
				}
				write, err := formatWriter(format, (*triage.RankTable).WriteText, (*triage.RankTable).WriteMarkdown, (*triage.RankTable).WriteJSON)
				if err != nil {
					return err
				}
				t, problem := app.ReportRanks(cmd.Context(), args, &mem.Limit, gpuMem, warmup)
				if err := write(t, cmd.OutOrStdout()); err != nil {
					return err
				}
				if bad := t.Unreadable(); bad > 0 {
					return fmt.Errorf("%d of the %d files could not be read (their rows say why)", bad, len(args))
				}
				for _, w := range t.Warnings {
					fmt.Fprintf(cmd.ErrOrStderr(), "oomdbg: warning: %s\n", w)
				}
				return problem
			}
			write, err := formatWriter(format, (*triage.Report).WriteText, (*triage.Report).WriteMarkdown, (*triage.Report).WriteJSON)
			if err != nil {
				return err
			}
			if measureTimeout <= 0 {
				return fmt.Errorf("--measure-timeout %v: must be positive", measureTimeout)
			}
			be := backend.Backend{MeasureTimeout: measureTimeout, ReplayBudget: mem.Budget(load.CostReplay)}
			opts := triage.Options{File: args[0], Leaks: []leaks.Option{leaks.Warmup(warmup)}, Replayer: be}
			if measure || measureOld {
				opts.Measurer = be
			}
			r, err := app.Report(cmd.Context(), args[0], &mem.Limit, gpuMem, opts, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := write(r, cmd.OutOrStdout()); err != nil {
				return err
			}
			return app.ReportProblem(r)
		},
	}
	cmd.Flags().StringVarP(&format, "format", "f", "text", "output format: text, markdown or json")
	cmd.Flags().BoolVar(&measure, "measure-fixes", false, "measure the savings of each fix by re-running the workload the snapshot describes on the meta device")
	cmd.Flags().DurationVar(&measureTimeout, "measure-timeout", time.Minute, "time the re-runs of --measure-fixes may take, in all")
	cmd.Flags().BoolVar(&measureOld, "measure", false, "the old name of --measure-fixes")
	cmd.Flags().MarkHidden("measure")
	cmd.Flags().IntVar(&warmup, "warmup", leaks.DefaultWarmup, "iterations left out before leaks are measured")
	addGPUMemFlag(cmd.Flags(), &gpuMem)
	addMemoryFlag(cmd.Flags(), &mem)
	return cmd
}

// formatWriter returns the writer of --format's text, markdown (or md) or json.
func formatWriter[T any](format string, text, markdown, json func(T, io.Writer) error) (func(T, io.Writer) error, error) {
	switch format {
	case "text":
		return text, nil
	case "markdown", "md":
		return markdown, nil
	case "json":
		return json, nil
	}
	return nil, fmt.Errorf("unknown format %q (want text, markdown or json)", format)
}

// snapshotArgs accepts one snapshot file or several (a job's ranks).
func snapshotArgs(_ *cobra.Command, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("give a snapshot file, or several: the ranks of a job")
	}
	return nil
}
