package main

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/app"
)

func newExportCmd() *cobra.Command {
	var req app.ExportRequest
	var at string
	var device int
	var mem memory
	cmd := &cobra.Command{
		Use:   "export FILE",
		Short: "Write a snapshot for PyTorch's memory_viz, pprof, Perfetto, or as a plot",
		Long: `Export an oomdbg snapshot or a PyTorch memory snapshot for other tools:

  torch       PyTorch's snapshot pickle: open it at https://pytorch.org/memory_viz, or with
              torch.cuda._memory_viz. Categories colour the blocks; "User Metadata" shows each
              block's module, which oomdbg reads back as its scope, and tensor; iterations and phases
              are external_annotations (ProfilerStep#N, forward, backward, Optimizer.step#AdamW.step, ...).
  torch-json  the same document as JSON, which memory_viz also opens. JSON repeats every entry's
              stack in full: its size is said first past 64 MiB, and past 1 GiB it takes --force.
  pprof       the live set at one event (the peak unless --at says otherwise) as a heap profile:
              inuse_space and inuse_objects by stack, labelled with phase, category, scope,
              tensor and iteration. Read it with go tool pprof.
  perfetto    a Chrome trace for https://ui.perfetto.dev or chrome://tracing: allocated,
              reserved and per-category counters, iteration and phase slices, the peak and OOM.
  svg, png    the memory timeline with phases, the device's capacity, the peak and the OOM.

--format may be left out when OUT's extension says it (.pickle, .pb.gz, .trace.json, .svg, .png).
--at peak|oom|end|iteration-end:N|EVENT picks the event for pprof and marks it on traces and plots; torch
and torch-json then write the snapshot as it stood at that event, as _dump_snapshot() would have written it
then: the trace up to it and the allocator's segments at it.
To find a leak, export the live set at the end of two iterations and let pprof subtract them.

-o - (or /dev/stdout) writes to standard output, and the summary line goes to standard error. An
existing regular file is replaced whole, once the export is complete; a symbolic link or a read-only
file only with --force (which writes to what the link points to, and keeps the link); a directory, a
device, a FIFO or a socket never.`,
		Example: `  oomdbg export run.oomdbg --format torch -o run.pickle
  oomdbg export run.oomdbg -o run.trace.json
  oomdbg export run.oomdbg --format pprof --at oom -o oom.pb.gz && go tool pprof -top oom.pb.gz
  oomdbg export leak.oomdbg --format pprof --at iteration-end:2 -o a.pb.gz
  oomdbg export leak.oomdbg --format pprof --at iteration-end:5 -o b.pb.gz
  go tool pprof -top -diff_base a.pb.gz b.pb.gz
  oomdbg export dump_snapshot.pickle --format png --device 0 -o memory.png`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.In, req.Memory = args[0], &mem.Limit
			if cmd.Flags().Changed("at") {
				req.At = &at
			}
			if cmd.Flags().Changed("device") {
				req.Device = &device
			}
			return app.Export(req, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&req.Format, "format", "", "output format: "+strings.Join(app.ExportFormats(), ", "))
	cmd.Flags().StringVarP(&req.Out, "output", "o", "", "file to write ('-' for standard output; default: FILE with the format's extension)")
	cmd.Flags().StringVar(&at, "at", "", "event to profile (pprof), mark (perfetto, svg, png) or write the snapshot as at (torch, torch-json): peak, oom, end, iteration-end:N or an event number (default: the peak for pprof, the whole recording for torch; none marked on the others)")
	cmd.Flags().IntVar(&device, "device", 0, "export only this device's memory (default: every device)")
	cmd.Flags().BoolVar(&req.Force, "force", false, "write through a symbolic link, replace a read-only file, or write torch-json past 1 GiB")
	addMemoryFlag(cmd.Flags(), &mem)
	return cmd
}
