package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/leaks"
)

func newDiffCmd() *cobra.Command {
	var format string
	var warmup int
	var mem memory
	cmd := &cobra.Command{
		Use:   "diff A B",
		Short: "Show what changed between two runs: peak, phases, categories, scopes",
		Long: `Compare two snapshots, say before and after a fix: the peaks of allocated and reserved memory, where
each peaked, the OOM, the leak verdict, the highest peak of every phase, and the bytes by category and
by module scope at the peak, largest changes first. Either file may be oomdbg's or a PyTorch memory
snapshot.`,
		Example: `  oomdbg run --preset gpt2-medium -o before.oomdbg
  oomdbg run --preset gpt2-medium --checkpoint all -o after.oomdbg
  oomdbg diff before.oomdbg after.oomdbg`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "text" && format != "markdown" && format != "md" {
				return fmt.Errorf("unknown format %q (want text or markdown)", format)
			}
			if warmup < 0 {
				return fmt.Errorf("--warmup %d: must be at least 0", warmup)
			}
			c, err := app.Diff(cmd.Context(), args[0], args[1], &mem.Limit, warmup)
			if err != nil {
				return err
			}
			if format == "text" {
				return c.WriteText(cmd.OutOrStdout())
			}
			return c.WriteMarkdown(cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVarP(&format, "format", "f", "text", "output format: text or markdown")
	cmd.Flags().IntVar(&warmup, "warmup", leaks.DefaultWarmup, "iterations left out before leaks are measured")
	addMemoryFlag(cmd.Flags(), &mem)
	return cmd
}
