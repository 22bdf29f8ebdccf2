package app

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/allocator/replay"
	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/internal/outfile"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot/export"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/whatif"
)

// Report analyses the snapshot at path for oomdbg report, within lim, on a GPU of capacity bytes where the
// snapshot records none (0: none given). A file damaged part-way is reported up to the damage, with a
// warning on stderr and the damage as the snapshot's warning, which the report shows.
func Report(ctx context.Context, path string, lim *hostmem.Limit, capacity uint64, opts triage.Options, stderr io.Writer) (*triage.Report, error) {
	s, damage, err := Open(path, lim, load.CostAnalyse)
	if err != nil {
		return nil, err
	}
	if err := GiveCapacity(s, capacity); err != nil {
		return nil, err
	}
	if damage != nil {
		warn(stderr, "%v; reporting the %d events before the damage", damage, s.Events.Len())
		if s.Warning == nil {
			s.Warning = damage
		}
	}
	return triage.Analyze(ctx, timeline.New(s), opts), nil
}

// Diff compares the snapshots at a and b for oomdbg diff, one held at a time within lim.
func Diff(ctx context.Context, a, b string, lim *hostmem.Limit, warmup int) (*triage.Comparison, error) {
	var reports [2]*triage.Report
	for i, path := range []string{a, b} {
		if i > 0 {
			// The first snapshot is garbage once analysed (a Report holds none of it): collect it and give
			// its memory back, so that the peak is one snapshot's, not two.
			debug.FreeOSMemory()
		}
		s, err := load.File(path, load.WithBudget(lim.Budget(load.CostAnalyse)))
		if err != nil {
			return nil, lim.Explain(err)
		}
		reports[i] = triage.Analyze(ctx, timeline.New(s), triage.Options{File: path, Leaks: []leaks.Option{leaks.Warmup(warmup)}})
	}
	return triage.Diff(reports[0], reports[1]), nil
}

// Replay replays the PyTorch trace at path through the allocator model for oomdbg replay: under its
// recorded settings, and under tried when not nil, on capacity bytes (0: what the recording says). A
// recording cut short is replayed as far as it goes, with a warning on stderr.
func Replay(path string, tried *allocator.Config, capacity uint64, lim *hostmem.Limit, stderr io.Writer) (*replay.Report, error) {
	s, err := load.File(path, load.WithBudget(lim.Budget(load.CostReplay)))
	if err != nil {
		return nil, lim.Explain(err)
	}
	rep, err := replay.Run(filepath.Base(path), s, tried, capacity)
	if err != nil {
		return nil, traceError(path, s, err)
	}
	if s.Warning != nil { // an error says it alone
		warn(stderr, "%v; replayed the %d events it holds", s.Warning, s.Events.Len())
	}
	return rep, nil
}

// WhatIf applies fix to the trace at path and replays it, for oomdbg whatif, on gpuMem bytes (0: what the
// recording says). A recording cut short is changed as far as it goes, and the report notes it.
func WhatIf(path string, fix whatif.Fix, gpuMem uint64, lim *hostmem.Limit) (*whatif.Report, error) {
	s, err := load.File(path, load.WithBudget(lim.Budget(fix.EventCost())))
	if err != nil {
		return nil, lim.Explain(err)
	}
	rep, err := whatif.Evaluate(s, fix, gpuMem)
	if err != nil {
		return nil, traceError(path, s, err)
	}
	rep.File = filepath.Base(path)
	if s.Warning != nil {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%v: the figures are for the %d events it holds", s.Warning, s.Events.Len()))
	}
	return rep, nil
}

// ExportRequest is what oomdbg export writes.
type ExportRequest struct {
	In, Out string // the snapshot, and where to write (outfile's policy; "": In with the format's extension)
	Format  string // export.Formats; "": the one Out's extension says
	At      *string
	Device  *int
	Force   bool
	Memory  *hostmem.Limit
}

// Export writes the snapshot at req.In in another format for oomdbg export. A file damaged part-way is
// exported up to the damage, with a warning on stderr; one cut short, with the reader's warning. What was
// written is said in one line: on stdout, or on stderr when the export goes to standard output.
func Export(req ExportRequest, stdout, stderr io.Writer) error {
	f, err := exportFormat(req.Format, req.Out)
	if err != nil {
		return err
	}
	out := req.Out
	if out == "" {
		out = defaultExportName(req.In, f)
	}
	if out != "-" && samePath(req.In, out) {
		return fmt.Errorf("refusing to overwrite the input %s with the export (choose another -o)", req.In)
	}
	if req.Device != nil && *req.Device < 0 {
		return fmt.Errorf("--device %d: must be at least 0", *req.Device)
	}
	target, err := outfile.Check(out, req.Force, false)
	if err != nil {
		return err
	}
	opts := export.Options{Device: req.Device, JSONSize: jsonSizeCheck(req.Force, stderr)}
	if req.At != nil {
		at, err := export.ParseAt(*req.At)
		if err != nil {
			return fmt.Errorf("--at: %w", err)
		}
		opts.At = &at
	}
	s, damage, err := Open(req.In, req.Memory, load.CostExport)
	switch {
	case err != nil:
		return err
	case damage != nil:
		warn(stderr, "%v; exporting the %d events before the damage", damage, s.Events.Len())
	case s.Warning != nil:
		warn(stderr, "%v", s.Warning)
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

// exportFormat returns the format name names, or the one the output's extension implies.
func exportFormat(name, out string) (export.Format, error) {
	if name != "" {
		return export.ParseFormat(name)
	}
	if f, ok := export.FormatForFile(out); ok && out != "-" {
		return f, nil
	}
	return "", fmt.Errorf("say which format with --format (%s)", strings.Join(ExportFormats(), ", "))
}

// ExportFormats names the formats export writes.
func ExportFormats() []string {
	names := make([]string, len(export.Formats))
	for i, f := range export.Formats {
		names[i] = string(f)
	}
	return names
}

// defaultExportName is in with its snapshot extension replaced by the format's: run.oomdbg -> run.pickle.
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

// The JSON exports said before they are written, and refused without --force: JSON repeats every trace
// entry's stack in full, and a 373 KB snapshot became 309 MB, an 11.7-million-event one 17.9 GB.
const (
	jsonAnnounce = 64 << 20
	jsonLimit    = 1 << 30
)

// jsonSizeCheck is the export's JSONSize: past jsonLimit it refuses unless forced; past jsonAnnounce it says
// on stderr what it is about to write.
func jsonSizeCheck(force bool, stderr io.Writer) func(int64) error {
	return func(n int64) error {
		switch {
		case n > jsonLimit && !force:
			return fmt.Errorf("the export as JSON would take %s: it repeats every trace entry's stack in full "+
				"(--format torch shares them); --force writes it", units.FormatSize(n))
		case n > jsonAnnounce:
			fmt.Fprintf(stderr, "oomdbg: writing %s of JSON: it repeats every trace entry's stack in full "+
				"(--format torch shares them)\n", units.FormatSize(n))
		}
		return nil
	}
}
