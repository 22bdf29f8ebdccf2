package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
)

// TestExportTargets holds export to the output policy: it replaces regular files only, refuses links and
// read-only files unless --force, and names the target, never its temporary file, in every error.
func TestExportTargets(t *testing.T) {
	dir := t.TempDir()
	in := recordForExport(t, dir)
	regular := filepath.Join(dir, "old.svg")
	readOnly := filepath.Join(dir, "ro.svg")
	target := filepath.Join(dir, "target.svg")
	link := filepath.Join(dir, "link.svg")
	dangling := filepath.Join(dir, "dangling.svg")
	fifo := filepath.Join(dir, "fifo.svg")
	sub := filepath.Join(dir, "sub.svg")
	for path, data := range map[string]string{regular: "old", readOnly: "keep", target: "old"} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(readOnly, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "made-by-link.svg"), dangling); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	export := func(out string, more ...string) []string {
		return append([]string{"export", in, "--format", "svg", "-o", out}, more...)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string // the one line on stderr, "" for none
		svg    string // a path that must hold the export afterwards
		kept   string // a path that must be as it was: "path=content"
	}{
		{name: "new file", args: export(filepath.Join(dir, "new.svg")), svg: filepath.Join(dir, "new.svg")},
		{name: "regular file replaced", args: export(regular), svg: regular},
		{name: "read-only refused", args: export(readOnly), code: exitUsage,
			stderr: "oomdbg: refusing to replace " + readOnly + ": it is read-only (--force replaces it)", kept: readOnly + "=keep"},
		{name: "symlink refused", args: export(link), code: exitUsage,
			stderr: "oomdbg: refusing to write " + link + ": it is a symbolic link (--force writes to what it links to)", kept: target + "=old"},
		{name: "symlink with --force", args: export(link, "--force"), svg: target},
		{name: "dangling symlink with --force", args: export(dangling, "--force"), svg: filepath.Join(dir, "made-by-link.svg")},
		{name: "fifo refused", args: export(fifo), code: exitUsage,
			stderr: "oomdbg: refusing to replace " + fifo + ": it is a FIFO, not a regular file"},
		{name: "directory refused", args: export(sub), code: exitUsage,
			stderr: "oomdbg: refusing to replace " + sub + ": it is a directory, not a regular file"},
		{name: "device refused", args: export("/dev/full"), code: exitUsage,
			stderr: "oomdbg: refusing to replace /dev/full: it is a character device, not a regular file"},
		{name: "missing directory", args: export(filepath.Join(dir, "nodir", "x.svg")), code: exitUsage,
			stderr: "oomdbg: cannot write " + filepath.Join(dir, "nodir", "x.svg") + ": no such file or directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, stderr)
			}
			if tc.stderr != "" && stderr != tc.stderr+"\n" {
				t.Errorf("stderr %q, want the one line %q", stderr, tc.stderr)
			}
			if tc.code == exitOK && !strings.HasPrefix(stdout, "wrote "+tc.args[5]) {
				t.Errorf("stdout %q", stdout)
			}
			if tc.svg != "" {
				data, err := os.ReadFile(tc.svg)
				if err != nil || !bytes.HasPrefix(data, []byte("<?xml")) {
					t.Errorf("%s holds %.20q, %v; want the SVG", tc.svg, data, err)
				}
			}
			if path, want, ok := strings.Cut(tc.kept, "="); ok {
				if data, err := os.ReadFile(path); err != nil || string(data) != want {
					t.Errorf("%s holds %q, %v; want it kept as %q", path, data, err, want)
				}
			}
		})
	}
	// The symlink is still a symlink, the FIFO a FIFO, /dev/full a device: nothing was replaced.
	if st, err := os.Lstat(link); err != nil || st.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("%s is no longer a symbolic link", link)
	}
	if st, err := os.Lstat(fifo); err != nil || st.Mode()&fs.ModeNamedPipe == 0 {
		t.Errorf("%s is no longer a FIFO", fifo)
	}
	if st, err := os.Lstat("/dev/full"); err != nil || st.Mode()&fs.ModeCharDevice == 0 {
		t.Errorf("/dev/full is no longer a device: %v", st.Mode())
	}
	// --force replaces a read-only file.
	if code, _, stderr := runCmd(export(readOnly, "--force")...); code != exitOK {
		t.Fatalf("--force on a read-only file: exit %d, %s", code, stderr)
	}
	if data, _ := os.ReadFile(readOnly); !bytes.HasPrefix(data, []byte("<?xml")) {
		t.Errorf("--force did not replace the read-only file")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("a temporary file was left: %s", e.Name())
		}
	}
}

