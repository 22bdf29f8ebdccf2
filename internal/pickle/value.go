package pickle

import (
	"iter"
	"math"
	"math/big"
	"slices"
)

// List is a Python list. It is a pointer type so that a list shared through the memo is visibly the same value
// wherever it appears.
type List struct {
	items     []any
	id        uint32
	onlyDicts bool
}

// Len returns the number of elements.
func (l *List) Len() int { return len(l.items) }

// At returns element i; it panics if i is out of range, as indexing a slice does.
func (l *List) At(i int) any { return l.items[i] }

// DictAt returns element i if it is a dict; it panics if i is out of range.
func (l *List) DictAt(i int) (*Dict, bool) {
	m, ok := l.items[i].(*Dict)
	return m, ok
}

// OnlyDicts reports whether every element is a dict (true for an empty list).
func (l *List) OnlyDicts() bool { return l.onlyDicts }

// Dicts iterates over the elements that are dicts, with their indices.
func (l *List) Dicts() iter.Seq2[int, *Dict] {
	return func(yield func(int, *Dict) bool) {
		for i := range l.Len() {
			if m, ok := l.DictAt(i); ok && !yield(i, m) {
				return
			}
		}
	}
}

// All iterates over the indices and elements.
func (l *List) All() iter.Seq2[int, any] {
	return func(yield func(int, any) bool) {
		for i, v := range l.items {
			if !yield(i, v) {
				return
			}
		}
	}
}

// Items returns the elements as a new []any; At, All and Dicts do not copy.
func (l *List) Items() []any { return slices.Clone(l.items) }

// ID is the list's Doc.ID: containers are numbered densely from 0 in the order they were created, so a
// consumer interning shared lists can index a slice instead of hashing pointers.
func (l *List) ID() int { return int(l.id) }

// Tuple is a Python tuple. Tuples are immutable, so a plain slice serves; the memo still returns the same
// backing array for every reference.
type Tuple []any

// ByteArray is a Python bytearray. It differs from bytes ([]byte) only in being mutable in Python, which makes
// it unusable as a dict key.
type ByteArray []byte

// Set is a Python set or frozenset. Elements keep the order they were pickled in.
type Set struct {
	Frozen bool // a frozenset

	d Dict // elements as keys, values unused: reuses the dict's hashing and Python equality
}

// Len returns the number of elements.
func (s *Set) Len() int { return s.d.Len() }

// All iterates over the elements in pickled order.
func (s *Set) All() iter.Seq[any] {
	return func(yield func(any) bool) {
		for _, it := range s.d.items {
			if !yield(it.Key) {
				return
			}
		}
	}
}

// Contains reports whether the set holds v, using Python's equality (1 == 1.0 == True).
func (s *Set) Contains(v any) bool {
	if k, ok := v.(string); ok {
		_, ok := s.d.Get(k)
		return ok
	}
	_, ok := s.d.Lookup(v)
	return ok
}

// AsInt64 returns the integer v holds: an int64 as is, and a *big.Int in [2^63, 2^64) as its int64 two's
// complement. PyTorch pickles some -1 values as the unsigned 2^64-1 (a size_t "unlimited"); this maps them back.
// It reports false for any other type or a *big.Int outside that range; a bool is not an integer here.
func AsInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), true
		}
		if x.Sign() > 0 && x.IsUint64() && x.Uint64() > math.MaxInt64 {
			return int64(x.Uint64()), true
		}
	}
	return 0, false
}
