package recorder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Stacks is how much of each allocation's stack PyTorch keeps: torch.cuda.memory._record_memory_history's
// stacks ("python", "all": Python and C++ frames) or no stack at all ("none": context=None).
type Stacks string

// The stack settings.
const (
	StacksPython Stacks = "python"
	StacksAll    Stacks = "all"
	StacksNone   Stacks = "none"
)

// ParseStacks reads a --stacks value.
func ParseStacks(s string) (Stacks, error) {
	switch Stacks(s) {
	case StacksPython, StacksAll, StacksNone:
		return Stacks(s), nil
	}
	return "", fmt.Errorf("--stacks %q: want python, all or none", s)
}

// Options are what a recording keeps and where it goes.
type Options struct {
	// Dir is where the dumps go; it is made if missing.
	Dir string
	// Entries is the history's max_entries: the newest this many allocator events are kept (default 1,000,000).
	Entries int
	// Stacks is how much of each stack is kept (default StacksPython).
	Stacks Stacks
	// Every dumps every N optimizer steps into a rolling set of Keep files per rank; 0 never.
	Every int
	Keep  int // default 3
	// NoScopes leaves out the module scopes (the per-module hooks' marks), the recorder's largest cost.
	NoScopes bool
	// Force removes the dumps of an earlier recording in Dir; without it such dumps are an error.
	Force bool
	// Tool names the recorder in the dumps, e.g. "oomdbg record 0.4.0".
	Tool string
	// Env is the job's environment before the recorder's variables are added (nil: this process's).
	Env []string
	// Stdin, Stdout and Stderr are the job's standard streams (nil: this process's).
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// defaultEntries is the history kept by default: about a gigabyte of host memory in the worst case, as
// docs/pytorch.md's recipe keeps.
const defaultEntries = 1_000_000

// Result is what a recording ended with.
type Result struct {
	// ExitCode is the job's exit status as a shell reports it: its code, or 128+N when signal N ended it.
	ExitCode int
	// Signal is the signal that ended the job, or 0.
	Signal syscall.Signal
	// Dumps are the snapshots in Dir after the job, oldest first.
	Dumps []Dump
}

// NotFoundError says that the command to record does not exist or cannot be run; a shell exits 127 for it.
type NotFoundError struct {
	Command string
	Err     error
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("%s: command not found (%v)", e.Command, e.Err)
}

func (e *NotFoundError) Unwrap() error { return e.Err }

// ExitCode is what a shell exits with for a command it cannot find.
func (e *NotFoundError) ExitCode() int { return 127 }

// ErrEarlierDumps is returned when Dir already holds a recording's dumps and Options.Force is not set.
var ErrEarlierDumps = errors.New("holds the dumps of an earlier recording")

// Run runs argv, a Python training command of any shape (python script.py, python -m module, torchrun,
// accelerate launch, deepspeed ...), unchanged under the recorder, and returns how it ended. The job's
// standard streams are passed through; SIGINT, SIGTERM and SIGHUP sent to this process go to the job (a
// Ctrl-C typed at the terminal reaches it from the terminal already, and is not sent twice). An error
// means the job could not be started: a *NotFoundError when argv[0] cannot be found or run.
func Run(ctx context.Context, argv []string, opt Options) (Result, error) {
	if len(argv) == 0 {
		return Result{}, errors.New("no command to record")
	}
	opt = opt.withDefaults()
	if err := prepareDir(opt.Dir, opt.Force); err != nil {
		return Result{}, err
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return Result{}, &NotFoundError{Command: argv[0], Err: unwrapExec(err)}
	}
	tmp, err := os.MkdirTemp("", "oomdbg-record-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(tmp)
	if err := writeModule(tmp); err != nil {
		return Result{}, err
	}
	dir, err := filepath.Abs(opt.Dir)
	if err != nil {
		return Result{}, err
	}
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = Environ(opt.Env, tmp, dir, opt)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = opt.Stdin, opt.Stdout, opt.Stderr

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return Result{}, &NotFoundError{Command: argv[0], Err: unwrapExec(err)}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var waitErr error
loop:
	for {
		select {
		case s := <-sigs:
			if fromTerminal(s) {
				continue
			}
			_ = cmd.Process.Signal(s)
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGTERM)
			ctx = context.Background() // once
		case waitErr = <-done:
			break loop
		}
	}
	res := Result{ExitCode: cmd.ProcessState.ExitCode()}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.Signal = ws.Signal()
		res.ExitCode = 128 + int(ws.Signal())
	}
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) {
		return res, waitErr
	}
	_ = os.Remove(filepath.Join(dir, claimFile))
	res.Dumps, _ = Dumps(dir)
	return res, nil
}

func (o Options) withDefaults() Options {
	if o.Dir == "" {
		o.Dir = "oomdbg-record"
	}
	if o.Entries <= 0 {
		o.Entries = defaultEntries
	}
	if o.Stacks == "" {
		o.Stacks = StacksPython
	}
	if o.Keep <= 0 {
		o.Keep = 3
	}
	if o.Tool == "" {
		o.Tool = "oomdbg record"
	}
	if o.Stdin == nil {
		o.Stdin = os.Stdin
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	return o
}

// unwrapExec drops exec's own wording ("exec: "python9": executable file not found in $PATH") for its reason.
func unwrapExec(err error) error {
	var e *exec.Error
	if errors.As(err, &e) {
		return e.Err
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Environ returns env (nil: this process's environment) with what the recorder needs: the private directory
// module first on PYTHONPATH, the recording's settings in OOMDBG_RECORD_* variables, and none of the
// variables a recording in the same environment left behind.
func Environ(env []string, module, dir string, opt Options) []string {
	if env == nil {
		env = os.Environ()
	}
	opt = opt.withDefaults()
	out := make([]string, 0, len(env)+8)
	pythonPath := module
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "PYTHONPATH":
			if v != "" {
				pythonPath = module + string(os.PathListSeparator) + v
			}
			continue
		case strings.HasPrefix(k, "OOMDBG_RECORD_"):
			continue
		}
		out = append(out, kv)
	}
	scopes := "1"
	if opt.NoScopes {
		scopes = "0"
	}
	return append(out,
		"PYTHONPATH="+pythonPath,
		"OOMDBG_RECORD_DIR="+dir,
		"OOMDBG_RECORD_ENTRIES="+strconv.Itoa(opt.Entries),
		"OOMDBG_RECORD_STACKS="+string(opt.Stacks),
		"OOMDBG_RECORD_EVERY="+strconv.Itoa(opt.Every),
		"OOMDBG_RECORD_KEEP="+strconv.Itoa(opt.Keep),
		"OOMDBG_RECORD_SCOPES="+scopes,
		"OOMDBG_RECORD_TOOL="+opt.Tool,
	)
}

// prepareDir makes dir, refusing (or with force, removing) the dumps of an earlier recording there: the
// newest dump is what a viewer opens, and an old one would pass for this job's.
func prepareDir(dir string, force bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, err := Dumps(dir)
	if err != nil {
		return err
	}
	if len(old) == 0 {
		return nil
	}
	if !force {
		return fmt.Errorf("%s %w (%s, ...): remove them, choose another -o, or pass --force to remove them", dir, ErrEarlierDumps, filepath.Base(old[0].Path))
	}
	for _, d := range old {
		if err := os.Remove(d.Path); err != nil {
			return err
		}
	}
	return nil
}
