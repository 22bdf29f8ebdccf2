package main

// The reliability suite: the real binary, built once, run as a subprocess the way a user or a script runs
// it, against crafted and damaged files, and killed while it records. Every invocation runs under a memory
// ceiling and a timeout, and must end by itself with exit 0, 1 or 2, a one-line message for 2, and no
// panic.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The limits every invocation of the suite runs under.
const (
	suiteCeiling = 768 << 20 // peak resident memory of one invocation
	suiteTimeout = 60 * time.Second
	// suiteBudget is the --max-memory the analysis commands get: what they may plan for. The ceiling
	// leaves room for the runtime, the binary and what the budget does not count.
	suiteBudget = "256MiB"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

// oomdbgBinary builds the command once, as users get it (no race detector: its shadow memory would make
// the memory ceiling meaningless), and returns its path. OOMDBG_BINARY, when set, names a binary to run
// instead: a release, or an older build to compare with.
func oomdbgBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("OOMDBG_BINARY"); bin != "" {
		return bin
	}
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "oomdbg-bin-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "oomdbg")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// outcome is how one invocation ended.
type outcome struct {
	code           int
	stdout, stderr string
	peak           int64 // peak resident memory, bytes
	elapsed        time.Duration
	timedOut       bool
	overCeiling    bool
}

// invoke runs the binary with args, stdin as its standard input (nil: /dev/null), under the suite's
// ceiling and timeout: a watchdog kills it when its resident memory passes the ceiling.
func invoke(bin string, stdin *os.File, args ...string) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), suiteTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != nil {
		cmd.Stdin = stdin
	}
	start := time.Now()
	var o outcome
	if err := cmd.Start(); err != nil {
		o.code, o.stderr = -1, err.Error()
		return o
	}
	// The peak is the kernel's high-water mark of resident memory (VmHWM), sampled every few milliseconds:
	// a sample after the peak still sees it, so only a peak in the last milliseconds before exit could be
	// missed, and a large one takes longer than that to build. (The rusage of a child is no use here: Linux
	// counts the parent's memory at the fork in it.)
	done := make(chan struct{})
	var peak int64
	var over bool
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(3 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				peak = max(peak, rssPeak(cmd.Process.Pid))
				if peak > suiteCeiling {
					over = true
					cmd.Process.Kill()
					return
				}
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	<-watched
	o.elapsed = time.Since(start)
	o.stdout, o.stderr = stdout.String(), stderr.String()
	o.code = cmd.ProcessState.ExitCode()
	o.peak = peak
	o.overCeiling = over
	_ = err
	o.timedOut = errors.Is(ctx.Err(), context.DeadlineExceeded)
	o.overCeiling = over || o.peak > suiteCeiling
	_ = err
	return o
}

// rssPeak reads a process's peak resident memory (VmHWM) from /proc, 0 when it cannot.
func rssPeak(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kib << 10
		}
	}
	return 0
}

// failure says what is wrong with an outcome, "" when nothing is: it ended by itself within the limits,
// with 0, 1 or 2, a one-line message for 2, and no panic.
func (o outcome) failure() string {
	switch {
	case o.timedOut:
		return fmt.Sprintf("still running after %v", suiteTimeout)
	case o.overCeiling:
		return fmt.Sprintf("peak memory %d MiB, over the ceiling of %d MiB", o.peak>>20, suiteCeiling>>20)
	case strings.Contains(o.stderr, "panic:") || strings.Contains(o.stderr, "fatal error:") || strings.Contains(o.stderr, "goroutine "):
		return "crashed: " + firstLine(o.stderr)
	case o.code < 0 || o.code > 2:
		return fmt.Sprintf("exit %d: %s", o.code, firstLine(o.stderr))
	case o.code == 2 && (!strings.HasPrefix(o.stderr, "oomdbg: ") || strings.Count(o.stderr, "\n") != 1):
		return fmt.Sprintf("exit 2 without a one-line message: %q", o.stderr)
	}
	return ""
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