// TestRunTargets holds run to the output policy: it streams into FIFOs and /dev/null, refuses directories,
// links and read-only files, writes to standard output with -o -, and names the target in errors.
func TestRunTargets(t *testing.T) {
	dir := t.TempDir()
	readOnly := filepath.Join(dir, "ro.oomdbg")
	if err := os.WriteFile(readOnly, []byte("keep"), 0o444); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.oomdbg")
	if err := os.Symlink(filepath.Join(dir, "real.oomdbg"), link); err != nil {
		t.Fatal(err)
	}
	record := func(out string, more ...string) []string {
		return append([]string{"run", "--steps", "2", "-o", out}, more...)
	}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{ // in order: the refusals before the --force that replaces
		{"read-only refused", record(readOnly), exitUsage, "oomdbg: refusing to replace " + readOnly + ": it is read-only (--force replaces it)"},
		{"symlink refused", record(link), exitUsage, "oomdbg: refusing to write " + link + ": it is a symbolic link (--force writes to what it links to)"},
		{"directory refused", record(dir), exitUsage, "oomdbg: refusing to replace " + dir + ": it is a directory, not a regular file"},
		{"full device", record("/dev/full"), exitUsage, "oomdbg: cannot write /dev/full: no space left on device"},
		{"null device", record("/dev/null"), exitOK, ""},
		{"read-only --force", record(readOnly, "--force"), exitOK, ""},
		{"symlink --force", record(link, "--force"), exitOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCmd(tc.args...)
			if code != tc.code || tc.stderr != "" && stderr != tc.stderr+"\n" {
				t.Fatalf("exit %d, stderr %q; want %d, %q", code, stderr, tc.code, tc.stderr)
			}
		})
	}
	if s, err := snapshot.ReadFile(filepath.Join(dir, "real.oomdbg")); err != nil || s.Footer == nil {
		t.Errorf("--force through the link: %v", err)
	}
	if st, err := os.Lstat(link); err != nil || st.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the link was replaced")
	}

	t.Run("standard output", func(t *testing.T) {
		code, stdout, stderr := runCmd(record("-")...)
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		s, err := snapshot.Read(strings.NewReader(stdout))
		if err != nil || s.Footer == nil || s.Events.Len() == 0 {
			t.Fatalf("stdout is not a complete snapshot: %v", err)
		}
		if !strings.Contains(stderr, "snapshot   standard output (") || !strings.Contains(stderr, "steps      2 of 2") {
			t.Errorf("the summary is not on stderr: %q", stderr)
		}
	})

	t.Run("fifo", func(t *testing.T) {
		fifo := filepath.Join(dir, "fifo")
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Fatal(err)
		}
		read := make(chan *snapshot.Snapshot, 1)
		go func() {
			f, err := os.Open(fifo)
			if err != nil {
				read <- nil
				return
			}
			defer f.Close()
			s, _ := snapshot.Read(f)
			io.Copy(io.Discard, f)
			read <- s
		}()
		if code, _, stderr := runCmd(record(fifo)...); code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		select {
		case s := <-read:
			if s == nil || s.Footer == nil {
				t.Fatalf("the reader of the FIFO got no complete snapshot")
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the reader of the FIFO got nothing")
		}
		if st, err := os.Lstat(fifo); err != nil || st.Mode()&fs.ModeNamedPipe == 0 {
			t.Errorf("the FIFO was replaced")
		}
	})
}

