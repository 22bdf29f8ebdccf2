//go:build unix

package tui

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time the process has used, user and system: what a benchmark costs whatever else
// runs on the machine.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
