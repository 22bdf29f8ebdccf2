package pickle

import (
	"errors"
	"fmt"
	"math"
)

// ErrMemory means a decode would hold more memory than Limits.MaxMemory allows. An error that wraps it also
// wraps ErrLimit.
var ErrMemory = errors.New("memory ceiling reached")

// meter counts the bytes a decode holds (its read buffer, the Doc, the stack, the memo) against
// Limits.MaxMemory, before they are allocated. Slices count their capacity; maps, which hide theirs, count
// mapEntryBytes per entry.
type meter struct {
	held int64
	peak int64 // the most held at once, copies included
	max  int64
}

// mapEntryBytes is what one entry of a small-keyed Go map costs, counted generously: 8 to 24 bytes of key
// and value, a control byte, and room for the table's growth.
const mapEntryBytes = 64

func newMeter(max int64) meter {
	if max <= 0 {
		max = math.MaxInt64
	}
	return meter{max: max}
}

// swap accounts for replacing a buffer of old bytes by one of new bytes. Both are alive while the old one is
// copied, so the ceiling must hold them together.
func (m *meter) swap(old, new int64) error {
	if new > m.max-m.held {
		return m.over(new)
	}
	m.peak = max(m.peak, m.held+new)
	m.held += new - old
	return nil
}

// add accounts for n more bytes held.
func (m *meter) add(n int64) error { return m.swap(0, n) }

// release accounts for n bytes no longer held.
func (m *meter) release(n int64) { m.held -= n }

func (m *meter) over(more int64) error { return &MemoryError{Held: m.held, More: more, Max: m.max} }

// MemoryError is the cause of a decode that would pass Limits.MaxMemory: it held Held bytes and needed More.
// It matches ErrMemory and ErrLimit.
type MemoryError struct {
	Held, More, Max int64
}

func (e *MemoryError) Error() string {
	return fmt.Sprintf("%v: %v: decoding needs more than Limits.MaxMemory (%d bytes): %d held, %d more asked for",
		ErrLimit, ErrMemory, e.Max, e.Held, e.More)
}

// Is reports whether target is ErrMemory or ErrLimit.
func (e *MemoryError) Is(target error) bool { return target == ErrMemory || target == ErrLimit }

// growSlice returns s with room for n more elements, doubling its capacity when it runs out, as the meter
// allows. append grows large slices by only a quarter, which allocates five times the final size in all;
// doubling allocates twice, and the stack and the memo are the decoder's largest slices.
func growSlice[T any](m *meter, s []T, n int, size int64) ([]T, error) {
	if len(s)+n <= cap(s) {
		return s, nil
	}
	c := max(2*cap(s), len(s)+n, 16)
	if err := m.swap(int64(cap(s))*size, int64(c)*size); err != nil {
		return s, err
	}
	out := make([]T, len(s), c)
	copy(out, s)
	return out, nil
}
