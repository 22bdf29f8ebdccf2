package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/table"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/workloads/train"
)

func newBugsCmd() *cobra.Command {
	cfg := train.DefaultMLP()
	var preset string
	var warmup int
	var markdown bool
	cmd := &cobra.Command{
		Use:   "bugs [flags]",
		Short: "Record each leak bug and the fixed loop, and check each",
		Long: `Record a workload on the meta device once with each leak bug and once fixed, and check each
recording as oomdbg check does: its exit code (and with --max-held 0), the verdict, the growth per
iteration or the bytes held across iterations, what keeps them, and the finding on gradients.

The bugs are the memory mistakes PyTorch courses teach. Some leak: memory grows every iteration and
check fails. Some do not: a loop without zero_grad holds its gradients from step to step (and trains on
their running sum), a module that keeps an intermediate on self holds one per module; check names them
and passes unless --max-held is given.

It takes the same flags as run; without --preset or --model it records the default of run (the mlp),
for 8 steps unless --steps says otherwise.`,
		Example: `  oomdbg bugs
  oomdbg bugs --markdown
  oomdbg bugs --preset tiny --markdown        # nanoGPT's loop, which keeps the logits until the next forward`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if warmup < 0 {
				return fmt.Errorf("--warmup %d: must be at least 0", warmup)
			}
			cfg, err := configFromFlags(cmd.Flags(), preset)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("steps") {
				cfg.Steps = 8
			}
			cfg.Device = "meta"
			if err := cfg.Validate(); err != nil {
				return flagError(err)
			}
			rows, err := checkBugs(cmd.Context(), cfg, warmup)
			if err != nil {
				return err
			}
			printBugs(cmd.OutOrStdout(), cfg, warmup, rows, markdown)
			return nil
		},
	}
	addConfigFlags(cmd.Flags(), &cfg)
	cmd.Flags().StringVar(&preset, "preset", "", "start from a built-in workload: "+strings.Join(train.PresetNames(), ", "))
	cmd.Flags().IntVar(&warmup, "warmup", leaks.DefaultWarmup, "iterations left out before growth is measured")
	cmd.Flags().BoolVar(&markdown, "markdown", false, "print a markdown table")
	return cmd
}

// bugCheck is one recording and its checks.
type bugCheck struct {
	bug       string
	check     *triage.Check // as oomdbg check FILE
	strict    *triage.Check // as oomdbg check FILE --max-held 0
	result    *leaks.Result
	steps     int
	truncated bool
}

// checkBugs records cfg fixed and with each bug, and checks each recording.
func checkBugs(ctx context.Context, cfg train.Config, warmup int) ([]bugCheck, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	var rows []bugCheck
	for _, bug := range append([]string{""}, train.Bugs...) {
		c := cfg
		c.Bug = bug
		var buf bytes.Buffer
		res, err := train.Record(ctx, c, &buf, train.RecordOptions{ToolVersion: version})
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
		rows = append(rows, bugCheck{bug: bug, result: r, steps: res.Steps, truncated: res.OOM != nil || res.Interrupted,
			check:  triage.NewCheck("", r, triage.CheckLimits{}),
			strict: triage.NewCheck("", leaks.Analyze(tl, append([]leaks.Option{leaks.Warmup(warmup)}, strict.Options()...)...), strict)})
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
	}
	return rows, nil
}

// printBugs prints the checks as a table: the exit codes, the verdict, what grows or is held and what
// keeps it, and the finding on gradients.
func printBugs(w io.Writer, cfg train.Config, warmup int, rows []bugCheck, markdown bool) {
	name := cfg.Preset
	if name == "" {
		name = cfg.Model
	}
	fmt.Fprintf(w, "%s, batch %d, meta device, %d steps, warm-up %d, each recording checked as oomdbg check checks it:\n\n",
		name, cfg.Batch, cfg.Steps, warmup)
	header := []string{"bug", "the loop", "check", "check --max-held 0", "verdict", "grows or is held", "kept alive by", "gradients"}
	var cells [][]string
	exit := func(c *triage.Check) string {
		if c.Pass {
			return "0 pass"
		}
		return "1 fail"
	}
	for _, b := range rows {
		r := b.result
		bug := b.bug
		if bug == "" {
			bug = "none"
		}
		verdict := r.Verdict.Describe()
		if r.Verdict == leaks.Leak {
			verdict += " (" + r.Kind.Describe() + ")"
		}
		if b.truncated {
			verdict += fmt.Sprintf(", after %d of %d steps", b.steps, cfg.Steps)
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
		cells = append(cells, []string{bug, train.DescribeBug(b.bug), exit(b.check), exit(b.strict), verdict,
			strings.Join(amount, ", "), strings.Join(keeps, "; "), grads})
	}
	table.Write(w, header, cells, markdown, len(header))
}
