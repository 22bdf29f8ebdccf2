package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/term"
	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/internal/backend"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/tracer/nvml"
	"github.com/oomdbg/oomdbg/tui"
)

func newViewCmd() *cobra.Command {
	var follow bool
	var gpuMem uint64
	var mem memory
	cmd := &cobra.Command{
		Use:   "view FILE...",
		Short: "Open a snapshot in the TUI",
		Long: `Open a snapshot file in the terminal UI: the memory timeline with phase bands, stepping by event,
phase and iteration, the peak and the OOM, the live set with stacks and retainers, bytes by category,
the allocator's segments, leaks, and fixes that re-run the workload (for oomdbg's own snapshots).

--follow keeps reading a snapshot that is still being written (oomdbg run -o FILE in another shell).
view --follow DIR follows the snapshots oomdbg record writes into DIR: it shows the newest, moves
to each newer one as it is written, and lands on the out-of-memory error when one is.
FILE may be a pipe or '-' for standard input (oomdbg run -o - | oomdbg view -); keys are then read
from the terminal. view needs a terminal: without one it says so and exits 2 (oomdbg report prints
the same analysis as text).

With several files, the snapshots of a data-parallel job's ranks, it reads them all in parallel (as report
does), opens the rank that ran out of memory or peaks highest, and adds a Ranks pane (7) with every rank's
peak and phase side by side, from which enter opens another.

--gpu-mem gives the GPU's memory where the snapshot does not record it (PyTorch's do not): the timeline's
axis, the OOM's message and the verdicts of the fixes pane then use it.`,
		Args: snapshotArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return viewRanks(cmd, args, follow, gpuMem, &mem)
			}
			path := args[0]
			keys, closeKeys, err := viewTerminal(cmd, path)
			if err != nil {
				return err
			}
			defer closeKeys()
			ctx := cmd.Context()
			if st, err := os.Stat(path); err == nil && st.IsDir() && follow {
				return followDir(ctx, cmd, keys, path, gpuMem, &mem) // oomdbg record's snapshots, as they are written
			}
			opts, closeIn, err := viewOptions(ctx, path, follow, gpuMem, &mem)
			if err != nil {
				return err
			}
			defer closeIn()
			return runTUI(cmd, keys, opts)
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep reading as the file grows")
	addGPUMemFlag(cmd.Flags(), &gpuMem)
	addMemoryFlag(cmd.Flags(), &mem)
	return cmd
}

// viewOptions opens the snapshot at path for the TUI, within mem: oomdbg's own streamed in (so that a
// growing file can be followed, and a long one paged), PyTorch's imported whole. closeIn closes the input
// once the TUI is done with it.
func viewOptions(ctx context.Context, path string, follow bool, gpuMem uint64, mem *memory) (opts tui.Options, closeIn func(), err error) {
	lopts := []load.Option{load.WithBudget(mem.Budget(load.CostView))}
	if follow {
		lopts = append(lopts, load.WithFollow(ctx))
	}
	in, err := load.Open(path, lopts...)
	if err != nil {
		return tui.Options{}, nil, err
	}
	switch {
	case in.Format == load.FormatNative && gpuMem == 0: // streamed in, so a growing file can be followed
		lim := snapshot.Limits{Events: mem.Budget(load.CostView).MaxEvents()}
		return tui.Options{File: path, Input: in.Reader(), Follow: follow, Limits: lim, MemoryBudget: mem.Hold(tui.DefaultMemoryBudget)},
			func() { in.Close() }, nil
	case in.Format == load.FormatNative && follow:
		in.Close()
		return tui.Options{}, nil, errors.New("--gpu-mem is for snapshots that do not record their GPU's memory (PyTorch's); oomdbg's own, which --follow streams, do")
	}
	defer in.Close()
	s, err := in.Load()
	if err != nil {
		return tui.Options{}, nil, mem.Explain(err)
	}
	if err := app.GiveCapacity(s, gpuMem); err != nil {
		return tui.Options{}, nil, err
	}
	return tui.Options{File: path, Snapshot: s}, func() {}, nil
}

// viewTerminal returns where the TUI reads keys: standard input, or the terminal itself when standard input
// is the snapshot. Without a terminal to read keys from and draw on, it is an error: the TUI would wait for
// keys that never come.
func viewTerminal(cmd *cobra.Command, path string) (keys io.Reader, closeKeys func(), err error) {
	if f, ok := cmd.OutOrStdout().(*os.File); !ok || !isTerminal(f) {
		return nil, nil, errors.New("view needs a terminal, and standard output is not one; oomdbg report FILE prints the analysis as text")
	}
	if path == "-" {
		tty, err := os.Open("/dev/tty")
		if err != nil {
			return nil, nil, errors.New("view - reads the snapshot from standard input and keys from the terminal, and there is no terminal")
		}
		return tty, func() { tty.Close() }, nil
	}
	if f, ok := cmd.InOrStdin().(*os.File); !ok || !isTerminal(f) {
		return nil, nil, errors.New("view needs a terminal, and standard input is not one; oomdbg report FILE prints the analysis as text")
	}
	return cmd.InOrStdin(), func() {}, nil
}

// runTUI runs the terminal UI on the command's terminal, reading keys from keys, until the user quits.
func runTUI(cmd *cobra.Command, keys io.Reader, opts tui.Options) error {
	opts.Backend = backend.Backend{Version: toolVersion()}
	opts.Profile = colorprofile.Detect(os.Stdout, os.Environ())
	opts.Devices = func() nvml.Report { return nvml.ReadReport() }
	return tui.Run(cmd.Context(), opts, keys, cmd.OutOrStdout())
}

// isTerminal reports whether f is a terminal, where the TUI can run (not merely a character device such as
// /dev/null).
func isTerminal(f *os.File) bool { return term.IsTerminal(f.Fd()) }

// viewRanks opens a job's ranks: all read and reported in parallel, the worst shown, the others a Ranks
// pane away.
func viewRanks(cmd *cobra.Command, files []string, follow bool, gpuMem uint64, mem *memory) error {
	if follow {
		return fmt.Errorf("--follow follows one file: give one")
	}
	for _, f := range files {
		if f == "-" {
			return fmt.Errorf("a job's ranks are files: '-' (standard input) cannot be one of several")
		}
	}
	keys, closeKeys, err := viewTerminal(cmd, files[0])
	if err != nil {
		return err
	}
	defer closeKeys()
	t, _ := app.ReportRanks(cmd.Context(), files, &mem.Limit, gpuMem, leaks.DefaultWarmup) // the TUI shows what went wrong
	if t.Worst < 0 {
		return fmt.Errorf("none of the %d files could be read", len(files))
	}
	load := func(path string) (*snapshot.Snapshot, error) {
		s, _, err := app.Open(path, &mem.Limit, load.CostView)
		if err == nil {
			err = app.GiveCapacity(s, gpuMem)
		}
		return s, err
	}
	s, err := load(files[t.Worst])
	if err != nil {
		return err
	}
	return runTUI(cmd, keys, tui.Options{File: files[t.Worst], Snapshot: s, Ranks: t, Load: load})
}
