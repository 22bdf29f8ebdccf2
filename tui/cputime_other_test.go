//go:build !unix

package tui

import "time"

// cpuTime is not measured here.
func cpuTime() time.Duration { return 0 }
