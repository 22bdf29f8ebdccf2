//go:build !unix

package recorder

import "os"

// forwarded are the signals Run passes on to the job.
var forwarded = []os.Signal{os.Interrupt}

// fromTerminal: outside Unix the console delivers Ctrl-C to every process attached to it.
func fromTerminal(s os.Signal) bool { return s == os.Interrupt }
