// Package outfile is where run and export put what they write (-o), by one policy:
//
//   - "-" is standard output, and so is a path that names the file standard output already is
//     (/dev/stdout, /proc/self/fd/1, or the file it is redirected to); the summary then goes to standard
//     error. A binary snapshot is never written to a terminal.
//   - A path that does not exist is created; a regular file is replaced (export writes a temporary file
//     beside it and renames it over the target only once the export is complete; run writes its
//     recording in place as it goes, so that it can be followed and survives a crash, under a lock that a
//     second run into the same file finds taken: it refuses rather than interleave its chunks).
//   - A symbolic link, or a regular file without write permission, is refused unless --force: with it the
//     link is followed and its target replaced (the link stays), and a read-only file is replaced.
//   - A directory, a device, a FIFO or a socket is never replaced: export refuses them. run, which streams,
//     writes into a FIFO or a character device (/dev/null) as into a pipe, and refuses the others.
package outfile

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

// Kind is what an output path names.
type Kind int

const (
	New     Kind = iota // nothing there yet
	Regular             // a regular file, replaced
	Stdout              // standard output
	Stream              // a FIFO or a character device other than a terminal: written into
)

// Output is a checked output path.
type Output struct {
	Path   string // as the user wrote it, for messages
	Target string // the file to write: Path, or with --force what its links lead to
	Kind   Kind
}

// ErrNotRegular is the cause of refusing a target that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// Check applies the policy to path. streams says whether the writer can write into FIFOs and character
// devices (run) rather than replace its target (export). It opens nothing: a FIFO's waiting reader is left
// alone.
func Check(path string, force, streams bool) (Output, error) {
	o := Output{Path: path, Target: path}
	if path == "-" || isStdout(path) {
		o.Kind = Stdout
		return o, nil
	}
	if path == "" {
		return o, errors.New("the output path is empty")
	}
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		o.Kind = New
		return o, nil
	}
	if err != nil {
		return o, fmt.Errorf("cannot write %s: %w", path, pathCause(err))
	}
	if st.Mode()&fs.ModeSymlink != 0 {
		if !force {
			return o, fmt.Errorf("refusing to write %s: it is a symbolic link (--force writes to what it links to)", path)
		}
		if o.Target, err = filepath.EvalSymlinks(path); errors.Is(err, fs.ErrNotExist) {
			// A dangling link: create what it names.
			if o.Target, err = os.Readlink(path); err == nil && !filepath.IsAbs(o.Target) {
				o.Target = filepath.Join(filepath.Dir(path), o.Target)
			}
			o.Kind = New
			return o, err
		} else if err != nil {
			return o, fmt.Errorf("cannot write %s: %w", path, pathCause(err))
		}
		if st, err = os.Stat(o.Target); err != nil {
			return o, fmt.Errorf("cannot write %s: %w", path, pathCause(err))
		}
	}
	mode := st.Mode()
	switch {
	case mode.IsRegular():
		if readOnly(o.Target, mode) && !force {
			return o, fmt.Errorf("refusing to replace %s: it is read-only (--force replaces it)", path)
		}
		o.Kind = Regular
		return o, nil
	case streams && (mode&fs.ModeNamedPipe != 0 || mode&fs.ModeCharDevice != 0):
		// Only a character device can be a terminal. A FIFO is never probed: opening it, even without
		// blocking, would pair with a reader already waiting, and closing the probe would hand that reader
		// an end of file before the recording starts.
		if mode&fs.ModeCharDevice != 0 && isTerminalPath(o.Target) {
			return o, fmt.Errorf("refusing to write a binary snapshot to the terminal %s", path)
		}
		o.Kind = Stream
		return o, nil
	}
	return o, fmt.Errorf("refusing to replace %s: it is %s, %w", path, describeMode(mode), ErrNotRegular)
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

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
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

// OpenError is a failure to open or replace the output: "cannot write PATH: permission denied".
type OpenError struct {
	Path    string
	Replace bool // removing a read-only file failed
	Err     error
}

