package snapshot

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by readers wrap one of them, so callers can tell a file that is not a
// snapshot from a damaged one with errors.Is.
var (
	// ErrNotSnapshot means the input does not start with the snapshot magic: it is some other kind of file.
	ErrNotSnapshot = errors.New("not an oomdbg snapshot")
	// ErrUnsupportedVersion means the file was written in a format version this reader does not know.
	ErrUnsupportedVersion = errors.New("unsupported snapshot format version")
	// ErrTruncated means the input ended before a complete structure; see TruncatedError for a file that was
	// cut short after its header.
	ErrTruncated = errors.New("snapshot truncated")
	// ErrChecksum means a header or chunk does not match its CRC-32C: the bytes were damaged.
	ErrChecksum = errors.New("checksum mismatch")
	// ErrLimit means a declared length or count exceeds a reader limit (see Limits).
	ErrLimit = errors.New("limit exceeded")
	// ErrEventLimit means the input holds more events than Limits.Events; it wraps ErrLimit.
	ErrEventLimit = fmt.Errorf("%w: too many events", ErrLimit)
	// ErrCorrupt means the bytes are well framed but do not decode: a bad varint, an undefined table ID, an
	// invalid action, trailing bytes.
	ErrCorrupt = errors.New("corrupt snapshot")
	// ErrInvalidEvent is returned by Writer.Write for an event the format cannot hold (invalid action, phase
	// or category, or a table ID that was never interned).
	ErrInvalidEvent = errors.New("invalid event")
	// ErrWriterClosed is returned by a Writer used after Close.
	ErrWriterClosed = errors.New("snapshot writer closed")
)

// DecodeError describes where and why a snapshot could not be decoded.
type DecodeError struct {
	Offset int64  // byte offset in the input of the structure that failed (a header or chunk start, or the failing byte)
	Op     string // what was being decoded, e.g. "read chunk header", "decode events"
	Err    error  // the cause; wraps one of the sentinel errors
}

// Error says what failed, where: "snapshot: decode chunk at byte 1234: corrupt snapshot: ...".
func (e *DecodeError) Error() string {
	return fmt.Sprintf("snapshot: %s at byte %d: %v", e.Op, e.Offset, e.Err)
}

// Unwrap returns the cause.
func (e *DecodeError) Unwrap() error { return e.Err }

// TruncatedError is the warning a reader reports when a snapshot ends before its end chunk: the recording was
// killed, ran out of disk, or is still being written. Everything before Offset was read; it is not an error.
type TruncatedError struct {
	Offset int64  // bytes of whole chunks read; the data after it is missing or incomplete
	Events uint64 // events read before Offset
	Reason string // what was found at Offset, e.g. "incomplete chunk" or "end of input"
}

// Error says where the snapshot ends and how much of it was read.
func (e *TruncatedError) Error() string {
	return fmt.Sprintf("snapshot cut short at byte %d (%s): read %d events; the recording ended without closing the file",
		e.Offset, e.Reason, e.Events)
}

// Unwrap returns ErrTruncated, so errors.Is(w, ErrTruncated) holds for a warning.
func (e *TruncatedError) Unwrap() error { return ErrTruncated }

// corruptf returns an ErrCorrupt-wrapping error with a message.
func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// limitf returns an ErrLimit-wrapping error with a message.
func limitf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrLimit, fmt.Sprintf(format, args...))
}
