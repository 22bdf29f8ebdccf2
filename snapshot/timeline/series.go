package timeline

import (
	"iter"
	"slices"
)

// How the series are kept. Allocated bytes change at almost every event, so they are kept for every event,
// with a pyramid for ranges. Reserved bytes change only at segment events, a few dozen in a training run, so
// they are kept as steps: the value from each change on. Active bytes differ from allocated bytes only while
// a free is requested and not completed; they are not kept at all, but counted from the live blocks when
// asked for (Value), and their peak is found while indexing.

// steps is a series kept where it changes: val[i] from event seq[i] on, 0 before seq[0].
type steps struct {
	seq []uint32
	val []int64
	pyr pyramid // over val
}

// set records that the series is v after event seq (seqs in increasing order).
func (s *steps) set(seq int, v int64) {
	n := len(s.val)
	switch {
	case n > 0 && s.val[n-1] == v:
	case n > 0 && int(s.seq[n-1]) == seq:
		s.val[n-1] = v
	case n == 0 && v == 0:
	default:
		s.seq = append(s.seq, uint32(seq))
		s.val = append(s.val, v)
	}
}

// extend brings the pyramid up to date with the values set since the last call, from change from on.
func (s *steps) extend(from int) { s.pyr.extend(s.val, from) }

// index returns the change in effect after event seq, -1 before the first.
func (s *steps) index(seq int) int {
	i, _ := slices.BinarySearch(s.seq, uint32(seq)+1)
	return i - 1
}

func (s *steps) at(seq int) int64 {
	if i := s.index(seq); i >= 0 {
		return s.val[i]
	}
	return 0
}

// extent returns the lowest and highest value over events [from, to), from < to.
func (s *steps) extent(from, to int) Extent {
	v := s.at(from)
	e := Extent{v, v}
	lo, hi := s.index(from)+1, s.index(to-1)+1 // the changes inside (from, to)
	if lo < hi {
		x := s.pyr.extent(s.val, lo, hi)
		e.Min, e.Max = min(e.Min, x.Min), max(e.Max, x.Max)
	}
	return e
}

// firstMax returns the first event of [from, to) after which the series is at its highest over the range,
// and that value.
func (s *steps) firstMax(from, to int) (int, int64) {
	v := s.at(from)
	lo, hi := s.index(from)+1, s.index(to-1)+1
	if lo >= hi {
		return from, v
	}
	i, m := s.pyr.firstMax(s.val, lo, hi)
	if v >= m {
		return from, v
	}
	return int(s.seq[i]), m
}

// changes yields, for events [from, to), the first event and each event after which the value changes.
func (s *steps) changes(from, to int) iter.Seq2[int, int64] {
	return func(yield func(int, int64) bool) {
		if from >= to || !yield(from, s.at(from)) {
			return
		}
		for i := s.index(from) + 1; i < len(s.seq) && int(s.seq[i]) < to; i++ {
			if !yield(int(s.seq[i]), s.val[i]) {
				return
			}
		}
	}
}