func (e *OpenError) Error() string {
	if e.Replace {
		return fmt.Sprintf("cannot replace %s: %v", e.Path, e.Err)
	}
	return fmt.Sprintf("cannot write %s: %v", e.Path, e.Err)
}

func (e *OpenError) Unwrap() error { return e.Err }

// Stream returns a writer into o for run, which writes its recording in place: created, truncated, or (a
// FIFO, a device) opened for writing. stdout is standard output for Stdout, refused when it is a terminal.
// A FIFO or a device is opened now: there is nothing in it to keep, and the open of a FIFO waits for its
// reader before the run starts. A file is created or truncated at the first write, so that a run refused
// before it writes anything (a configuration that cannot run) leaves it as it was; an *OpenError is then
// that write's error. closeFn closes what was opened.
func (o Output) Stream(stdout io.Writer) (w io.Writer, closeFn func() error, err error) {
	switch o.Kind {
	case Stdout:
		if IsTerminal(stdout) {
			return nil, nil, errors.New("refusing to write a binary snapshot to a terminal: redirect standard output, or name a file with -o")
		}
		return stdout, func() error { return nil }, nil
	case Stream:
		f, err := o.open()
		if err != nil {
			return nil, nil, err
		}
		return f, f.Close, nil
	}
	s := &stream{o: o}
	return s, s.close, nil
}

// stream is an output file opened at its first write.
type stream struct {
	o   Output
	f   *os.File
	err error
}

func (s *stream) Write(p []byte) (int, error) {
	if s.f == nil && s.err == nil {
		s.f, s.err = s.o.open()
	}
	if s.err != nil {
		return 0, s.err
	}
	return s.f.Write(p)
}

func (s *stream) close() error {
	if s.f == nil {
		return nil
	}
	return s.f.Close()
}

// open opens o for writing in place.
func (o Output) open() (*os.File, error) {
	switch o.Kind {
	case Stream:
		f, err := os.OpenFile(o.Target, os.O_WRONLY, 0)
		if err != nil {
			return nil, &OpenError{Path: o.Path, Err: pathCause(err)}
		}
		return f, nil
	case Regular:
		// A read-only file (allowed by --force) is replaced by a new one, not written through.
		if st, err := os.Stat(o.Target); err == nil && readOnly(o.Target, st.Mode()) {
			if err := os.Remove(o.Target); err != nil {
				return nil, &OpenError{Path: o.Path, Replace: true, Err: pathCause(err)}
			}
		}
	}
	// Opened without truncating, locked, then truncated: of two runs writing one file at once, the second
	// finds it locked and leaves it alone, where two truncating writers would interleave their chunks into a
	// file that is neither recording. The lock goes with the process, however it ends.
	f, err := os.OpenFile(o.Target, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, &OpenError{Path: o.Path, Err: pathCause(err)}
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
		f.Close()
		return nil, &OpenError{Path: o.Path, Err: ErrBusy}
	} // a file system without locks: written as before
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, &OpenError{Path: o.Path, Err: pathCause(err)}
	}
	return f, nil
}

// ErrBusy is the cause of refusing a file another process is recording into.
var ErrBusy = errors.New("another process is recording into it (a run still going?); choose another -o, or wait for it")

// WriteAtomic writes o through a temporary file in the target's directory, renamed over the target only when
// write succeeds, so a failed export leaves no half-written file behind and the target is replaced whole.
// Errors of the file system name the path the user gave, never the temporary file; write's own errors pass
// unchanged.
func (o Output) WriteAtomic(write func(io.Writer) (string, error)) (string, error) {
	what, err := o.writeTemp(write)
	var fe *fileError
	if errors.As(err, &fe) {
		return "", fmt.Errorf("cannot write %s: %w", o.Path, pathCause(fe.err))
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

func (o Output) writeTemp(write func(io.Writer) (string, error)) (string, error) {
	tmp, err := os.CreateTemp(filepath.Dir(o.Target), "."+filepath.Base(o.Target)+".*.tmp")
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
			err = os.Rename(tmp.Name(), o.Target)
		}
		if err != nil {
			err = &fileError{err}
		}
	}
	return what, err
}
