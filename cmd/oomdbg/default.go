package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// runDefault is oomdbg without arguments: it records the default workload (GPT-2 medium at batch 16 on a
// 24 GiB card, which runs out of memory as configured) on the meta device and explains what happened. The
// snapshot goes to the temporary directory; its path is printed.
func runDefault(cmd *cobra.Command) error {
	cfg, err := train.PresetConfig(train.DefaultPreset)
	if err != nil {
		return err
	}
	out := filepath.Join(os.TempDir(), fmt.Sprintf("oomdbg-%s-%d.oomdbg", train.DefaultPreset, os.Getpid()))
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "Recording the built-in %s workload on the meta device (see oomdbg --help for everything else).\n\n", train.DefaultPreset)
	err = runRecord(cmd.Context(), cfg, out, w, cmd.ErrOrStderr())
	if _, oom := err.(*problemError); oom {
		// The default workload runs out of memory by design: that is what there is to see, not a failure.
		fmt.Fprintf(w, "\nSee what each fix would do:  oomdbg fixes\n")
		fmt.Fprintf(w, "Record it fixed:             oomdbg run --preset %s --amp bf16 --attention flash --checkpoint all\n", train.DefaultPreset)
		return nil
	}
	return err
}
