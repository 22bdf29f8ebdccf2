package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
)

// recordForExport records a short run of the tiny GPT on the meta device into dir and returns its path.
func recordForExport(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "run.oomdbg")
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"run", "--preset", "tiny", "--device", "meta", "--steps", "3", "-o", path}, &out, &errOut); code != exitOK {
		t.Fatalf("recording exited %d: %s", code, errOut.String())
	}
	return path
}

func TestExport(t *testing.T) {
	dir := t.TempDir()
	in := recordForExport(t, dir)
	pickle := filepath.Join(dir, "run.pickle")
	notSnapshot := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(notSnapshot, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A real snapshot of two devices whose segments are all on device 1 (its MANIFEST says so).
	device1 := torchtest.FixturePath(t, "f4_2024_time_us_no_settings_2dev.pickle")
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     string // a substring of stdout
		stderrLine string // the one line stderr must hold exactly, if set
		file       string // a file that must exist afterwards
		prefix     string // its first bytes
	}{
		{name: "torch", args: []string{"export", in, "--format", "torch", "-o", pickle}, code: exitOK,
			stdout: "wrote " + pickle + ": PyTorch memory snapshot: ", file: pickle, prefix: "\x80\x04\x95"},
		{name: "the pickle back in, as pprof", args: []string{"export", pickle, "--format", "pprof", "-o", filepath.Join(dir, "p.pb.gz")}, code: exitOK,
			stdout: "pprof profile of the live set at the peak", file: filepath.Join(dir, "p.pb.gz"), prefix: "\x1f\x8b"},
		{name: "format from the extension", args: []string{"export", in, "-o", filepath.Join(dir, "t.trace.json")}, code: exitOK,
			stdout: "Chrome/Perfetto trace", file: filepath.Join(dir, "t.trace.json"), prefix: `{"displayTimeUnit"`},
		{name: "default output name", args: []string{"export", in, "--format", "svg"}, code: exitOK,
			stdout: "wrote " + filepath.Join(dir, "run.svg"), file: filepath.Join(dir, "run.svg"), prefix: "<?xml"},
		{name: "json", args: []string{"export", in, "--format", "torch-json", "-o", filepath.Join(dir, "s.json")}, code: exitOK,
			file: filepath.Join(dir, "s.json"), prefix: "{\n\"segments\":["},
		{name: "png at an iteration's end", args: []string{"export", in, "--format", "png", "--at", "iteration-end:1", "-o", filepath.Join(dir, "m.png")}, code: exitOK,
			file: filepath.Join(dir, "m.png"), prefix: "\x89PNG"},
		{name: "the only device", args: []string{"export", in, "--format", "svg", "--device", "0", "-o", filepath.Join(dir, "d0.svg")}, code: exitOK,
			stdout: "SVG timeline plot", file: filepath.Join(dir, "d0.svg"), prefix: "<?xml"},
		{name: "pprof at an iteration's end", args: []string{"export", in, "--format", "pprof", "--at", "iteration-end:2", "-o", filepath.Join(dir, "b.pb.gz")}, code: exitOK,
			stdout: "at iteration-end:2 (event "},
		{name: "torch as at the peak", args: []string{"export", in, "--format", "torch", "--at", "peak", "-o", filepath.Join(dir, "w.pickle")}, code: exitOK,
			stdout: "PyTorch memory snapshot as it stood at peak (event ", file: filepath.Join(dir, "w.pickle"), prefix: "\x80\x04\x95"},

		{name: "unknown format", args: []string{"export", in, "--format", "html", "-o", filepath.Join(dir, "x.html")}, code: exitUsage,
			stderrLine: `oomdbg: unknown export format "html" (want one of torch, torch-json, pprof, perfetto, svg, png)`},
		{name: "no format", args: []string{"export", in, "-o", filepath.Join(dir, "x.json")}, code: exitUsage,
			stderrLine: "oomdbg: say which format with --format (torch, torch-json, pprof, perfetto, svg, png)"},
		{name: "overwriting the input", args: []string{"export", pickle, "--format", "torch"}, code: exitUsage,
			stderrLine: "oomdbg: refusing to overwrite the input " + pickle + " with the export (choose another -o)"},
		{name: "overwriting the input by another name", args: []string{"export", in, "--format", "torch", "-o", filepath.Join(dir, ".", "run.oomdbg")}, code: exitUsage,
			stderrLine: "oomdbg: refusing to overwrite the input " + in + " with the export (choose another -o)"},
		{name: "missing file", args: []string{"export", filepath.Join(dir, "nothere"), "--format", "svg"}, code: exitUsage,
			stderrLine: "oomdbg: open " + filepath.Join(dir, "nothere") + ": no such file or directory"},
		{name: "not a snapshot", args: []string{"export", notSnapshot, "--format", "svg", "-o", filepath.Join(dir, "n.svg")}, code: exitUsage,
			stderrLine: "oomdbg: " + notSnapshot + " is neither an oomdbg snapshot nor a PyTorch memory snapshot (pickle or JSON)"},
		{name: "bad --at", args: []string{"export", in, "--format", "pprof", "--at", "top", "-o", filepath.Join(dir, "y.pb.gz")}, code: exitUsage,
			stderrLine: `oomdbg: --at: bad event "top" (want peak, oom, end, iteration-end:N or an event number)`},
		{name: "no OOM to profile", args: []string{"export", in, "--format", "pprof", "--at", "oom", "-o", filepath.Join(dir, "z.pb.gz")}, code: exitUsage,
			stderrLine: "oomdbg: the snapshot has no OOM (try --at peak)"},
		{name: "no such device", args: []string{"export", in, "--format", "svg", "--device", "3", "-o", filepath.Join(dir, "d.svg")}, code: exitUsage,
			stderrLine: "oomdbg: the snapshot has no device 3 (it has 0)"},
		{name: "a device that holds no memory", args: []string{"export", device1, "--format", "svg", "--device", "0", "-o", filepath.Join(dir, "e.svg")}, code: exitUsage,
			stderrLine: "oomdbg: device 0 holds no memory in this snapshot; its memory is on device 1 (--device 1)"},
		{name: "the device that does", args: []string{"export", device1, "--format", "svg", "--device", "1", "-o", filepath.Join(dir, "e1.svg")}, code: exitOK,
			stdout: "SVG timeline plot", file: filepath.Join(dir, "e1.svg"), prefix: "<?xml"},
		{name: "no file argument", args: []string{"export", "--format", "svg"}, code: exitUsage,
			stderrLine: "oomdbg: accepts 1 arg(s), received 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), tc.args, &out, &errOut)
			if code != tc.code {
				t.Fatalf("exit code %d, want %d (stderr %q)", code, tc.code, errOut.String())
			}
			if !strings.Contains(out.String(), tc.stdout) {
				t.Errorf("stdout %q does not contain %q", out.String(), tc.stdout)
			}
			if tc.code == exitOK && (errOut.Len() != 0 || strings.Count(out.String(), "\n") != 1) {
				t.Errorf("on success: stdout %q, stderr %q; want one line on stdout", out.String(), errOut.String())
			}
			if tc.stderrLine != "" && errOut.String() != tc.stderrLine+"\n" {
				t.Errorf("stderr %q, want the one line %q", errOut.String(), tc.stderrLine)
			}
			if tc.file != "" {
				data, err := os.ReadFile(tc.file)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.HasPrefix(data, []byte(tc.prefix)) {
					t.Errorf("%s starts %q, want %q", tc.file, data[:min(len(data), 16)], tc.prefix)
				}
			}
		})
	}
	// Failed exports leave nothing behind: no output, no temporary file.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch name := e.Name(); {
		case strings.HasSuffix(name, ".tmp"), name == "z.pb.gz", name == "e.svg", name == "y.pb.gz", name == "d.svg":
			t.Errorf("a failed export left %s", name)
		}
	}
}

// TestExportToStdout writes the export to standard output and says what it wrote on standard error.
func TestExportToStdout(t *testing.T) {
	in := recordForExport(t, t.TempDir())
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"export", in, "--format", "pprof", "--at", "end", "-o", "-"}, &out, &errOut); code != exitOK {
		t.Fatalf("exit code %d: %s", code, errOut.String())
	}
	if !bytes.HasPrefix(out.Bytes(), []byte("\x1f\x8b")) {
		t.Errorf("stdout starts %q, want a gzipped profile", out.Bytes()[:min(out.Len(), 8)])
	}
	if !strings.HasPrefix(errOut.String(), "wrote pprof profile of the live set at end") || strings.Count(errOut.String(), "\n") != 1 {
		t.Errorf("stderr %q", errOut.String())
	}
}
