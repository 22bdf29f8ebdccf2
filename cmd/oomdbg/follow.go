package main

import (
	"context"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/recorder"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/tui"
)

// followDir runs the TUI on the snapshots oomdbg record writes into dir, moving to each newer one (the
// out-of-memory dump first), until the user quits or ctx ends.
func followDir(ctx context.Context, cmd *cobra.Command, keys io.Reader, dir string, gpuMem uint64, mem *memory) error {
	watch := &tui.Watch{
		Dir: dir,
		Newest: func() (string, time.Time, bool) {
			d, ok, err := recorder.Newest(dir)
			if err != nil || !ok {
				return "", time.Time{}, false
			}
			return d.Path, d.ModTime, true
		},
		Load: func(path string) (*snapshot.Snapshot, error) {
			s, _, err := app.Open(path, &mem.Limit, load.CostView)
			if err == nil {
				err = app.GiveCapacity(s, gpuMem)
			}
			return s, err
		},
	}
	sub := *cmd
	sub.SetContext(ctx)
	return runTUI(&sub, keys, tui.Options{Watch: watch})
}
