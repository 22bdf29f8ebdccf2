package snapshot

import (
	"errors"
	"fmt"
)

// MaxBytes bounds the sizes one snapshot may name, all together: the sizes of its allocator events (Size,
// BlockSize) and of its final state add up to at most MaxBytes (2^55 bytes, 32 PiB), and each of them, and
// each event's DeviceFree, lies in [0, MaxSize]. The largest recordings come nowhere near: a GPT-2 training
// loop names about 180 MB an event (2^52.9 bytes over the 46.8 million events of the longest recording
// known), and a reader holds at most 2^26 events. What passes them is a file made to overflow. Within them,
// any sum or difference of a snapshot's sizes, each a hundred times over (percentages), and every what-if on
// them (a batch scaled up to 64 times, recomputed once more) fits an int64: no total the analysis takes can
// wrap.
const MaxBytes = 1 << 55

// MaxSize bounds one size of a snapshot (2^50 bytes, 1 PiB): more memory than any device, or any machine,
// has.
const MaxSize = 1 << 50

// ErrSizes means a snapshot names sizes no device holds: a size below zero or above MaxSize, or sizes that
// add up past MaxBytes. Readers and importers refuse such a file at the event that passes the bound.
var ErrSizes = errors.New("sizes past what any device holds")

// Sizes adds up the sizes of a snapshot as it is read, and fails at the first event or segment that takes
// them past Max. The zero Sizes is ready to use, with Max MaxBytes.
type Sizes struct {
	Max   uint64 // 0: MaxBytes
	total uint64
}

func (s *Sizes) max() uint64 {
	if s.Max == 0 {
		return MaxBytes
	}
	return s.Max
}

// maxOne is the most one size may be.
func (s *Sizes) maxOne() uint64 { return min(s.max(), MaxSize) }

// Add counts the sizes of e, event seq of its snapshot.
func (s *Sizes) Add(seq int, e *Event) error {
	for _, v := range [3]int64{e.Size, e.BlockSize, e.DeviceFree} {
		if v < 0 || uint64(v) > s.maxOne() {
			return fmt.Errorf("%w: event %d (%s) has a size of %d bytes, outside 0 to %s", ErrSizes, seq, e.Action, v, bytesText(s.maxOne()))
		}
	}
	if e.Action.Valid() && e.Action <= ActionOOM { // the allocator's events: the sizes the analysis adds up
		s.total += uint64(e.Size) + uint64(e.BlockSize)
		if s.total > s.max() {
			return fmt.Errorf("%w: at event %d the snapshot's sizes add up to more than %s, "+
				"more than any run allocates: the file is damaged or made to overflow", ErrSizes, seq, bytesText(s.max()))
		}
	}
	return nil
}

// AddFooter counts the sizes of f's segments and their blocks.
func (s *Sizes) AddFooter(f *Footer) error {
	if f == nil {
		return nil
	}
	add := func(what string, v int64) error {
		if v < 0 || uint64(v) > s.maxOne() {
			return fmt.Errorf("%w: the final state has %s of %d bytes, outside 0 to %s", ErrSizes, what, v, bytesText(s.maxOne()))
		}
		if s.total += uint64(v); s.total > s.max() {
			return fmt.Errorf("%w: with the final state's %s the snapshot's sizes add up to more than %s, "+
				"more than any run allocates: the file is damaged or made to overflow", ErrSizes, what, bytesText(s.max()))
		}
		return nil
	}
	for i := range f.Segments {
		seg := &f.Segments[i]
		if err := add("a segment", seg.Size); err != nil {
			return err
		}
		for j := range seg.Blocks {
			if err := add("a block", seg.Blocks[j].Size); err != nil {
				return err
			}
			if err := add("a block's request", seg.Blocks[j].Requested); err != nil {
				return err
			}
		}
	}
	return nil
}

// bytesText says a bound in bytes: "2^50 bytes (1 PiB)" for the defaults, the number of bytes otherwise.
func bytesText(n uint64) string {
	switch n {
	case MaxSize:
		return "2^50 bytes (1 PiB)"
	case MaxBytes:
		return "2^55 bytes (32 PiB)"
	}
	return fmt.Sprintf("%d bytes", n)
}
