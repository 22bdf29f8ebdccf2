package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
)

func newCheckCmd() *cobra.Command {
	var maxGrowth, maxPeak, maxHeld uint64
	var warmup int
	var asJSON, allowTruncated bool
	var mem memory
	var scopes, functions []string
	cmd := &cobra.Command{
		Use:   "check FILE",
		Short: "Exit 1 when a snapshot leaks or breaks a memory budget",
		Long: `Check a snapshot for a leak and, when given, memory budgets, for CI. The first line says PASS or FAIL
and why; the detail follows: allocated and reserved memory at the end of each iteration and the
suspects, with their stacks and what retains them.

A leak is allocated memory that keeps growing from iteration to iteration after the warm-up, measured
at the end of each iteration; it fails the check unless --max-growth allows it. One-time growth (the
optimizer's state at the first step) is not a leak; reserved memory growing while allocated memory does
not is reported as fragmentation and passes. A snapshot with too few iterations to tell passes as
inconclusive. Sizes take binary units: 24GiB and 24GB are both 24 x 2^30 bytes.

Memory that does not grow but outlives its iteration is held across iterations: blocks allocated during
training still alive when the next iteration begins, other than parameters, optimizer state and
gradients that zero_grad clears (a module keeping its output on self, logits kept until the next
forward). It is reported, by site, bytes and retainer, and passes unless --max-held is exceeded.
Gradients that no zero_grad clears between optimizer steps are named too (backward adds each step's
gradients to the last ones): they pass, and count as held.

A run that ran out of memory fails, whatever else it shows: its iterations are cut short, and a leak
check of them is no pass.

A snapshot cut short (a recording killed, or still being written) or damaged part-way is not checked:
its missing iterations could hold the leak or the peak. --allow-truncated checks what it holds, and says
so on stderr.

Exit codes: 0 pass, 1 a check failed, 2 bad usage, an unreadable, truncated or incomplete file.`,
		Example: `  oomdbg check run.oomdbg
  oomdbg check run.oomdbg --max-peak 20GiB --max-growth 1MiB
  oomdbg check run.oomdbg --max-held 0               # nothing may outlive its iteration
  oomdbg check run.oomdbg --warmup 5 --ignore-scope eval --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if warmup < 0 {
				return fmt.Errorf("--warmup %d: must be at least 0", warmup)
			}
			var lim triage.CheckLimits
			set := func(flag string, v uint64) *int64 {
				if !cmd.Flags().Changed(flag) {
					return nil
				}
				n := int64(v)
				return &n
			}
			lim.MaxGrowth, lim.MaxPeak, lim.MaxHeld = set("max-growth", maxGrowth), set("max-peak", maxPeak), set("max-held", maxHeld)
			opts := append([]leaks.Option{leaks.Warmup(warmup)}, lim.Options()...)
			if len(scopes) > 0 {
				opts = append(opts, leaks.IgnoreScopes(scopes...))
			}
			if len(functions) > 0 {
				opts = append(opts, leaks.IgnoreFunctions(functions...))
			}
			r, oom, events, warning, err := findLeaks(args[0], &mem, opts)
			incomplete := err
			if incomplete == nil {
				incomplete = warning
			}
			switch {
			case err != nil && (r == nil || !load.Partial(events, err) || !allowTruncated):
				return err
			case incomplete != nil && !allowTruncated:
				return fmt.Errorf("%s is incomplete: %v; --allow-truncated checks the %d events it holds", args[0], incomplete, events)
			case incomplete != nil:
				fmt.Fprintf(cmd.ErrOrStderr(), "oomdbg: warning: %v; checking the %d events before it\n", incomplete, events)
			}
			res := triage.NewCheck(args[0], r, lim)
			res.FailOnOOM(oom)
			write := res.WriteText
			if asJSON {
				write = res.WriteJSON
			}
			if err := write(cmd.OutOrStdout()); err != nil {
				return err
			}
			if !res.Pass {
				return &problemError{msg: "check failed: " + res.Reason}
			}
			return nil
		},
	}
	cmd.Flags().Var(sizeFlag{&maxGrowth, maxSize}, "max-growth", "allow a leak of up to this much per iteration, e.g. 1MiB")
	cmd.Flags().Var(sizeFlag{&maxPeak, maxSize}, "max-peak", "fail when allocated memory peaks above this, e.g. 20GiB or 20GB (binary units)")
	cmd.Flags().Var(sizeFlag{&maxHeld, maxSize}, "max-held", "fail when more than this is held across iterations, e.g. 0 or 64MiB")
	cmd.Flags().IntVar(&warmup, "warmup", leaks.DefaultWarmup, "iterations left out before growth is measured")
	cmd.Flags().BoolVar(&allowTruncated, "allow-truncated", false, "check a snapshot cut short or damaged part-way on the events it holds")
	addMemoryFlag(cmd.Flags(), &mem)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON (format oomdbg-check/1, docs/report-json.md)")
	cmd.Flags().StringSliceVar(&scopes, "ignore-scope", nil, "leave out memory allocated in this module scope and those under it (repeatable)")
	cmd.Flags().StringSliceVar(&functions, "ignore-function", nil, "leave out memory allocated with this function on its stack (repeatable)")
	return cmd
}

// checkPage is how many events check indexes at a time: it streams oomdbg's own snapshots page by page, in
// the memory of a few pages and a little per iteration, whatever their length.
const checkPage = 1 << 18

// findLeaks analyzes the snapshot at path for leaks and says how many events it read: an oomdbg snapshot
// streamed page by page, which no number of events makes need more memory (only the readers' density caps
// bound it); a PyTorch snapshot imported whole within mem. A damaged snapshot returns the analysis of what
// came before the damage with the error; one cut short, with its warning.
func findLeaks(path string, mem *memory, opts []leaks.Option) (r *leaks.Result, oom *triage.FirstOOM, events int, warning, err error) {
	in, err := load.Open(path, load.WithBudget(mem.Budget(costAnalyse)))
	if err != nil {
		return nil, nil, 0, nil, err
	}
	defer in.Close()
	if in.Format != load.FormatNative {
		s, err := in.Load()
		if s == nil {
			return nil, nil, 0, nil, mem.Explain(err)
		}
		tl := timeline.New(s)
		return leaks.Analyze(tl, opts...), triage.FirstOOMOf(tl), s.Events.Len(), s.Warning, mem.Explain(err)
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
