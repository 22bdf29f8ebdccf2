package recorder_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
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

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/recorder"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// withoutRecorder drops the recorder's own lines from a job's standard error.
func withoutRecorder(stderr string) string {
	var out []string
	for _, l := range strings.SplitAfter(stderr, "\n") {
		if !strings.HasPrefix(l, "oomdbg record: ") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// direct runs the loop as it would run without oomdbg, and returns its exit status as a shell reports it.
func direct(t *testing.T, env []string, onLine func(string, *exec.Cmd), args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(torchtest.Python, append([]string{filepath.Join(repoRoot(t), "examples/record/loop.py"), "--device", "cpu"}, args...)...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var stdout strings.Builder
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		stdout.WriteString(sc.Text() + "\n")
		if onLine != nil {
			onLine(sc.Text(), cmd)
		}
	}
	_ = cmd.Wait()
	code := cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	return code, stdout.String(), stderr.String()
}

// lineWriter calls f with each line written to it, and keeps them all.
type lineWriter struct {
	buf  bytes.Buffer
	part []byte
	f    func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.f(string(w.part[:i]))
		w.part = w.part[i+1:]
	}
}

var waitingPID = regexp.MustCompile(`waiting for a signal \(pid (\d+)\)`)

// TestJobUnchanged runs the loop as it is and under the recorder, clean, raising, out of memory and ended by
// SIGTERM: its exit status, standard output and standard error (less the recorder's own lines) are the
// same, and each ending leaves the dump it should.
func TestJobUnchanged(t *testing.T) {
	torchtest.Require(t)
	cases := map[string]struct {
		args   []string
		extra  []string
		code   int
		kind   recorder.DumpKind
		reason string
	}{
		"normal exit": {args: []string{"--steps", "3"}, code: 0, kind: recorder.DumpEnd, reason: "exit"},
		"exception":   {args: []string{"--mode", "raise"}, code: 1, kind: recorder.DumpEnd, reason: "exception: RuntimeError"},
		"oom": {args: []string{"--mode", "oom", "--oom-at", "2"}, extra: []string{"FAKECUDA_CAPACITY=" + strconv.Itoa(8<<20)},
			code: 1, kind: recorder.DumpOOM, reason: "oom"},
		"SIGTERM": {args: []string{"--mode", "wait"}, code: 128 + int(syscall.SIGTERM), kind: recorder.DumpEnd, reason: "SIGTERM"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			env := fakeEnv(t, "2.3", "", c.extra...)
			sigterm := func(line string, send func()) {
				if strings.HasPrefix(line, "waiting for a signal") {
					send()
				}
			}
			wantCode, wantOut, wantErr := direct(t, env, func(line string, cmd *exec.Cmd) {
				sigterm(line, func() { _ = cmd.Process.Signal(syscall.SIGTERM) })
			}, c.args...)

			var stderr bytes.Buffer
			stdout := &lineWriter{f: func(line string) {
				// oomdbg is sent the signal, as a scheduler would send it, and passes it on.
				sigterm(line, func() { _ = syscall.Kill(os.Getpid(), syscall.SIGTERM) })
			}}
			opt := recorder.Options{Dir: filepath.Join(t.TempDir(), "dumps"), Env: env, Stdout: stdout, Stderr: &stderr, Stdin: strings.NewReader("")}
			argv := append([]string{torchtest.Python, filepath.Join(repoRoot(t), "examples/record/loop.py"), "--device", "cpu"}, c.args...)
			res, err := recorder.Run(context.Background(), argv, opt)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != c.code || wantCode != c.code {
				t.Errorf("exit status %d under the recorder, %d without; want %d", res.ExitCode, wantCode, c.code)
			}
			// The loop prints its pid while it waits: the one thing that differs from run to run.
			if got, want := waitingPID.ReplaceAllString(stdout.buf.String(), "pid"), waitingPID.ReplaceAllString(wantOut, "pid"); got != want {
				t.Errorf("standard output differs:\n%s\nwithout the recorder:\n%s", got, want)
			}
			if got := withoutRecorder(stderr.String()); got != wantErr {
				t.Errorf("standard error differs:\n%s\nwithout the recorder:\n%s", got, wantErr)
			}
			s, err := torch.ImportFile(dumpOf(t, res, c.kind))
			if err != nil {
				t.Fatal(err)
			}
			o, _ := torch.OriginOf(s)
			if o.Recorded == nil || o.Recorded.Reason != c.reason {
				t.Errorf("reason %+v, want %q", o.Recorded, c.reason)
			}
			if c.kind == recorder.DumpOOM && s.Footer.Summary.ByAction["oom"] != 1 {
				t.Errorf("the OOM dump holds %d oom events", s.Footer.Summary.ByAction["oom"])
			}
		})
	}
}

