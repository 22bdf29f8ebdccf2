package cputime

import (
	"runtime"
	"testing"
	"time"
)

// TestProcessCountsWork checks that CPU time grows while the process computes and hardly while it sleeps.
func TestProcessCountsWork(t *testing.T) {
	switch runtime.GOOS {
	case "windows", "plan9", "js", "wasip1":
		t.Skip("CPU time is not measured on", runtime.GOOS)
	}
	start := Process()
	if start <= 0 {
		t.Fatalf("the process has used %v of CPU time", start)
	}
	time.Sleep(100 * time.Millisecond)
	if slept := Process() - start; slept > 50*time.Millisecond {
		t.Errorf("sleeping 100ms cost %v of CPU time", slept)
	}
	// However loaded the machine, a busy loop gets some CPU within 10 seconds.
	start, wall := Process(), time.Now()
	x := 0
	for Process()-start < 20*time.Millisecond {
		if time.Since(wall) > 10*time.Second {
			t.Fatalf("10s of a busy loop (%d turns) cost %v of CPU time", x, Process()-start)
		}
		x++
	}
}
