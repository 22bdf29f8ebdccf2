//go:build unix

package recorder

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// forwarded are the signals Run passes on to the job.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// fromTerminal reports whether a SIGINT most likely came from the terminal: this process is in the
// terminal's foreground process group, which the job shares, so the job has had the Ctrl-C already. Sending
// it again would raise a second KeyboardInterrupt inside the job's own cleanup.
func fromTerminal(s os.Signal) bool {
	if s != syscall.SIGINT {
		return false
	}
	for _, fd := range []int{0, 1, 2} {
		pgrp, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
		if err == nil {
			return pgrp == unix.Getpgrp()
		}
	}
	return false
}
