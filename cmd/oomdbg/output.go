package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/charmbracelet/x/term"
)

// Where run and export put what they write (-o). The policy, the same for both:
//
//   - "-" is standard output, and so is a path that names the file standard output already is
//     (/dev/stdout, /proc/self/fd/1, or the file it is redirected to); the summary then goes to standard
//     error. A binary snapshot is never written to a terminal.
//   - A path that does not exist is created; a regular file is replaced (export writes a temporary file
//     beside it and renames it over the target only once the export is complete; run writes its
//     recording in place as it goes, so that it can be followed and survives a crash).
//   - A symbolic link, or a regular file without write permission, is refused unless --force: with it the
//     link is followed and its target replaced (the link stays), and a read-only file is replaced.
//   - A directory, a device, a FIFO or a socket is never replaced: export refuses them. run, which streams,
//     writes into a FIFO or a character device (/dev/null) as into a pipe, and refuses the others.

// outputKind is what an output path names.
type outputKind int

const (
	outputNew     outputKind = iota // nothing there yet
	outputRegular                   // a regular file, replaced
	outputStdout                    // standard output
	outputStream                    // a FIFO or a character device other than a terminal: written into
)

// output is a checked output path.
type output struct {
	path   string // as the user wrote it, for messages
	target string // the file to write: path, or with --force what its links lead to
	kind   outputKind
}

// errNotRegular is the cause of refusing a target that is not a regular file.
var errNotRegular = errors.New("not a regular file")

// checkOutput applies the policy to path. streams says whether the writer can write into FIFOs and character
// devices (run) rather than replace its target (export).
func checkOutput(path string, force, streams bool) (output, error) {
	o := output{path: path, target: path}
	if path == "-" || isStdout(path) {
		o.kind = outputStdout
		return o, nil
	}
	if path == "" {
		return o, errors.New("the output path is empty")
	}
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		o.kind = outputNew
		return o, nil
	}
	if err != nil {
		return o, fmt.Errorf("cannot write %s: %w", path, pathCause(err))
	}
	if st.Mode()&fs.ModeSymlink != 0 {
		if !force {
			return o, fmt.Errorf("refusing to write %s: it is a symbolic link (--force writes to what it links to)", path)
		}
		if o.target, err = filepath.EvalSymlinks(path); errors.Is(err, fs.ErrNotExist) {
			// A dangling link: create what it names.
			if o.target, err = os.Readlink(path); err == nil && !filepath.IsAbs(o.target) {
				o.target = filepath.Join(filepath.Dir(path), o.target)
			}
			o.kind = outputNew
			return o, err
		} else if err != nil {
			return o, fmt.Errorf("cannot write %s: %w", path, pathCause(err))
		}
		if st, err = os.Stat(o.target); err != nil {
			return o, fmt.Errorf("cannot write %s: %w", path, pathCause(err))
		}
	}
	mode := st.Mode()
	switch {
	case mode.IsRegular():
		if readOnly(o.target, mode) && !force {
			return o, fmt.Errorf("refusing to replace %s: it is read-only (--force replaces it)", path)
		}
		o.kind = outputRegular
		return o, nil
	case streams && (mode&fs.ModeNamedPipe != 0 || mode&fs.ModeCharDevice != 0):
		// Only a character device can be a terminal. A FIFO is never probed: opening it, even without
		// blocking, would pair with a reader already waiting, and closing the probe would hand that reader
		// an end of file before the recording starts.
		if mode&fs.ModeCharDevice != 0 && isTerminalPath(o.target) {
			return o, fmt.Errorf("refusing to write a binary snapshot to the terminal %s", path)
		}
		o.kind = outputStream
		return o, nil
	}
	return o, fmt.Errorf("refusing to replace %s: it is %s, %w", path, describeMode(mode), errNotRegular)
}

// describeMode names a file type for messages.
func describeMode(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "not a regular file"
}

