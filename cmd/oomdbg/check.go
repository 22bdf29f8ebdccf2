package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/leaks"
)

func newCheckCmd() *cobra.Command {
	var asJSON bool
	var mem memory
	var req app.CheckRequest
	cmd := &cobra.Command{
		Use:   "check FILE",
		Short: "Exit 1 when a snapshot leaks or breaks a memory budget",
		Long: `Check a snapshot for a leak and, when given, memory budgets, for CI. The first line says PASS or FAIL
and why; the detail follows: allocated and reserved memory at the end of each iteration and the
suspects, with their stacks and what retains them.

A leak is allocated memory that keeps growing from iteration to iteration after the warm-up, measured
at the end of each iteration; it fails the check unless --max-growth allows it. One-time growth (the
optimizer's state at the first step) is not a leak; reserved memory growing while allocated memory does
not is reported as fragmentation and passes. A snapshot with too few iterations to tell (a PyTorch snapshot
without iterations, a run shorter than the warm-up) passes as inconclusive, or fails with
--require-conclusive. Sizes take binary units: 24GiB and 24GB are both 24 x 2^30 bytes.

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
			if req.Warmup < 0 {
				return fmt.Errorf("--warmup %d: must be at least 0", req.Warmup)
			}
			req.Memory = &mem.Limit
			c, err := app.Check(args[0], req, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			write := c.WriteText
			if asJSON {
				write = c.WriteJSON
			}
			if err := write(cmd.OutOrStdout()); err != nil {
				return err
			}
			if !c.Pass {
				return &app.ProblemError{Msg: "check failed: " + c.Reason}
			}
			return nil
		},
	}
	lim := &req.Limits
	cmd.Flags().Var(optional(&lim.MaxGrowth, parseLimit, "size", ""), "max-growth", "allow a leak of up to this much per iteration, e.g. 1MiB (default: none: any leak fails)")
	cmd.Flags().Var(optional(&lim.MaxPeak, parseLimit, "size", ""), "max-peak", "fail when allocated memory peaks above this, e.g. 20GiB or 20GB (binary units) (default: no limit)")
	cmd.Flags().Var(optional(&lim.MaxHeld, parseLimit, "size", ""), "max-held", "fail when more than this is held across iterations, e.g. 0 or 64MiB (default: no limit)")
	cmd.Flags().IntVar(&req.Warmup, "warmup", leaks.DefaultWarmup, "iterations left out before growth is measured")
	cmd.Flags().BoolVar(&req.AllowTruncated, "allow-truncated", false, "check a snapshot cut short or damaged part-way on the events it holds")
	cmd.Flags().BoolVar(&req.RequireConclusive, "require-conclusive", false, "fail a snapshot with too few iterations to tell whether it leaks, instead of passing it as inconclusive")
	addMemoryFlag(cmd.Flags(), &mem)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON (format oomdbg-check/1, docs/report-json.md)")
	cmd.Flags().StringSliceVar(&req.IgnoreScopes, "ignore-scope", nil, "leave out memory allocated in this module scope and those under it (repeatable)")
	cmd.Flags().StringSliceVar(&req.IgnoreFunctions, "ignore-function", nil, "leave out memory allocated with this function on its stack (repeatable)")
	return cmd
}
