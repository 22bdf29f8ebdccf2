package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/tracer/nvml"
	"github.com/oomdbg/oomdbg/tui"
)

func newViewCmd() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "view FILE",
		Short: "Open a snapshot in the TUI",
		Long: `Open a snapshot file in the terminal UI: the memory timeline with phase bands, stepping by event,
phase and iteration, the peak and the OOM, the live set with stacks and retainers, bytes by category,
the allocator's segments, leaks, and fixes that re-run the workload (for oomdbg's own snapshots).

--follow keeps reading a snapshot that is still being written (oomdbg run -o FILE in another shell).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := sniffFile(args[0])
			if err != nil {
				return err
			}
			switch format {
			case load.FormatNative: // streamed in, so a growing file can be followed
				return runTUI(cmd, tui.Options{File: args[0], Follow: follow})
			case load.FormatPyTorch:
				s, err := load.File(args[0])
				if err != nil {
					return err
				}
				return runTUI(cmd, tui.Options{File: args[0], Snapshot: s})
			}
			return fmt.Errorf("%s: %w", args[0], load.ErrUnknownFormat)
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep reading as the file grows")
	return cmd
}

// sniffFile reads the first bytes of path and says which snapshot format it holds.
func sniffFile(path string) (load.Format, error) {
	f, err := os.Open(path)
	if err != nil {
		return load.FormatUnknown, err
	}
	defer f.Close()
	head := make([]byte, 64)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return load.FormatUnknown, err
	}
	return load.Sniff(head[:n]), nil
}

// runTUI runs the terminal UI on the command's terminal until the user quits.
func runTUI(cmd *cobra.Command, opts tui.Options) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	opts.Version = toolVersion()
	opts.Profile = colorprofile.Detect(os.Stdout, os.Environ())
	opts.Devices = func() nvml.Report { return nvml.ReadReport() }
	p := tea.NewProgram(tui.New(ctx, opts), tea.WithContext(ctx), tea.WithInput(cmd.InOrStdin()), tea.WithOutput(cmd.OutOrStdout()))
	_, err := p.Run()
	if err == tea.ErrProgramKilled {
		return nil
	}
	return err
}

// isTerminal reports whether f is a terminal (a character device), where the TUI can run.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
