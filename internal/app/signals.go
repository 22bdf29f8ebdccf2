package app

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// stopSignals are the signals that end a run with its snapshot complete: Ctrl-C, kill's default and a
// closed terminal.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}

// StopOnSignals returns a context cancelled by the first of SIGINT, SIGTERM and SIGHUP, and a function that
// says which came (nil when none did). After the first, the signals take their default action again, so a
// second Ctrl-C ends the process at once; what was recorded is on disk by then.
func StopOnSignals(parent context.Context) (ctx context.Context, caught func() os.Signal, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, stopSignals...)
	var mu sync.Mutex
	var got os.Signal
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			signal.Stop(ch)
			mu.Lock()
			got = sig
			mu.Unlock()
			cancel()
		case <-done:
		}
	}()
	caught = func() os.Signal {
		mu.Lock()
		defer mu.Unlock()
		return got
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
			cancel()
		})
	}
	return ctx, caught, stop
}

// SignalError ends work stopped by a signal: exit 128 + the signal's number (130 for SIGINT, 143 for
// SIGTERM, 129 for SIGHUP), as shells report a process the signal killed.
type SignalError struct {
	Sig  os.Signal
	Then string // what stands: "the snapshot run.oomdbg is complete up to then"
}

func (e *SignalError) Error() string {
	return fmt.Sprintf("stopped by %s; %s", SignalName(e.Sig), e.Then)
}

// ExitCode is the process's exit status.
func (e *SignalError) ExitCode() int {
	if s, ok := e.Sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return ExitProblem
}

// SignalName names a signal as people know it: SIGINT, SIGTERM, SIGHUP.
func SignalName(sig os.Signal) string {
	switch sig {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return sig.String()
}
