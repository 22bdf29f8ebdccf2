package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/triage"
)

// checkFormat is the value of the check result's "format" field.
const checkFormat = "oomdbg-check/1"

func newCheckCmd() *cobra.Command {
	var maxGrowth, maxPeak uint64
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

A snapshot cut short (a recording killed, or still being written) or damaged part-way is not checked:
its missing iterations could hold the leak or the peak. --allow-truncated checks what it holds, and says
so on stderr.

Exit codes: 0 pass, 1 a check failed, 2 bad usage, an unreadable, truncated or incomplete file.`,
		Example: `  oomdbg check run.oomdbg
  oomdbg check run.oomdbg --max-peak 20GiB --max-growth 1MiB
  oomdbg check run.oomdbg --warmup 5 --ignore-scope eval --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if warmup < 0 {
				return fmt.Errorf("--warmup %d: must be at least 0", warmup)
			}
			s, err := openSnapshot(args[0], &mem, costAnalyse)
			incomplete := err
			if incomplete == nil {
				incomplete = s.Warning
			}
			switch {
			case err != nil && (s == nil || len(s.Events) == 0 || !allowTruncated || errors.Is(err, load.ErrMemory)):
				return err
			case incomplete != nil && !allowTruncated:
				return fmt.Errorf("%s is incomplete: %v; --allow-truncated checks the %d events it holds", args[0], incomplete, len(s.Events))
			case incomplete != nil:
				fmt.Fprintf(cmd.ErrOrStderr(), "oomdbg: warning: %v; checking the %d events before it\n", incomplete, len(s.Events))
			}
			opts := []leaks.Option{leaks.Warmup(warmup)}
			if cmd.Flags().Changed("max-growth") {
				opts = append(opts, leaks.MaxGrowth(int64(maxGrowth)))
			}
			if cmd.Flags().Changed("max-peak") {
				opts = append(opts, leaks.MaxPeak(int64(maxPeak)))
			}
			if len(scopes) > 0 {
				opts = append(opts, leaks.IgnoreScopes(scopes...))
			}
			if len(functions) > 0 {
				opts = append(opts, leaks.IgnoreFunctions(functions...))
			}
			r := leaks.Analyze(snapshot.NewTimeline(s), opts...)
			res := checkResult(args[0], r, cmd.Flags().Changed("max-growth"), int64(maxGrowth), cmd.Flags().Changed("max-peak"), int64(maxPeak))
			if asJSON {
				if err := writeCheckJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else {
				writeCheckText(cmd.OutOrStdout(), res, r)
			}
			if !res.Pass {
				return &problemError{msg: "check failed: " + res.Reason}
			}
			return nil
		},
	}
	cmd.Flags().Var(sizeFlag{&maxGrowth, maxSize}, "max-growth", "allow a leak of up to this much per iteration, e.g. 1MiB")
	cmd.Flags().Var(sizeFlag{&maxPeak, maxSize}, "max-peak", "fail when allocated memory peaks above this, e.g. 20GiB or 20GB (binary units)")
	cmd.Flags().IntVar(&warmup, "warmup", leaks.DefaultWarmup, "iterations left out before growth is measured")
	cmd.Flags().BoolVar(&allowTruncated, "allow-truncated", false, "check a snapshot cut short or damaged part-way on the events it holds")
	addMemoryFlag(cmd.Flags(), &mem)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON (format oomdbg-check/1, docs/report-json.md)")
	cmd.Flags().StringSliceVar(&scopes, "ignore-scope", nil, "leave out memory allocated in this module scope and those under it (repeatable)")
	cmd.Flags().StringSliceVar(&functions, "ignore-function", nil, "leave out memory allocated with this function on its stack (repeatable)")
	return cmd
}

// check is the result of a check, as --json prints it.
type check struct {
	Format        string       `json:"format"`
	File          string       `json:"file"`
	Pass          bool         `json:"pass"`
	Reason        string       `json:"reason"`
	Failures      []string     `json:"failures"`
	MaxGrowth     *int64       `json:"max_growth"`
	MaxPeak       *int64       `json:"max_peak"`
	PeakAllocated int64        `json:"peak_allocated"`
	Leaks         triage.Leaks `json:"leaks"`
}

func checkResult(file string, r *leaks.Result, hasGrowth bool, maxGrowth int64, hasPeak bool, maxPeak int64) *check {
	c := &check{Format: checkFormat, File: file, Pass: true, Failures: []string{}, PeakAllocated: r.PeakAllocated}
	if hasGrowth {
		c.MaxGrowth = &maxGrowth
	}
	if hasPeak {
		c.MaxPeak = &maxPeak
	}
	c.Leaks = triage.LeakReport(r)
	var f *leaks.Failure
	if err := r.Err(); errors.As(err, &f) {
		c.Pass = false
		c.Reason = f.Reason
		c.Failures = strings.Split(f.Reason, "; ")
		return c
	}
	c.Reason = r.Reason
	if r.Verdict == leaks.Leak && hasGrowth {
		c.Reason += ", within the limit of " + units.FormatSize(maxGrowth) + " per iteration"
	}
	if hasPeak {
		c.Reason += fmt.Sprintf("; peak %s is within the limit of %s", units.FormatSize(r.PeakAllocated), units.FormatSize(maxPeak))
	}
	return c
}

func writeCheckText(w io.Writer, c *check, r *leaks.Result) {
	verdict := "PASS"
	if !c.Pass {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "%s: %s\n", verdict, c.Reason)
	r.WriteText(w, 10)
}

func writeCheckJSON(w io.Writer, c *check) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(c)
}
