package snapshot

import (
	"fmt"
	"io"
	"os"
)

// Snapshot is a whole snapshot in memory: what Read returns. Tables are indexed by ID; index 0 holds the zero
// entry ("" for strings, no frames for stacks), so a lookup is an index.
type Snapshot struct {
	Meta    Meta
	Events  Events // in Seq order
	Strings []string
	Frames  []Frame
	Stacks  [][]FrameID // innermost frame first
	Footer  *Footer     // nil if the writer wrote none or the file was cut short
	// Warning is a *TruncatedError if the file ended before its end chunk: Events is the readable prefix.
	Warning error
}

// String returns the string with the given ID, "" for an unknown one.
func (s *Snapshot) String(id StringID) string {
	if int(id) < len(s.Strings) {
		return s.Strings[id]
	}
	return ""
}

// Frame returns the frame with the given ID, the zero Frame for an unknown one.
func (s *Snapshot) Frame(id FrameID) Frame {
	if int(id) < len(s.Frames) {
		return s.Frames[id]
	}
	return Frame{}
}

// Stack returns the frames of a stack, innermost first; nil for 0 or an unknown ID.
func (s *Snapshot) Stack(id StackID) []FrameID {
	if int(id) < len(s.Stacks) {
		return s.Stacks[id]
	}
	return nil
}

// Read reads a whole snapshot from r. A snapshot cut short returns its readable prefix with s.Warning set,
// and no error. A damaged one returns the events before the damage together with a *DecodeError; only an
// unreadable header returns a nil Snapshot. Limits.Events and Limits.EventsPerByte cap the events held in
// memory.
func Read(r io.Reader, opts ...ReaderOption) (*Snapshot, error) {
	rd, err := NewReader(r, opts...)
	if err != nil {
		return nil, err
	}
	s := &Snapshot{}
	for err == nil {
		err = rd.ReadInto(s)
	}
	s.Events.releasePacker()
	if err == io.EOF {
		err = nil
	}
	return s, err
}

// ReadFile reads the snapshot file at path; see Read.
func ReadFile(path string, opts ...ReaderOption) (*Snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s, err := Read(f, opts...)
	if err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}
