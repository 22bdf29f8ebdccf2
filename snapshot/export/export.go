package export

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// Format names an export format.
type Format string

// The formats.
const (
	FormatTorch     Format = "torch"      // PyTorch's snapshot pickle
	FormatTorchJSON Format = "torch-json" // the same document as JSON
	FormatPprof     Format = "pprof"      // gzipped profile.proto of live bytes by stack
	FormatPerfetto  Format = "perfetto"   // Chrome Trace Event Format JSON
	FormatSVG       Format = "svg"        // the timeline plot
	FormatPNG       Format = "png"        // the timeline plot, rasterised
)

// Formats lists every format, in the order help texts show them.
var Formats = []Format{FormatTorch, FormatTorchJSON, FormatPprof, FormatPerfetto, FormatSVG, FormatPNG}

// ErrFormat is wrapped by the error for a format name that is not one of Formats.
var ErrFormat = errors.New("unknown export format")

// ParseFormat returns the format named s.
func ParseFormat(s string) (Format, error) {
	for _, f := range Formats {
		if string(f) == s {
			return f, nil
		}
	}
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = string(f)
	}
	return "", fmt.Errorf("%w %q (want one of %s)", ErrFormat, s, strings.Join(names, ", "))
}

// Extension is the file name extension a file of the format usually has, with its dot.
func (f Format) Extension() string {
	switch f {
	case FormatTorch:
		return ".pickle"
	case FormatTorchJSON:
		return ".json"
	case FormatPprof:
		return ".pb.gz"
	case FormatPerfetto:
		return ".trace.json"
	case FormatSVG:
		return ".svg"
	case FormatPNG:
		return ".png"
	}
	return ""
}

// Binary reports whether files of the format are binary, not text: nothing to print on a terminal.
func (f Format) Binary() bool { return f == FormatTorch || f == FormatPprof || f == FormatPNG }

// FormatForFile guesses the format from a file name's extension: .pickle, .pkl, .pb.gz, .pprof, .trace.json,
// .svg, .png. A plain .json is ambiguous and guesses nothing.
func FormatForFile(name string) (Format, bool) {
	n := strings.ToLower(name)
	for _, c := range []struct {
		suffix string
		f      Format
	}{
		{".pickle", FormatTorch}, {".pkl", FormatTorch}, {".pb.gz", FormatPprof}, {".pprof", FormatPprof},
		{".trace.json", FormatPerfetto}, {".perfetto.json", FormatPerfetto}, {".svg", FormatSVG}, {".png", FormatPNG},
	} {
		if strings.HasSuffix(n, c.suffix) {
			return c.f, true
		}
	}
	return "", false
}

// Options configure Write.
type Options struct {
	// Device, when set, is the one device whose memory is exported; nil exports every device. Phase,
	// iteration and annotation markers are kept whatever the device, and event numbers (in At, and in
	// what the export shows) stay those of the whole snapshot.
	Device *int
	// At is the event a pprof profile describes (the peak when nil); plots and traces mark it. The torch
	// formats write the snapshot as it stood at that event: the trace up to it and the allocator's state
	// then, what torch.cuda.memory._dump_snapshot() would have written at that moment.
	At *At
	// Plot sizes the svg and png plots; zero fields take the defaults.
	Plot PlotOptions
	// JSONSize, when set, is told the bytes a torch-json export will take (TorchJSONSize) before any is
	// written; an error it returns ends the export there. JSON repeats every entry's stack in full, so a
	// snapshot of a few hundred kilobytes can take gigabytes.
	JSONSize func(bytes int64) error
}

// Write exports s in format f to w and returns a line that says what it wrote, e.g. "PyTorch memory
// snapshot: 1,587 trace entries and 7 segments (open it at https://pytorch.org/memory_viz)".
func Write(w io.Writer, s *snapshot.Snapshot, f Format, opts Options) (string, error) {
	if _, err := ParseFormat(string(f)); err != nil {
		return "", err
	}
	view, seqs, err := selectDevice(s, opts.Device)
	if err != nil {
		return "", err
	}
	tl := timeline.New(view)
	at := -1
	if opts.At != nil {
		if at, err = opts.At.resolve(tl, seqs, s.Events.Len()); err != nil {
			return "", err
		}
	}
	switch f {
	case FormatTorch, FormatTorchJSON:
		as := ""
		if at >= 0 {
			tl = timeline.New(view.Prefix(at + 1))
			as = fmt.Sprintf(" as it stood at %s (event %d)", opts.At, origSeq(seqs, at))
		}
		write := Torch
		if f == FormatTorchJSON {
			write = TorchJSON
			if opts.JSONSize != nil {
				n, err := TorchJSONSize(tl)
				if err != nil {
					return "", err
				}
				if err := opts.JSONSize(n); err != nil {
					return "", err
				}
			}
		}
		if err := write(w, tl); err != nil {
			return "", err
		}
		return describeTorch(tl, as), nil
	case FormatPprof:
		if at < 0 {
			at = tl.Peak(timeline.Allocated).Seq
		}
		p, err := pprofProfile(tl, at, origSeq(seqs, at))
		if err != nil {
			return "", err
		}
		if err := p.Write(w); err != nil {
			return "", err
		}
		what := "the peak"
		if opts.At != nil {
			what = opts.At.String()
		}
		return fmt.Sprintf("pprof profile of the live set at %s (event %d): %s in %d blocks", what, origSeq(seqs, at),
			units.FormatSize(tl.Allocated(at)), sampleBlocks(p)), nil
	case FormatPerfetto:
		n, err := perfetto(w, tl, traceOptions{mark: at, budget: maxCounterEvents, seq: seqs})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("Chrome/Perfetto trace: %s trace events over %s snapshot events", thousands(n), thousands(tl.Len())), nil
	case FormatSVG, FormatPNG:
		po := opts.Plot
		po.Mark, po.seq = at, seqs
		if opts.At != nil {
			po.MarkName = opts.At.String()
		}
		if err := writePlot(w, tl, f, po); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s timeline plot of %s events", strings.ToUpper(string(f)), thousands(tl.Len())), nil
	}
	return "", nil
}

