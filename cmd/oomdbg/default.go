package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/backend"
	"github.com/oomdbg/oomdbg/tui"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// runDefault is oomdbg without arguments: the default workload (GPT-2 medium at batch 16 on a 24 GiB card,
// which runs out of memory as configured) recorded on the meta device. In a terminal it opens the TUI, which
// streams the run in and lands on the OOM; otherwise it prints the summary, the snapshot goes to the
// temporary directory, and the exit code is run's: 1, since the workload runs out of memory.
func runDefault(cmd *cobra.Command) error {
	cfg, err := train.PresetConfig(train.DefaultPreset)
	if err != nil {
		return err
	}
	if isTerminal(os.Stdin) && isTerminal(os.Stdout) {
		w, err := backend.Workload(cfg)
		if err != nil {
			return err
		}
		return runTUI(cmd, os.Stdin, tui.Options{Workload: &w})
	}
	out := filepath.Join(os.TempDir(), fmt.Sprintf("oomdbg-%s-%d.oomdbg", train.DefaultPreset, os.Getpid()))
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "Recording the built-in %s workload on the meta device (see oomdbg --help for everything else).\n\n", train.DefaultPreset)
	err = runRecord(cmd.Context(), cfg, recordTarget{path: out}, w, cmd.ErrOrStderr())
	if _, oom := err.(*problemError); oom {
		fmt.Fprintf(w, "\nSee what each fix would do:  oomdbg fixes\n")
		fmt.Fprintf(w, "Record it fixed:             oomdbg run --preset %s --amp bf16 --attention flash --checkpoint all\n", train.DefaultPreset)
	}
	return err
}
