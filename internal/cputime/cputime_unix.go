//go:build unix

// Package cputime reads the CPU time the process has used: what a benchmark costs whatever else runs on the
// machine, where wall time on a shared machine measures the others too.
package cputime

import (
	"syscall"
	"time"
)

// Process returns the CPU time the process has used, user and system.
func Process() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