// isStdout reports whether path names the file standard output is.
func isStdout(path string) bool {
	out, err1 := os.Stdout.Stat()
	st, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(out, st)
}

// readOnly reports whether the regular file at path, of the given mode, is read-only: nobody may write it
// (as chmod a-w leaves it, which binds even root), or this user may not open it for writing.
func readOnly(path string, mode fs.FileMode) bool {
	if mode.Perm()&0o222 == 0 {
		return true
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return true
	}
	f.Close()
	return false
}

// isTerminalPath reports whether path is a terminal.
func isTerminalPath(path string) bool {
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NOCTTY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	return term.IsTerminal(f.Fd())
}

// isTerminalWriter reports whether w is a terminal.
func isTerminalWriter(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(f.Fd())
}

// pathCause strips the path from an *fs.PathError or *os.LinkError, so that a message names the target the
// user gave, not a temporary file or a link's target.
func pathCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}

// openStream opens o for run, which writes its recording in place: created, truncated, or (a FIFO, a device)
// opened for writing. stdout is standard output for outputStdout.
func (o output) openStream(stdout io.Writer) (w io.Writer, closeFn func() error, err error) {
	switch o.kind {
	case outputStdout:
		if isTerminalWriter(stdout) {
			return nil, nil, errors.New("refusing to write a binary snapshot to a terminal: redirect standard output, or name a file with -o")
		}
		return stdout, func() error { return nil }, nil
	case outputStream:
		f, err := os.OpenFile(o.target, os.O_WRONLY, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("cannot write %s: %w", o.path, pathCause(err))
		}
		return f, f.Close, nil
	case outputRegular:
		// A read-only file (allowed by --force) is replaced by a new one, not written through.
		if st, err := os.Stat(o.target); err == nil && readOnly(o.target, st.Mode()) {
			if err := os.Remove(o.target); err != nil {
				return nil, nil, fmt.Errorf("cannot replace %s: %w", o.path, pathCause(err))
			}
		}
	}
	f, err := os.OpenFile(o.target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot write %s: %w", o.path, pathCause(err))
	}
	return f, f.Close, nil
}

// writeAtomic writes o through a temporary file in the target's directory, renamed over the target only when
// write succeeds, so a failed export leaves no half-written file behind and the target is replaced whole.
// Errors of the file system name the path the user gave, never the temporary file; write's own errors pass
// unchanged.
func (o output) writeAtomic(write func(io.Writer) (string, error)) (string, error) {
	what, err := o.writeTemp(write)
	var fe *fileError
	if errors.As(err, &fe) {
		return "", fmt.Errorf("cannot write %s: %w", o.path, pathCause(fe.err))
	}
	return what, err
}

// fileError marks an error of the file system, as opposed to one of the data being written.
type fileError struct{ err error }

func (e *fileError) Error() string { return e.err.Error() }
func (e *fileError) Unwrap() error { return e.err }

// fileWriter marks the errors of writes to f as fileErrors.
type fileWriter struct{ f *os.File }

func (w fileWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	if err != nil {
		err = &fileError{err}
	}
	return n, err
}

func (o output) writeTemp(write func(io.Writer) (string, error)) (string, error) {
	tmp, err := os.CreateTemp(filepath.Dir(o.target), "."+filepath.Base(o.target)+".*.tmp")
	if err != nil {
		return "", &fileError{err}
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing left to remove
	w := bufio.NewWriterSize(fileWriter{tmp}, 1<<20)
	what, err := write(w)
	if err == nil {
		err = w.Flush()
	}
	if cerr := tmp.Close(); err == nil && cerr != nil {
		err = &fileError{cerr}
	}
	if err == nil {
		if err = os.Chmod(tmp.Name(), 0o644); err == nil {
			err = os.Rename(tmp.Name(), o.target)
		}
		if err != nil {
			err = &fileError{err}
		}
	}
	return what, err
}
