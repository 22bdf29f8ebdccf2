package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"golang.org/x/sys/unix"
)

// longRun records for minutes: GPT-2 small on the meta device, a few milliseconds a step.
var longRun = []string{"run", "--preset", "gpt2-small", "--steps", "100000", "--gpu-mem", "80GiB"}

// maxLoss is what a recording killed at any moment may lose: the 200 ms between flushes and the time a
// chunk takes to compress and write.
const maxLoss = 250 * time.Millisecond

// startRecording starts the binary recording longRun into path and waits until the file holds its header.
func startRecording(t *testing.T, bin, path string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(bin, append(longRun, "-o", path)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st, err := os.Stat(path); err == nil && st.Size() >= 16 {
			return cmd, &stderr
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot header after 30 s; stderr %q", stderr.String())
		}
	}
}

// TestKillRecording kills a real recording with SIGKILL at several moments, from just after it wrote its
// header to seconds in, and reads each file back: it opens, says it was cut short, and holds what was
// recorded until at most maxLoss before the kill.
func TestKillRecording(t *testing.T) {
	bin := oomdbgBinary(t)
	for _, tc := range []struct {
		name       string
		after      time.Duration // after the header is on disk
		iterations int           // at least this many complete iterations
	}{
		{"at the header", 0, 0},
		{"after 300ms", 300 * time.Millisecond, 0},
		{"after 1.5s", 1500 * time.Millisecond, 1},
		{"after 3s", 3 * time.Second, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The loss is measured on the wall clock, so a machine too busy to run the recorder for a while
			// can exceed the bound without anything being wrong: three attempts, and one within the bound
			// suffices. A recording that is not flushed as it goes loses seconds in every attempt.
			var losses []time.Duration
			for range killAttempts {
				loss, ok := killOnce(t, bin, tc.after, tc.iterations)
				if !ok || loss <= maxLoss {
					return
				}
				losses = append(losses, loss)
			}
			t.Errorf("lost the last %v before the kill in %d attempts, more than %v", losses, killAttempts, maxLoss)
		})
	}
}

// killAttempts is how many times TestKillRecording kills a recording before it calls a loss too large.
const killAttempts = 3

// killOnce records into a new file, kills the recording with SIGKILL after the given time and checks what
// the file holds. It returns the time recorded events were lost for before the kill, and false when
// nothing was recorded (there was nothing to lose).
func killOnce(t *testing.T, bin string, after time.Duration, wantIterations int) (time.Duration, bool) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "run.oomdbg")
	cmd, _ := startRecording(t, bin, path)
	time.Sleep(after)
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	s, err := snapshot.ReadFile(path)
	if err != nil {
		t.Fatalf("the killed recording does not read back: %v", err)
	}
	var cut *snapshot.TruncatedError
	if !errors.As(s.Warning, &cut) || s.Footer != nil {
		t.Fatalf("warning %v, footer %v: want a recording cut short", s.Warning, s.Footer != nil)
	}
	iterations := 0
	for _, e := range s.Events.All() {
		if e.Action == snapshot.ActionIteration {
			iterations++
		}
	}
	if complete := max(iterations-1, 0); complete < wantIterations {
		t.Fatalf("%d complete iterations, want at least %d", complete, wantIterations)
	}
	if s.Events.Len() == 0 {
		return 0, false // killed before the first chunk: nothing was recorded to lose
	}
	last := time.Duration(s.Events.Time(s.Events.Len() - 1))
	loss := killed.Sub(s.Meta.Created) - last
	t.Logf("%d events, %d iterations begun; the last recorded %v into the run, killed at %v: lost %v",
		s.Events.Len(), iterations, last, killed.Sub(s.Meta.Created), loss)
	return loss, true
}

// TestStopSignals stops a recording with SIGINT, SIGTERM and SIGHUP: each ends the run like Ctrl-C, the
// snapshot complete with its footer, and the exit code is the one shells give a process the signal killed.
func TestStopSignals(t *testing.T) {
	bin := oomdbgBinary(t)
	for _, tc := range []struct {
		sig  syscall.Signal
		name string
		code int
	}{{syscall.SIGINT, "SIGINT", 130}, {syscall.SIGTERM, "SIGTERM", 143}, {syscall.SIGHUP, "SIGHUP", 129}} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "run.oomdbg")
			cmd, stderr := startRecording(t, bin, path)
			time.Sleep(300 * time.Millisecond)
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("still running 30 s after %s", tc.name)
			}
			if code := cmd.ProcessState.ExitCode(); code != tc.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tc.code, stderr.String())
			}
			if want := "oomdbg: stopped by " + tc.name + "; the snapshot " + path + " is complete up to then\n"; stderr.String() != want {
				t.Errorf("stderr %q, want %q", stderr.String(), want)
			}
			s, err := snapshot.ReadFile(path)
			if err != nil || s.Warning != nil || s.Footer == nil {
				t.Fatalf("the snapshot is not complete: %v, warning %v, footer %v", err, s.Warning, s.Footer != nil)
			}
		})
	}
}

