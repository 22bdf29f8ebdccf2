package pickle

import (
	"errors"
	"fmt"
	"io"
)

// Sentinel errors. Every error Decode returns is a *DecodeError whose Err wraps one of these or
// io.ErrUnexpectedEOF, so callers can sort failures with errors.Is.
var (
	// ErrRefused means the pickle holds an opcode that would run Python code or needs out-of-band data.
	// PyTorch snapshots never contain one; a file that does is not a snapshot, or is hostile.
	ErrRefused = errors.New("opcode refused")
	// ErrUnsupported means a valid pickle feature this decoder does not implement (a protocol above 5, the
	// text string opcodes of protocol 0).
	ErrUnsupported = errors.New("unsupported pickle feature")
	// ErrLimit means a declared length, a count or a nesting depth exceeds a Limits field.
	ErrLimit = errors.New("limit exceeded")
	// ErrMalformed means the bytes do not form a pickle Python would load: an unknown opcode, a stack
	// underflow, a missing memo entry, invalid UTF-8, an unhashable dict key, an operation on the wrong type.
	ErrMalformed = errors.New("malformed pickle")
)

// DecodeError describes where and why a pickle could not be decoded.
type DecodeError struct {
	// Offset is the byte offset of the failing opcode (where a cut-off opcode starts), the input length when
	// the input ends between opcodes, or the bytes read when reading the input failed.
	Offset int64
	// Op is the opcode name, such as "BINUNICODE", "0xff" for an unknown byte, "" when no opcode was read.
	Op string
	// Err is the cause. It wraps ErrRefused, ErrUnsupported, ErrLimit, ErrMalformed, io.ErrUnexpectedEOF
	// (truncated input), or the reader's error.
	Err error
}

// Error says what failed where, in one line: "pickle: opcode GLOBAL at offset 2: would run code; …".
func (e *DecodeError) Error() string {
	if e.Op == "" {
		return fmt.Sprintf("pickle: at offset %d: %v", e.Offset, e.Err)
	}
	return fmt.Sprintf("pickle: opcode %s at offset %d: %v", e.Op, e.Offset, e.Err)
}

// Unwrap returns the cause.
func (e *DecodeError) Unwrap() error { return e.Err }

// truncated is the cause when the input ends inside an opcode or before STOP. It unwraps to
// io.ErrUnexpectedEOF, the standard library's name for that.
type truncated struct{}

func (truncated) Error() string { return "input truncated: the file was cut short (unexpected EOF)" }
func (truncated) Unwrap() error { return io.ErrUnexpectedEOF }

var errTruncated error = truncated{}

// refusal is the cause for a refused opcode: a fixed sentence saying why, matching ErrRefused.
type refusal string

func (r refusal) Error() string        { return string(r) }
func (r refusal) Is(target error) bool { return target == ErrRefused }

const (
	errRunsCode  refusal = "would run code; snapshots never contain it"
	errOutOfBand refusal = "needs out-of-band buffers; snapshots never contain them"
)

// malformed returns a cause wrapping ErrMalformed. Only the error path pays for the formatting.
func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

// overLimit returns a cause wrapping ErrLimit, naming the Limits field so the fix is obvious.
func overLimit(what string, n int64, field string, max int64) error {
	return fmt.Errorf("%w: %s %d > Limits.%s (%d)", ErrLimit, what, n, field, max)
}

// Fixed causes, allocated once.
var (
	errUnderflow = fmt.Errorf("%w: stack underflow", ErrMalformed)
	errNoMark    = fmt.Errorf("%w: no MARK on the stack", ErrMalformed)
	errCycle     = fmt.Errorf("%w: container modified after it was shared (a self-referencing structure)", ErrMalformed)
)

// errInternal marks a panic caught at the decode boundary: a bug in this package, never the input's fault.
var errInternal = errors.New("internal decoder error")