// TestNumericFlags gives flags numbers that overflow or make no physical sense: each is one line naming the
// flag, exit 2.
func TestNumericFlags(t *testing.T) {
	for name, tc := range map[string]struct {
		args   []string
		stderr string
	}{
		"hidden overflows": {[]string{"run", "--hidden", "4611686018427387904", "--steps", "2"},
			"oomdbg: --hidden 4611686018427387904: makes a tensor of more than 70368744177664 elements (at most 2^46)"},
		"gpu-mem past 2^63": {[]string{"run", "--gpu-mem", "17179869183GiB"},
			`oomdbg: invalid argument "17179869183GiB" for "--gpu-mem" flag: 17179869183GiB is more than 1024TiB (see 'oomdbg run --help')`},
		"gpu-mem past 2^64": {[]string{"run", "--gpu-mem", "17179869184GiB"},
			`oomdbg: invalid argument "17179869184GiB" for "--gpu-mem" flag: size "17179869184GiB" is too large (see 'oomdbg run --help')`},
		"steps past int32": {[]string{"run", "--steps", "3000000000"}, "oomdbg: --steps 3000000000: is more than 2147483647"},
		"negative steps":   {[]string{"run", "--steps", "-1"}, "oomdbg: --steps -1: must be at least 0"},
		"accum":            {[]string{"run", "--model", "gpt", "--accum", "1000000000"}, "oomdbg: --accum 1000000000: is more micro-batches per step than any run takes (at most 65536)"},
		"lr":               {[]string{"run", "--lr", "NaN"}, "oomdbg: --lr NaN: must be a finite number >= 0"},
		"in features":      {[]string{"fixes", "--model", "mlp", "--in-features", "0"}, "oomdbg: --in-features 0: must be at least 1"},
		"context reserve":  {[]string{"run", "--gpu-mem", "1GiB", "--context-reserve", "2GiB"}, "oomdbg: --context-reserve 2GiB: must be less than the gpu memory, 1GiB"},
		"batch overflow": {[]string{"run", "--batch", "99999999999999999999"},
			`oomdbg: invalid argument "99999999999999999999" for "--batch" flag: value out of range (see 'oomdbg run --help')`},
		"max-peak":         {[]string{"check", "x", "--max-peak", "2000PiB"}, `oomdbg: invalid argument "2000PiB" for "--max-peak" flag: invalid size "2000PiB" (want a number with an optional unit: B, KiB, MiB, GiB, TiB; KB, MB, GB also mean binary units) (see 'oomdbg check --help')`},
		"warmup":           {[]string{"check", "x", "--warmup", "-3"}, "oomdbg: --warmup -3: must be at least 0"},
		"export device":    {[]string{"export", "x", "--format", "svg", "--device", "-1"}, "oomdbg: --device -1: must be at least 0"},
		"max-memory small": {[]string{"report", "x", "--max-memory", "1KiB"}, `oomdbg: invalid argument "1KiB" for "--max-memory" flag: 1KiB is too little to open anything (at least 16MiB) (see 'oomdbg report --help')`},
	} {
		t.Run(name, func(t *testing.T) {
			code, _, stderr := runCmd(tc.args...)
			if code != exitUsage || stderr != tc.stderr+"\n" {
				t.Fatalf("exit %d, stderr %q; want 2 and the one line %q", code, stderr, tc.stderr)
			}
		})
	}
}

// TestRunNamesALeak holds that run, writing a file, says under its summary what check says of that file when
// the run leaks, and says nothing of leaks when it does not.
func TestRunNamesALeak(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		bug  string
		leak bool
	}{{"retain-graph", true}, {"", false}} {
		path := filepath.Join(dir, "bug-"+tc.bug+".oomdbg")
		args := []string{"run", "--steps", "8", "-o", path}
		if tc.bug != "" {
			args = append(args, "--bug", tc.bug)
		}
		code, stdout, stderr := runCmd(args...)
		if code != exitOK && code != exitProblem {
			t.Fatalf("--bug %s: exit %d: %s", tc.bug, code, stderr)
		}
		checkCode, checked, _ := runCmd("check", path)
		if code != checkCode {
			t.Errorf("--bug %s: run exits %d, check %d: a run whose summary ends with a leak finds a problem", tc.bug, code, checkCode)
		}
		verdict, _, _ := strings.Cut(checked, "\n")
		reason, failed := strings.CutPrefix(verdict, "FAIL: ")
		if failed != tc.leak {
			t.Fatalf("--bug %s: check says %q", tc.bug, verdict)
		}
		said := strings.Contains(stdout, "\nleak       ")
		if said != tc.leak || tc.leak && !strings.Contains(stdout, "\nleak       "+reason+"\n") {
			t.Errorf("--bug %s: run's summary does not say what check says (%q):\n%s", tc.bug, verdict, stdout)
		}
	}
}

// failingWriter is a standard output that cannot be written: a full disk.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) {
	return 0, &fs.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.ENOSPC}
}

// TestUnwritableOutput: a command whose answer cannot be written exits 2 with one line, whatever writes it
// (the tables of fit, fixes and bugs drop their writers' errors); none exits 0 with its answer lost.
func TestUnwritableOutput(t *testing.T) {
	for _, args := range [][]string{
		{"fit", "--preset", "tiny"}, {"fit", "--preset", "tiny", "--markdown"}, {"fit", "--preset", "tiny", "--json"},
		{"fixes", "--preset", "tiny"}, {"fixes", "--preset", "tiny", "--markdown"},
		{"bugs", "--steps", "4"}, {"bugs", "--steps", "4", "--markdown"},
		{"layouts"}, {"layouts", "--json"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			code := run(context.Background(), args, failingWriter{}, &stderr)
			if code != exitUsage || stderr.String() != "oomdbg: cannot write standard output: no space left on device\n" {
				t.Errorf("exit %d, stderr %q; want 2 and one line", code, stderr.String())
			}
		})
	}
}