// describeTorch says what a torch export holds, and as when: "" for the whole recording.
func describeTorch(tl *timeline.Timeline, as string) string {
	st := tl.Stats()
	entries := 0
	for a, n := range st.ByAction {
		if isAllocatorAction(snapshot.Action(a)) {
			entries += n
		}
	}
	segs := 0
	if f := tl.Snapshot().Footer; f != nil {
		segs = len(f.Segments)
	} else {
		segs = len(tl.SegmentsAt(tl.Len() - 1))
	}
	return fmt.Sprintf("PyTorch memory snapshot%s: %s trace entries and %s segments (open it at https://pytorch.org/memory_viz)",
		as, thousands(entries), thousands(segs))
}

// thousands formats n with thousands separators: 1,234,567.
func thousands(n int) string {
	s := strconv.Itoa(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// selectDevice returns the view of one device (Snapshot.DeviceView), s itself (and nil seqs) for none. A
// device the snapshot knows but that never held memory is refused, with the devices that did: its export
// would be an empty plot or trace that looks like a recording of nothing.
func selectDevice(s *snapshot.Snapshot, only *int) (*snapshot.Snapshot, []int, error) {
	if only == nil {
		return s, nil, nil
	}
	view, seqs, err := s.DeviceView(*only)
	if err != nil {
		return nil, nil, err
	}
	if with := s.DevicesWithMemory(); len(with) > 0 && !slices.Contains(with, *only) {
		names := make([]string, len(with))
		for i, d := range with {
			names[i] = strconv.Itoa(d)
		}
		return nil, nil, fmt.Errorf("device %d holds no memory in this snapshot; its memory is on device %s (--device %s)",
			*only, strings.Join(names, ", "), names[0])
	}
	return view, seqs, nil
}

// origSeq maps a seq of a device view back to the snapshot's numbering.
func origSeq(seqs []int, seq int) int {
	if seqs == nil || seq < 0 || seq >= len(seqs) {
		return seq
	}
	return seqs[seq]
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// workloadField returns a top-level field of Meta.Workload as text ("" when absent): a string as it is,
// anything else as its JSON.
func workloadField(m snapshot.Meta, key string) string {
	if len(m.Workload) == 0 {
		return ""
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(m.Workload, &fields); err != nil {
		return ""
	}
	raw, ok := fields[key]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(bytes.TrimSpace(raw))
}

// Title describes what a snapshot recorded, for plot titles and trace names: "oomdbg gpt2-medium (gpt, batch
// 16) on simulated GPU (meta)", "PyTorch snapshot (pickle, G4) on cuda:0".
func Title(m snapshot.Meta) string {
	var what string
	switch {
	case m.Source == "pytorch":
		what = "PyTorch snapshot"
		var parts []string
		for _, k := range []string{"format", "generation"} {
			if v := workloadField(m, k); v != "" {
				parts = append(parts, v)
			}
		}
		if len(parts) > 0 {
			what += " (" + strings.Join(parts, ", ") + ")"
		}
	default:
		what = cmpOr(m.Tool, "oomdbg")
		model, preset := workloadField(m, "model"), workloadField(m, "preset")
		var parts []string
		if model != "" && model != preset {
			parts = append(parts, model)
		}
		if b := workloadField(m, "batch"); b != "" && b != "0" {
			parts = append(parts, "batch "+b)
		}
		switch {
		case preset != "":
			what += " " + preset
		case model != "":
			what += " " + model
			parts = parts[1:]
		}
		if len(parts) > 0 {
			what += " (" + strings.Join(parts, ", ") + ")"
		}
	}
	var devs []string
	for _, d := range m.Devices {
		devs = append(devs, d.Name)
	}
	if len(devs) > 0 {
		what += " on " + strings.Join(devs, ", ")
	}
	return what
}