// TestFollowLiveRecording follows a recording as view --follow does, from the moment its file exists, before
// anything is in it: events arrive while it runs, and once it is killed the follower waits for more instead
// of failing.
func TestFollowLiveRecording(t *testing.T) {
	bin := oomdbgBinary(t)
	path := filepath.Join(t.TempDir(), "run.oomdbg")
	cmd := exec.Command(bin, append(longRun, "-o", path)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no snapshot file after 30 s")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	in, err := load.Open(path, load.WithFollow(ctx))
	if err != nil || in.Format != load.FormatNative {
		t.Fatalf("open: %v", err)
	}
	defer in.Close()
	r, err := snapshot.NewReader(in.Reader(), snapshot.WithFollow(ctx, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	iterations := 0
	for iterations < 3 {
		e, err := r.Next()
		if err != nil {
			t.Fatalf("after %d iterations: %v", iterations, err)
		}
		if e.Action == snapshot.ActionIteration {
			iterations++
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	// Read what was written until the kill, then wait: the file has no end chunk, so more may come.
	go func() { time.Sleep(500 * time.Millisecond); cancel() }()
	for {
		if _, err := r.Next(); err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("the follower failed instead of waiting: %v", err)
			}
			break
		}
	}
}

// TestStdoutRecording records into a pipe with -o - and into a file with -o /dev/stdout: the snapshot is
// the whole of standard output, the summary goes to stderr, and report reads the pipe through /dev/stdin.
func TestStdoutRecording(t *testing.T) {
	bin := oomdbgBinary(t)
	dir := t.TempDir()
	// -o /dev/stdout > file
	out := filepath.Join(dir, "redirected.oomdbg")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--steps", "3", "-o", "/dev/stdout")
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	f.Close()
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	if s, err := snapshot.ReadFile(out); err != nil || s.Footer == nil {
		t.Fatalf("-o /dev/stdout > file: %v", err)
	}
	if !strings.Contains(stderr.String(), "steps      3 of 3") {
		t.Errorf("the summary is not on stderr: %q", stderr.String())
	}
	// run -o - | report /dev/stdin
	rec := exec.Command(bin, "run", "--steps", "3", "-o", "-")
	rep := exec.Command(bin, "report", "/dev/stdin")
	pipe, err := rec.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	rep.Stdin = pipe
	var report bytes.Buffer
	rep.Stdout, rep.Stderr, rec.Stderr = &report, &report, io.Discard
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	if err := rep.Run(); err != nil {
		t.Fatalf("report /dev/stdin: %v: %s", err, report.String())
	}
	rec.Wait()
	if !strings.Contains(report.String(), "oomdbg report: /dev/stdin") || !strings.Contains(report.String(), "\nPEAK ") {
		t.Errorf("report of the pipe:\n%s", report.String())
	}
}

// TestTwoRunsIntoOneFile starts a second recording into the file a first one is still writing: the second
// refuses, with one line, and leaves the file alone; the first, stopped by Ctrl-C, leaves one whole
// recording, where two writers used to interleave their chunks into a file that was neither.
func TestTwoRunsIntoOneFile(t *testing.T) {
	bin := oomdbgBinary(t)
	path := filepath.Join(t.TempDir(), "same.oomdbg")
	first, firstErr := startRecording(t, bin, path)
	o := invoke(bin, nil, "run", "--steps", "3", "-o", path)
	if o.code != exitUsage || o.stderr != "oomdbg: cannot write "+path+": another process is recording into it (a run still going?); choose another -o, or wait for it\n" {
		t.Errorf("the second run: exit %d, stderr %q", o.code, o.stderr)
	}
	first.Process.Signal(os.Interrupt)
	first.Wait()
	if code := first.ProcessState.ExitCode(); code != 130 {
		t.Fatalf("the first run: exit %d, want 130; stderr %q", code, firstErr.String())
	}
	s, err := snapshot.ReadFile(path)
	if err != nil || s.Footer == nil || s.Warning != nil {
		t.Fatalf("the file is not one whole recording: %v (footer %v, warning %v)", err, s != nil && s.Footer != nil, s)
	}
	if preset := strings.Contains(string(s.Meta.Workload), `"preset":"gpt2-small"`); !preset {
		t.Errorf("the file is not the first run's: %s", s.Meta.Workload)
	}
}

// openPTY opens a pseudo-terminal and returns its two ends: what the program writes to tty, the test reads
// from ptm.
func openPTY(t *testing.T) (ptm, tty *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

// TestRunShowsProgressOnATerminal runs the tiny GPT on the cpu device, which takes seconds a step, with
// standard error a terminal: a progress line (bar, steps, loss) is drawn there and erased before the
// summary. With standard error a pipe nothing is drawn.
func TestRunShowsProgressOnATerminal(t *testing.T) {
	bin := oomdbgBinary(t)
	dir := t.TempDir()
	ptm, tty := openPTY(t)
	args := []string{"run", "--preset", "tiny", "--device", "cpu", "--steps", "3"}
	cmd := exec.Command(bin, append(args, "-o", filepath.Join(dir, "tty.oomdbg"))...)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, tty
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close() // the child holds it now: the reads below end when it exits
	var screen bytes.Buffer
	io.Copy(&screen, ptm) // EIO once the last holder of the terminal is gone
	if err := cmd.Wait(); err != nil {
		t.Fatalf("run: %v\n%s", err, screen.String())
	}
	drawn := screen.String()
	if !regexp.MustCompile(`\r\x1b\[Krun: \[#+\] step 3 of 3, loss \d+\.\d{4}, [0-9.]+m?s\r\x1b\[K`).MatchString(drawn) {
		t.Errorf("no progress line ending in step 3 of 3, erased, on the terminal: %q", drawn)
	}
	if !strings.Contains(stdout.String(), "steps      3 of 3, loss ") {
		t.Errorf("the summary: %s", stdout.String())
	}
	o := invoke(bin, nil, append(args, "-o", filepath.Join(dir, "pipe.oomdbg"))...)
	if o.code != exitOK || strings.Contains(o.stderr, "\r") || strings.Contains(o.stderr, "step 3 of 3") {
		t.Errorf("standard error a pipe: exit %d, %q; want no progress line", o.code, o.stderr)
	}
}
