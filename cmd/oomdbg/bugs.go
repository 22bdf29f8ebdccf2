package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/fixes"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/train"
)

func newBugsCmd() *cobra.Command {
	var warmup int
	var markdown bool
	var flags *configFlags
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
			for _, name := range bugsFixed {
				if cmd.Flags().Changed(name) {
					return fmt.Errorf("--%s does not apply: bugs records each leak bug and the fixed loop on the meta device", name)
				}
			}
			cfg, err := flags.config()
			if err != nil {
				return err
			}
			cfg.Device = device.Meta // a preset's or config.json's, which is meta too
			rows, err := fixes.CheckBugs(cmd.Context(), cfg, warmup, toolVersion())
			if err != nil {
				return flags.explain(err)
			}
			out := &checkedWriter{w: cmd.OutOrStdout()}
			fixes.WriteBugs(out, cfg, warmup, rows, markdown)
			return out.Err()
		},
	}
	defaults := train.DefaultMLP()
	defaults.Steps = 8
	flags = addConfigFlags(cmd.Flags(), defaults)
	flags.own("steps") // 8 whatever the model: enough iterations after the warm-up for a verdict
	for _, name := range bugsFixed {
		cmd.Flags().MarkHidden(name)
	}
	flags.showDefaults()
	cmd.Flags().IntVar(&warmup, "warmup", leaks.DefaultWarmup, "iterations left out before growth is measured")
	cmd.Flags().BoolVar(&markdown, "markdown", false, "print a markdown table")
	return cmd
}

// bugsFixed are run's flags that bugs sets itself, hidden from bugs --help and refused: it records on the
// meta device, once per bug and once fixed.
var bugsFixed = []string{"device", "bug"}