// TestCommandNotFound: a command that does not exist is an error a shell would exit 127 for.
func TestCommandNotFound(t *testing.T) {
	_, err := recorder.Run(context.Background(), []string{"oomdbg-no-such-command"}, recorder.Options{Dir: t.TempDir()})
	var nf *recorder.NotFoundError
	if !errors.As(err, &nf) || nf.ExitCode() != 127 {
		t.Fatalf("got %v, want a NotFoundError exiting 127", err)
	}
}

// TestEarlierDumps: a directory holding an earlier recording's dumps is refused, and cleared with Force.
func TestEarlierDumps(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rank0.end.pickle"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := recorder.Run(context.Background(), []string{"true"}, recorder.Options{Dir: dir, Stdout: io.Discard, Stderr: io.Discard})
	if !errors.Is(err, recorder.ErrEarlierDumps) {
		t.Fatalf("got %v, want ErrEarlierDumps", err)
	}
	res, err := recorder.Run(context.Background(), []string{"true"}, recorder.Options{Dir: dir, Force: true, Stdout: io.Discard, Stderr: io.Discard})
	if err != nil || res.ExitCode != 0 || len(res.Dumps) != 0 {
		t.Fatalf("with Force: %+v, %v", res, err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("Force removed a file that is not a dump: %v", err)
	}
}

// TestEveryKeepAndRank: --every N writes a rolling set of --keep dumps per rank, named from RANK; SIGUSR1
// sent to the job adds one.
func TestEveryKeepAndRank(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dumps")
	res, _, stderr := record(t, recorder.Options{Dir: dir, Every: 1, Keep: 2}, fakeEnv(t, "2.5", "", "RANK=3"), "--steps", "5")
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, stderr)
	}
	var names []string
	for _, d := range res.Dumps {
		names = append(names, filepath.Base(d.Path))
	}
	slices.Sort(names)
	want := []string{"rank3.end.pickle", "rank3.step00000004.pickle", "rank3.step00000005.pickle"}
	if !slices.Equal(names, want) {
		t.Fatalf("dumps %v, want %v", names, want)
	}
	s, err := torch.ImportFile(filepath.Join(dir, "rank3.step00000004.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := torch.OriginOf(s); o.Recorded.Steps != 4 || o.Recorded.Rank != 3 {
		t.Errorf("the step-4 dump says %+v", o.Recorded)
	}

	// SIGUSR1 to the job's process.
	dir2 := filepath.Join(t.TempDir(), "dumps")
	var sent bool
	stdout := &lineWriter{f: func(line string) {
		m := waitingPID.FindStringSubmatch(line)
		if m == nil {
			return
		}
		pid, _ := strconv.Atoi(m[1])
		_ = syscall.Kill(pid, syscall.SIGUSR1)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if ds, _ := recorder.Dumps(dir2); len(ds) > 0 {
				sent = true
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}}
	opt := recorder.Options{Dir: dir2, Env: fakeEnv(t, "2.5", ""), Stdout: stdout, Stderr: io.Discard, Stdin: strings.NewReader("")}
	argv := []string{torchtest.Python, filepath.Join(repoRoot(t), "examples/record/loop.py"), "--device", "cpu", "--mode", "wait"}
	res, err = recorder.Run(context.Background(), argv, opt)
	if err != nil || !sent {
		t.Fatalf("%v; a dump after SIGUSR1: %v", err, sent)
	}
	s, err = torch.ImportFile(dumpOf(t, res, recorder.DumpStep))
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := torch.OriginOf(s); o.Recorded.Reason != "SIGUSR1" {
		t.Errorf("reason %q", o.Recorded.Reason)
	}
}

// TestSitecustomizeChains: the job's own sitecustomize still runs, once, and is the module the job sees.
func TestSitecustomizeChains(t *testing.T) {
	torchtest.Require(t)
	user := t.TempDir()
	if err := os.WriteFile(filepath.Join(user, "sitecustomize.py"), []byte("import sys\nsys.stderr.write('user sitecustomize ran\\n')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	env := []string{"PATH=" + os.Getenv("PATH"), "PYTHONPATH=" + user}
	argv := []string{torchtest.Python, "-c", "import sys; print(sys.modules['sitecustomize'].__file__)"}
	res, err := recorder.Run(context.Background(), argv, recorder.Options{Dir: t.TempDir(), Env: env, Stdout: &stdout, Stderr: &stderr})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v: %s", res, err, stderr.String())
	}
	if got := strings.TrimSpace(stdout.String()); got != filepath.Join(user, "sitecustomize.py") {
		t.Errorf("the job sees sitecustomize %q", got)
	}
	if n := strings.Count(stderr.String(), "user sitecustomize ran"); n != 1 {
		t.Errorf("the job's sitecustomize ran %d times", n)
	}
}

// TestNoCUDA: with a torch built without CUDA the job runs as it is, and the recorder says so once for
// the whole job, child processes included.
func TestNoCUDA(t *testing.T) {
	torchtest.Require(t)
	var stdout, stderr bytes.Buffer
	env := []string{"PATH=" + os.Getenv("PATH"), "OMP_NUM_THREADS=1"}
	script := "import subprocess, sys, torch; print(torch.ones(2).sum().item()); sys.stdout.flush(); " +
		"subprocess.run([sys.executable, '-c', 'import torch; print(3)'], check=True)"
	res, err := recorder.Run(context.Background(), []string{torchtest.Python, "-c", script},
		recorder.Options{Dir: t.TempDir(), Env: env, Stdout: &stdout, Stderr: &stderr})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v: %s", res, err, stderr.String())
	}
	if stdout.String() != "2.0\n3\n" {
		t.Errorf("stdout %q", stdout.String())
	}
	if n := strings.Count(stderr.String(), "built without CUDA"); n != 1 || len(res.Dumps) != 0 {
		t.Errorf("said %d times, %d dumps: %s", n, len(res.Dumps), stderr.String())
	}
}

// TestTrainerCallbackInstalled: when the job imports transformers, every Trainer gets the recorder's
// callback, through the DEFAULT_CALLBACKS every Trainer starts from.
func TestTrainerCallbackInstalled(t *testing.T) {
	torchtest.Require(t)
	var stdout, stderr bytes.Buffer
	script := "import torch\nfrom transformers.trainer_callback import DEFAULT_CALLBACKS\nprint(' '.join(c.__name__ for c in DEFAULT_CALLBACKS))"
	res, err := recorder.Run(context.Background(), []string{torchtest.Python, "-c", script},
		recorder.Options{Dir: t.TempDir(), Env: fakeEnv(t, "2.5", ""), Stdout: &stdout, Stderr: &stderr})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v: %s", res, err, stderr.String())
	}
	if got := strings.TrimSpace(stdout.String()); got != "PrinterCallback OomdbgRecordCallback" {
		t.Errorf("DEFAULT_CALLBACKS: %s", got)
	}
}
