package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/internal/backend"
	"github.com/oomdbg/oomdbg/tui"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// Exit codes, the same for every command.
const (
	exitOK      = 0               // all went well
	exitProblem = app.ExitProblem // a check found a problem (a leak, a budget broken): *app.ProblemError
	exitUsage   = 2               // bad usage or unreadable input
)

// run executes the command line args under ctx and returns the process exit code. Errors print as one line
// on stderr; an error with an ExitCode (app.ProblemError, app.SignalError) exits with it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) && pe.Op == "write" && pe.Path == "/dev/stdout" {
		err = fmt.Errorf("cannot write standard output: %w", pe.Err) // an encoder's error, said as checkedWriter says it
	}
	fmt.Fprintf(stderr, "oomdbg: %v\n", err)
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode()
	}
	return exitUsage
}

// strconvPrefix is what strconv puts before the reason of a number that does not parse.
var strconvPrefix = regexp.MustCompile(`strconv\.Parse\w+: parsing "[^"]*": `)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "oomdbg",
		Short: "Debug GPU out-of-memory errors and memory leaks in neural-network training",
		Long: `oomdbg records every GPU allocation of a training workload, with its stack and what it is
(phase, iteration, module, parameter/gradient/optimizer state/activation), into a snapshot file,
and explains the peak, the out-of-memory error and the leaks it finds.

Run without a command, it records the built-in gpt2-medium workload (batch 16 on a 24 GiB card, on
the meta device) and opens the TUI on it as it streams in, landing on its out-of-memory error;
without a terminal it prints the summary instead. oomdbg view opens a snapshot file, and every
command that reads one also reads PyTorch's (torch.cuda.memory._dump_snapshot).`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE:          runDefault,
	}
	// Usage mistakes (unknown flag, bad value) print one line and exit 2, like every other bad input.
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		// pflag's number errors quote strconv ("strconv.ParseInt: parsing "9...9": value out of range"): the
		// flag and its value are already in the message.
		msg := strconvPrefix.ReplaceAllString(err.Error(), "")
		return fmt.Errorf("%s (see '%s --help')", msg, cmd.CommandPath())
	})
	root.AddCommand(newRunCmd(), newViewCmd(), newReportCmd(), newCheckCmd(), newDiffCmd(), newReplayCmd(), newWhatIfCmd(), newExportCmd(), newFixesCmd(), newFitCmd(), newLayoutsCmd(), newBugsCmd(), newDevicesCmd(), newVersionCmd(), newRecordCmd())
	return root
}

// runDefault is oomdbg without arguments: the default workload (GPT-2 medium at batch 16 on a 24 GiB card,
// which runs out of memory as configured) recorded on the meta device. In a terminal it opens the TUI, which
// streams the run in and lands on the OOM; otherwise it prints the summary (app.RecordDefault).
func runDefault(cmd *cobra.Command, _ []string) error {
	if !isTerminal(os.Stdin) || !isTerminal(os.Stdout) {
		return app.RecordDefault(cmd.Context(), toolVersion(), cmd.OutOrStdout(), cmd.ErrOrStderr())
	}
	cfg, err := train.PresetConfig(train.DefaultPreset)
	if err != nil {
		return err
	}
	w, err := backend.Workload(cfg)
	if err != nil {
		return err
	}
	return runTUI(cmd, os.Stdin, tui.Options{Workload: &w})
}
