// Package load opens a snapshot file of any format oomdbg reads, telling them apart by their first bytes,
// never by their names: oomdbg's own format (the magic "\x89OOMDBG\n"), and PyTorch memory snapshots (the
// pickle torch.cuda.memory._dump_snapshot writes, memory_snapshot()'s list of segments, or either as JSON).
// The view, report, check, diff, replay and export commands open their files through it.
//
// A file is opened once and its format told from a buffered reader that keeps the bytes it looked at, so
// FIFOs, /dev/stdin and "-" (standard input) read like files. What loading may cost is bounded by a Budget.
package load

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// ErrUnknownFormat means a file is neither an oomdbg snapshot nor a PyTorch memory snapshot. Its error reads
// "PATH is neither an oomdbg snapshot nor a PyTorch memory snapshot (pickle or JSON)".
var ErrUnknownFormat = errors.New("neither an oomdbg snapshot nor a PyTorch memory snapshot (pickle or JSON)")

// ErrEmpty means a file holds no bytes at all: "PATH is empty (0 bytes): nothing was written to it".
var ErrEmpty = errors.New("empty (0 bytes): nothing was written to it")

// ErrMemory means a snapshot needs more memory than its Budget allows; errors wrapping it are *MemoryError.
var ErrMemory = errors.New("over the memory budget")

// MemoryError says that a snapshot does not fit its Budget, and how far loading got.
type MemoryError struct {
	Path   string
	Events uint64 // the snapshot holds more events than this (0: unknown)
	Need   int64  // bytes it would take at least
	Budget Budget
}

// Error says how far the snapshot is over the budget.
func (e *MemoryError) Error() string {
	if e.Events > 0 {
		return fmt.Sprintf("%s holds more than %d events, more than fit the memory limit of %s at %d bytes each",
			e.Path, e.Events, units.FormatSize(e.Budget.Memory), perEvent(e.Budget))
	}
	return fmt.Sprintf("%s needs about %s of memory to open, more than the limit of %s", e.Path, units.FormatSize(e.Need), units.FormatSize(e.Budget.Memory))
}

// Unwrap returns ErrMemory.
func (e *MemoryError) Unwrap() error { return ErrMemory }

// Format is a snapshot file format.
type Format int

// The formats File reads.
const (
	FormatUnknown Format = iota
	FormatNative         // oomdbg's own (docs/format.md)
	FormatPyTorch        // a PyTorch memory snapshot, pickle or JSON
)

// String names the format.
func (f Format) String() string {
	switch f {
	case FormatNative:
		return "oomdbg"
	case FormatPyTorch:
		return "pytorch"
	}
	return "unknown"
}

// sniffBytes is how much of a file Sniff is given: the magic, or a JSON document's leading white space.
const sniffBytes = 4 << 10

// Sniff tells the format of a file from its first bytes. A prefix of the magic, as a recording cut inside
// its first bytes leaves, counts as oomdbg's format, so that reading it says where it was cut.
func Sniff(prefix []byte) Format {
	switch {
	case len(prefix) > 0 && bytes.HasPrefix([]byte(snapshot.Magic), prefix[:min(len(prefix), len(snapshot.Magic))]):
		return FormatNative
	case torch.Sniff(prefix):
		return FormatPyTorch
	}
	return FormatUnknown
}

// Budget bounds the memory loading a snapshot may lead to: the snapshot itself and the analysis its caller
// runs on it, which costs about PerEvent bytes for every event. The zero Budget is unlimited (the readers'
// own Limits still apply).
type Budget struct {
	Memory   int64 // bytes; 0: no limit
	PerEvent int64 // bytes each event costs, loaded and analysed; 0: DefaultPerEvent
}

// DefaultPerEvent is what an event costs a caller that only reads the snapshot: snapshot.Read of an
// 11.7M-event recording holds 12 bytes an event in its columns and allocates 29 while they grow (the old
// arrays alive while they are copied), rounded up.
const DefaultPerEvent = 32

// MaxEvents returns how many events fit b, or 0 for no limit.
func (b Budget) MaxEvents() uint64 {
	if b.Memory <= 0 {
		return 0
	}
	per := b.PerEvent
	if per <= 0 {
		per = DefaultPerEvent
	}
	return uint64(max(b.Memory/per, 1))
}

// Option configures Open and File.
type Option func(*config)

type config struct {
	budget Budget
	follow context.Context
}

// WithBudget bounds the memory a load may lead to.
func WithBudget(b Budget) Option { return func(c *config) { c.budget = b } }

