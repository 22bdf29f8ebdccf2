package main

import (
	"errors"
	"fmt"
	"io"
	"regexp"

	"github.com/spf13/cobra"
)

// Exit codes, the same for every command.
const (
	exitOK      = 0 // all went well
	exitProblem = 1 // a check found a problem (a leak, a budget broken)
	exitUsage   = 2 // bad usage or unreadable input
)

// problemError is returned by a command that ran fine but found a problem; it exits 1.
type problemError struct{ msg string }

func (e *problemError) Error() string { return e.msg }

// run executes the command line args and returns the process exit code. Errors print as one line on stderr.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "oomdbg: %v\n", err)
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode()
	}
	var p *problemError
	if errors.As(err, &p) {
		return exitProblem
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
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDefault(cmd)
		},
	}
	// Usage mistakes (unknown flag, bad value) print one line and exit 2, like every other bad input.
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		// pflag's number errors quote strconv ("strconv.ParseInt: parsing "9...9": value out of range"): the
		// flag and its value are already in the message.
		msg := strconvPrefix.ReplaceAllString(err.Error(), "")
		return fmt.Errorf("%s (see '%s --help')", msg, cmd.CommandPath())
	})
	root.AddCommand(newRunCmd(), newViewCmd(), newReportCmd(), newCheckCmd(), newDiffCmd(), newReplayCmd(), newWhatIfCmd(), newExportCmd(), newFixesCmd(), newFitCmd(), newBugsCmd(), newDevicesCmd(), newVersionCmd(), newRecordCmd())
	return root
}
