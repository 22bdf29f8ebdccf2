package torch

import (
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/oomdbg/oomdbg/internal/pickle"
)

// Sentinel errors. Every error Import returns is an *ImportError whose Err wraps one of these, so callers can
// sort failures with errors.Is.
var (
	// ErrNotSnapshot means the input is neither a pickle nor JSON, or is one that holds no PyTorch memory
	// snapshot (no segments and no device traces).
	ErrNotSnapshot = errors.New("not a PyTorch memory snapshot")
	// ErrSchema means a field of the snapshot has the wrong type or an impossible value.
	ErrSchema = errors.New("unexpected snapshot structure")
	// ErrUnsafe means the pickle holds an opcode that would import or call Python code (GLOBAL, REDUCE, ...).
	// PyTorch never writes one; such a file was crafted, or is not a memory snapshot.
	ErrUnsafe = errors.New("pickle would run code")
	// ErrTruncated means the input ends early: the file was cut short.
	ErrTruncated = errors.New("snapshot truncated")
	// ErrLimit means the input exceeds a Limits field.
	ErrLimit = errors.New("limit exceeded")
	// ErrMalformed means the bytes do not decode: a damaged pickle or invalid JSON.
	ErrMalformed = errors.New("malformed input")
	// ErrMemory means the import would hold more memory than Limits.MaxMemory allows; the cause is a
	// *MemoryError. It also matches ErrLimit.
	ErrMemory error = memoryCeiling{}
)

type memoryCeiling struct{}

func (memoryCeiling) Error() string        { return "memory ceiling reached" }
func (memoryCeiling) Is(target error) bool { return target == ErrLimit }

// MemoryError is the cause of an import that would pass Limits.MaxMemory: what it was doing, the bytes it
// held and the bytes it needed more. Held+More is what the import needs at least. It matches ErrMemory and
// ErrLimit.
type MemoryError struct {
	What            string // "decoding the pickle", "building the events", ...
	Held, More, Max int64
}

func (e *MemoryError) Error() string {
	return fmt.Sprintf("%v: %s would need %d more bytes with %d held, past Limits.MaxMemory (%d bytes)",
		ErrMemory, e.What, e.More, e.Held, e.Max)
}

// Is reports whether target is ErrMemory or ErrLimit.
func (e *MemoryError) Is(target error) bool { return target == ErrMemory || target == ErrLimit }

// ImportError describes why a snapshot could not be imported and where in its structure.
type ImportError struct {
	// Path locates the failing value in the snapshot's structure, as a Python expression would:
	// "device_traces[0][1234].size", "segments[3].blocks[7].state". It is "" for failures of the whole
	// input (not a snapshot, a pickle that does not decode).
	Path string
	// Offset is the byte offset of the failure in the input, when known (decode failures), else -1.
	Offset int64
	// Err is the cause; it wraps one of the sentinel errors of this package, or is the error of the reader
	// the input came from.
	Err error
}

// Error says what failed where, in one line: "torch: device_traces[0][1234].size: want int, got str".
func (e *ImportError) Error() string {
	if e.Path == "" {
		return "torch: " + e.Err.Error()
	}
	return "torch: " + e.Path + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *ImportError) Unwrap() error { return e.Err }

// schemaErr reports a value of the wrong type or an impossible value at path.
func schemaErr(path, format string, args ...any) error {
	return &ImportError{Path: path, Offset: -1, Err: fmt.Errorf("%w: "+format, append([]any{ErrSchema}, args...)...)}
}

// wantErr reports a value of the wrong type at path: "want int, got str".
func wantErr(path, want string, got pickle.Value) error {
	return &ImportError{Path: path, Offset: -1, Err: fmt.Errorf("%w: want %s, got %s", ErrSchema, want, pyType(got))}
}

// limitErr reports a snapshot over one of the Limits.
func limitErr(path, format string, args ...any) error {
	return &ImportError{Path: path, Offset: -1, Err: fmt.Errorf("%w: "+format, append([]any{ErrLimit}, args...)...)}
}

// decodeErr turns a pickle decoder failure into an ImportError wrapping both this package's sentinel and the
// decoder's own error. max is the memory ceiling the decode ran under.
func decodeErr(err error, max int64) error {
	var de *pickle.DecodeError
	var pme *pickle.MemoryError
	off := int64(-1)
	if errors.As(err, &de) {
		off = de.Offset
	}
	kind := ErrMalformed
	switch {
	case errors.As(err, &pme):
		return &ImportError{Offset: off, Err: &MemoryError{What: "decoding the pickle at offset " + strconv.FormatInt(off, 10),
			Held: pme.Held, More: pme.More, Max: max}}
	case errors.Is(err, pickle.ErrRefused):
		kind = ErrUnsafe
	case errors.Is(err, io.ErrUnexpectedEOF):
		kind = ErrTruncated
	case errors.Is(err, pickle.ErrLimit):
		kind = ErrLimit
	case !errors.Is(err, pickle.ErrMalformed) && !errors.Is(err, pickle.ErrUnsupported):
		return &ImportError{Offset: off, Err: err} // reading failed: the reader's error, as the decoder wrapped it
	}
	return &ImportError{Offset: off, Err: fmt.Errorf("%w: %w", kind, err)}
}

// buildErr turns a failure to convert a JSON snapshot into an ImportError.
func buildErr(err error) error {
	if pme := (*pickle.MemoryError)(nil); errors.As(err, &pme) {
		return &ImportError{Offset: -1, Err: &MemoryError{What: "building the JSON's values", Held: pme.Held, More: pme.More, Max: pme.Max}}
	}
	kind := ErrMalformed
	if errors.Is(err, pickle.ErrLimit) || errors.Is(err, ErrLimit) {
		kind = ErrLimit
	}
	if errors.Is(err, kind) {
		return &ImportError{Offset: -1, Err: err}
	}
	return &ImportError{Offset: -1, Err: fmt.Errorf("%w: %w", kind, err)}
}