// WithFollow makes Open wait, until ctx is done, for a file that is still being written to show its format.
func WithFollow(ctx context.Context) Option { return func(c *config) { c.follow = ctx } }

// Input is a snapshot file opened once, with its format told from its first bytes.
type Input struct {
	Path   string
	Format Format
	// Size is the file's size when it is a regular file, -1 otherwise (a pipe, a terminal).
	Size int64
	br   *bufio.Reader
	f    *os.File
	cfg  config
}

// Open opens path ("-" is standard input) and tells its format. An empty file is ErrEmpty and a file of
// another kind ErrUnknownFormat, both naming the path; with WithFollow an empty or short file is waited on.
func Open(path string, opts ...Option) (*Input, error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	f := os.Stdin
	if path != "-" {
		var err error
		if f, err = os.Open(path); err != nil {
			return nil, err
		}
	}
	in := &Input{Path: path, Size: -1, br: bufio.NewReaderSize(f, 64<<10), f: f, cfg: c}
	if st, err := f.Stat(); err == nil {
		switch {
		case st.Mode().IsRegular():
			in.Size = st.Size()
		case st.IsDir():
			in.Close()
			return nil, fmt.Errorf("%s is a directory, not a snapshot file", path)
		}
	}
	prefix, err := in.peek()
	if err != nil {
		in.Close()
		return nil, err
	}
	in.Format = Sniff(prefix)
	switch {
	case len(prefix) == 0:
		in.Close()
		return nil, fmt.Errorf("%s is %w", path, ErrEmpty)
	case in.Format == FormatUnknown:
		in.Close()
		return nil, fmt.Errorf("%s is %w", path, ErrUnknownFormat)
	}
	return in, nil
}

// peek returns the first bytes of the input: the magic's length, or up to sniffBytes when they are blank (a
// JSON document may start with white space). It asks for no more than it needs, so a pipe whose writer has
// written only a header is not waited on. Following, it waits for a file that is still empty or short.
func (in *Input) peek() ([]byte, error) {
	for {
		prefix, err := in.br.Peek(len(snapshot.Magic))
		if err == nil && len(bytes.Trim(prefix, " \t\r\n\xef\xbb\xbf")) == 0 {
			prefix, err = in.br.Peek(sniffBytes)
		}
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%s: %w", in.Path, err)
		}
		ctx := in.cfg.follow
		if err == nil || ctx == nil || Sniff(prefix) == FormatPyTorch || len(prefix) >= len(snapshot.Magic) {
			return prefix, nil
		}
		select { // a recording that has not written its header yet
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Reader returns the input from its first byte: the bytes looked at are still there.
func (in *Input) Reader() io.Reader { return in.br }

// Close closes the file (never standard input).
func (in *Input) Close() error {
	if in.f == os.Stdin {
		return nil
	}
	return in.f.Close()
}

// Load reads the whole snapshot. An oomdbg snapshot cut short returns its readable prefix with
// Snapshot.Warning set, as snapshot.Read does; a damaged one returns what came before the damage together
// with the error. A PyTorch snapshot is imported whole or not at all, a pickle decoded as it is read
// (torch.ImportReader). Errors name the path; a snapshot over the Budget is a *MemoryError.
func (in *Input) Load() (*snapshot.Snapshot, error) {
	b := in.cfg.budget
	switch in.Format {
	case FormatNative:
		var lim snapshot.Limits
		if n := b.MaxEvents(); n > 0 && n < snapshot.DefaultLimits().Events {
			lim.Events = n
		}
		s, err := snapshot.Read(in.br, snapshot.WithLimits(lim))
		if lim.Events > 0 && errors.Is(err, snapshot.ErrEventLimit) {
			return nil, &MemoryError{Path: in.Path, Events: lim.Events, Need: int64(lim.Events) * perEvent(b), Budget: b}
		}
		if err != nil {
			return s, fmt.Errorf("%s: %w", in.Path, err)
		}
		return s, nil
	case FormatPyTorch:
		return importPyTorch(in, b)
	}
	return nil, fmt.Errorf("%s is %w", in.Path, ErrUnknownFormat)
}

func perEvent(b Budget) int64 {
	if b.PerEvent > 0 {
		return b.PerEvent
	}
	return DefaultPerEvent
}

// File opens and loads the snapshot at path ("-" is standard input); see Open and Input.Load.
func File(path string, opts ...Option) (*snapshot.Snapshot, error) {
	in, err := Open(path, opts...)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	return in.Load()
}
