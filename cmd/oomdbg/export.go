package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/outfile"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/export"
	"github.com/oomdbg/oomdbg/snapshot/load"
)

func newExportCmd() *cobra.Command {
	var format, out, at string
	var device int
	var force bool
	var mem memory
	names := make([]string, len(export.Formats))
	for i, f := range export.Formats {
		names[i] = string(f)
	}
	cmd := &cobra.Command{
		Use:   "export FILE",
		Short: "Write a snapshot for PyTorch's memory_viz, pprof, Perfetto, or as a plot",
		Long: `Export an oomdbg snapshot or a PyTorch memory snapshot for other tools:

  torch       PyTorch's snapshot pickle: open it at https://pytorch.org/memory_viz, or with
              torch.cuda._memory_viz. Categories colour the blocks; "User Metadata" shows each
              block's module and tensor; iterations and phases are external_annotations
              (ProfilerStep#N, forward, backward, Optimizer.step#AdamW.step, ...).
  torch-json  the same document as JSON, which memory_viz also opens.
  pprof       the live set at one event (the peak unless --at says otherwise) as a heap profile:
              inuse_space and inuse_objects by stack, labelled with phase, category, scope,
              tensor and iteration. Read it with go tool pprof.
  perfetto    a Chrome trace for https://ui.perfetto.dev or chrome://tracing: allocated,
              reserved and per-category counters, iteration and phase slices, the peak and OOM.
  svg, png    the memory timeline with phases, the device's capacity, the peak and the OOM.

--format may be left out when OUT's extension says it (.pickle, .pb.gz, .trace.json, .svg, .png).
--at peak|oom|end|iteration-end:N|EVENT picks the event for pprof and marks it on traces and plots.
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
			opts := exportOptions{in: args[0], out: out, format: format, force: force, mem: &mem}
			if cmd.Flags().Changed("at") {
				opts.at = &at
			}
			if cmd.Flags().Changed("device") {
				opts.device = &device
			}
			return runExport(opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&format, "format", "", "output format: "+strings.Join(names, ", "))
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write ('-' for standard output; default: FILE with the format's extension)")
	cmd.Flags().StringVar(&at, "at", "peak", "event to profile (pprof) or mark: peak, oom, end, iteration-end:N or an event number")
	cmd.Flags().IntVar(&device, "device", 0, "export only this device's memory (default: every device)")
	cmd.Flags().BoolVar(&force, "force", false, "write through a symbolic link, or replace a read-only file")
	addMemoryFlag(cmd.Flags(), &mem)
	return cmd
}

// exportOptions are the export command's arguments.
type exportOptions struct {
	in, out, format string
	at              *string // nil when --at was not given
	device          *int    // nil when --device was not given
	force           bool
	mem             *memory
}

func runExport(o exportOptions, stdout, stderr io.Writer) error {
	f, err := exportFormat(o.format, o.out)
	if err != nil {
		return err
	}
	out := o.out
	if out == "" {
		out = defaultExportName(o.in, f)
	}
	if out != "-" && samePath(o.in, out) {
		return fmt.Errorf("refusing to overwrite the input %s with the export (choose another -o)", o.in)
	}
	if o.device != nil && *o.device < 0 {
		return fmt.Errorf("--device %d: must be at least 0", *o.device)
	}
	target, err := outfile.Check(out, o.force, false)
	if err != nil {
		return err
	}
	var opts export.Options
	opts.Device = o.device
	if o.at != nil {
		at, err := export.ParseAt(*o.at)
		if err != nil {
			return fmt.Errorf("--at: %w", err)
		}
		opts.At = &at
	}
	mem := o.mem
	if mem == nil {
		mem = &memory{}
	}
	s, err := loadForExport(o.in, mem, stderr)
	if err != nil {
		return err
	}
	if target.Kind == outfile.Stdout {
		if f.Binary() && outfile.IsTerminal(stdout) {
			return fmt.Errorf("refusing to write %s to a terminal: redirect standard output, or name a file with -o", f)
		}
		w := bufio.NewWriterSize(stdout, 1<<20)
		what, err := export.Write(w, s, f, opts)
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			return fmt.Errorf("writing to standard output: %w", err)
		}
		fmt.Fprintf(stderr, "wrote %s\n", what)
		return nil
	}
	what, err := target.WriteAtomic(func(w io.Writer) (string, error) { return export.Write(w, s, f, opts) })
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: %s\n", out, what)
	return nil
}

// exportFormat returns the format --format names, or the one the output's extension implies.
func exportFormat(name, out string) (export.Format, error) {
	if name != "" {
		return export.ParseFormat(name)
	}
	if f, ok := export.FormatForFile(out); ok && out != "-" {
		return f, nil
	}
	names := make([]string, len(export.Formats))
	for i, f := range export.Formats {
		names[i] = string(f)
	}
	return "", fmt.Errorf("say which format with --format (%s)", strings.Join(names, ", "))
}

// defaultExportName is FILE with its snapshot extension replaced by the format's: run.oomdbg -> run.pickle.
func defaultExportName(in string, f export.Format) string {
	base := in
	for _, ext := range []string{".oomdbg", ".pickle", ".pkl", ".json"} {
		if strings.HasSuffix(strings.ToLower(base), ext) {
			base = base[:len(base)-len(ext)]
			break
		}
	}
	return base + f.Extension()
}

// samePath reports whether a and b name the same file: the same cleaned absolute path, or, when both exist,
// the same file through links.
func samePath(a, b string) bool {
	aa, err1 := filepath.Abs(a)
	bb, err2 := filepath.Abs(b)
	if err1 == nil && err2 == nil && aa == bb {
		return true
	}
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// loadForExport opens a snapshot of any format oomdbg reads (load.File). A file damaged part-way is exported up
// to the damage, with a warning on stderr; an unreadable one is an error.
func loadForExport(path string, mem *memory, stderr io.Writer) (*snapshot.Snapshot, error) {
	s, err := openSnapshot(path, mem, costExport)
	switch {
	case err == nil:
		if s.Warning != nil {
			fmt.Fprintf(stderr, "oomdbg: warning: %v\n", s.Warning)
		}
		return s, nil
	case s != nil && load.Partial(s.Events.Len(), err):
		fmt.Fprintf(stderr, "oomdbg: warning: %v; exporting the %d events before the damage\n", err, s.Events.Len())
		return s, nil
	}
	return nil, err
}