// TestRunStopsWhenItsWritesFail records into a file whose writes start failing part-way (a file-size limit,
// as a full disk does): the run stops at once, says what was written and how far it got, and exits 2,
// rather than simulating every step for nothing. The file holds what was written: a snapshot cut short.
func TestRunStopsWhenItsWritesFail(t *testing.T) {
	bin := oomdbgBinary(t)
	path := filepath.Join(t.TempDir(), "big.oomdbg")
	const steps = 200000 // minutes of simulation, were it not stopped
	cmd := exec.Command("sh", "-c", `ulimit -f 64; exec "$0" run --steps `+strconv.Itoa(steps)+` -o "$1"`, bin, path)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != exitUsage {
		t.Fatalf("exit %d (%v), want 2; stderr %q", code, err, stderr.String())
	}
	m := regexp.MustCompile(`^oomdbg: cannot write .*big\.oomdbg after (.*): file too large; the run stopped at step (\d+) of 200000, and the file holds what was written before\n$`).
		FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("stderr %q", stderr.String())
	}
	if st, err := os.Stat(path); err != nil || m[1] != units.FormatSize(st.Size()) {
		t.Errorf("it says %s were written; the file: %v", m[1], err)
	}
	stopped, _ := strconv.Atoi(m[2])
	if !strings.Contains(stdout.String(), fmt.Sprintf("steps      %d of %d (interrupted)\n", stopped, steps)) {
		t.Errorf("the summary does not say how far the run got:\n%s", stdout.String())
	}
	s, err := snapshot.ReadFile(path)
	if err != nil || s.Warning == nil {
		t.Fatalf("the file: %v, warning %v; want a snapshot cut short", err, s.Warning)
	}
	// The file holds the steps written before the limit; a run that went on would have simulated thousands
	// more after it.
	iterations := 0
	for _, e := range s.Events.All() {
		if e.Action == snapshot.ActionIteration {
			iterations++
		}
	}
	if iterations == 0 || stopped > iterations+2 {
		t.Errorf("the run stopped at step %d, the file holds %d iterations: it went on after its writes failed", stopped, iterations)
	}
}

// TestErrorsNameWhatTheUserGave: a configuration that cannot run is refused in the words the user gave it:
// the config.json field that holds the number, the flag given, or where a number nobody gave came from;
// never a flag the user did not give as what is wrong.
func TestErrorsNameWhatTheUserGave(t *testing.T) {
	dir := t.TempDir()
	config := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// Every size within config.json's own bounds; together, more than 2^42 parameters.
	huge := config("huge.json", `{"architectures": ["LlamaForCausalLM"], "hidden_size": 131072, "intermediate_size": 131072,
		"num_hidden_layers": 1000, "num_attention_heads": 32, "vocab_size": 4194304}`)
	tinyVocab := config("vocab1.json", `{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 1}`)
	gpt2 := config("gpt2.json", `{"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_head": 4, "n_layer": 2}`)
	for name, tc := range map[string]struct {
		args   []string
		stderr string
	}{
		"config.json's sizes": {[]string{"run", "--hf-config", huge},
			huge + ": vocab_size 4194304: gives the model more than 4398046511104 parameters (at most 2^42, 4.4 trillion)"},
		"config.json's sizes, with --vocab given": {[]string{"run", "--hf-config", huge, "--vocab", "5"},
			huge + ": hidden_size 131072: gives the model more than 4398046511104 parameters (at most 2^42, 4.4 trillion)"},
		"config.json's vocabulary": {[]string{"run", "--hf-config", tinyVocab}, tinyVocab + ": vocab_size 1: must be at least 2"},
		"another model than config.json's": {[]string{"run", "--hf-config", gpt2, "--model", "llama"},
			"oomdbg: ffn 0: must be at least 1; " + gpt2 + " describes a GPT2LMHeadModel, and --model llama needs --ffn"},
		"a preset's number": {[]string{"run", "--preset", "tiny", "--d-model", "62"},
			"oomdbg: heads 4 (the preset tiny's; --heads sets it): does not divide d_model 62"},
		"the card, not the context": {[]string{"run", "--gpu-mem", "256MiB"},
			"oomdbg: --gpu-mem 256MiB: leaves nothing to the allocator after the 512MiB the CUDA context takes (--context-reserve)"},
		"fit, config.json's vocabulary": {[]string{"fit", "--hf-config", tinyVocab}, tinyVocab + ": vocab_size 1: must be at least 2"},
	} {
		t.Run(name, func(t *testing.T) {
			args := tc.args
			if args[0] == "run" {
				args = append(slices.Clone(args), "-o", filepath.Join(dir, "out.oomdbg"))
			}
			code, _, stderr := runCmd(args...)
			if !strings.HasPrefix(tc.stderr, "oomdbg: ") {
				tc.stderr = "oomdbg: " + tc.stderr
			}
			if code != exitUsage || stderr != tc.stderr+"\n" {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, stderr, tc.stderr)
			}
			if m := regexp.MustCompile(`^oomdbg: --([a-z-]+)`).FindStringSubmatch(stderr); m != nil && !slices.Contains(tc.args, "--"+m[1]) {
				t.Errorf("%q blames --%s, which was not given", stderr, m[1])
			}
		})
	}
}
