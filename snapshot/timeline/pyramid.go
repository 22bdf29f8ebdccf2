package timeline

// A pyramid of minima and maxima over a series, so that the lowest and highest value of any range of events
// costs O(log n) reads however long the range: a timeline of any zoom draws in O(width).

// pyramidFan is how many entries of one level an entry of the next summarises.
const pyramidFan = 16

// Extent is the lowest and highest value of a series over a range of events.
type Extent struct {
	Min, Max int64
}

// pyramid holds the levels above a series: levels[0][j] summarises events [j*16, j*16+16), levels[k][j]
// events [j*16^(k+1), (j+1)*16^(k+1)). The last entry of a level may cover fewer.
type pyramid struct {
	levels [][]Extent
}

// extend recomputes the entries that cover raw[from:], after values were appended to raw.
func (p *pyramid) extend(raw []int64, from int) {
	n := len(raw)
	if n == 0 {
		return
	}
	lo := from / pyramidFan // first entry to recompute at this level
	count := (n + pyramidFan - 1) / pyramidFan
	if len(p.levels) == 0 {
		p.levels = append(p.levels, nil)
	}
	lv := p.levels[0]
	if cap(lv) < count { // as much room as raw has, so that the level grows when raw does
		lv = growTo(lv, max(count, (cap(raw)+pyramidFan-1)/pyramidFan))
	}
	lv = lv[:count]
	for j := lo; j < count; j++ {
		seg := raw[j*pyramidFan : min((j+1)*pyramidFan, n)]
		e := Extent{seg[0], seg[0]}
		for _, v := range seg[1:] {
			e.Min = min(e.Min, v)
			e.Max = max(e.Max, v)
		}
		lv[j] = e
	}
	p.levels[0] = lv
	for k := 1; count > 1; k++ {
		below := p.levels[k-1]
		lo /= pyramidFan
		count = (len(below) + pyramidFan - 1) / pyramidFan
		if len(p.levels) == k {
			p.levels = append(p.levels, nil)
		}
		lv := p.levels[k]
		if cap(lv) < count {
			lv = growTo(lv, max(count, (cap(below)+pyramidFan-1)/pyramidFan))
		}
		lv = lv[:count]
		for j := lo; j < count; j++ {
			lv[j] = merge(below[j*pyramidFan : min((j+1)*pyramidFan, len(below))])
		}
		p.levels[k] = lv
	}
}

func merge(es []Extent) Extent {
	e := es[0]
	for _, x := range es[1:] {
		e.Min = min(e.Min, x.Min)
		e.Max = max(e.Max, x.Max)
	}
	return e
}

// extent returns the lowest and highest of raw[lo:hi], hi > lo.
func (p *pyramid) extent(raw []int64, lo, hi int) Extent {
	e := Extent{raw[lo], raw[lo]}
	// Level 0 is raw: the ragged ends, then whole entries one level up, and so on.
	for lo < hi && lo%pyramidFan != 0 {
		e.Min, e.Max = min(e.Min, raw[lo]), max(e.Max, raw[lo])
		lo++
	}
	for hi > lo && hi%pyramidFan != 0 {
		hi--
		e.Min, e.Max = min(e.Min, raw[hi]), max(e.Max, raw[hi])
	}
	lo, hi = lo/pyramidFan, hi/pyramidFan
	for k := 0; lo < hi; k++ {
		lv := p.levels[k]
		if k == len(p.levels)-1 {
			for _, x := range lv[lo:hi] {
				e.Min, e.Max = min(e.Min, x.Min), max(e.Max, x.Max)
			}
			break
		}
		for lo < hi && lo%pyramidFan != 0 {
			e.Min, e.Max = min(e.Min, lv[lo].Min), max(e.Max, lv[lo].Max)
			lo++
		}
		for hi > lo && hi%pyramidFan != 0 {
			hi--
			e.Min, e.Max = min(e.Min, lv[hi].Min), max(e.Max, lv[hi].Max)
		}
		lo, hi = lo/pyramidFan, hi/pyramidFan
	}
	return e
}

// firstMax returns the first index of raw[lo:hi] holding its maximum, and the maximum.
func (p *pyramid) firstMax(raw []int64, lo, hi int) (int, int64) {
	m := p.extent(raw, lo, hi).Max
	// Walk left to right in pieces of growing size; descend into the first piece that holds m.
	i := lo
	for i < hi {
		// The largest aligned piece starting at i that fits in [i, hi).
		k, size := -1, 1
		for k+1 < len(p.levels) && i%(size*pyramidFan) == 0 && i+size*pyramidFan <= hi {
			k, size = k+1, size*pyramidFan
		}
		if p.pieceMax(raw, k, i/size) == m {
			return p.descend(raw, k, i/size, m), m
		}
		i += size
	}
	return lo, m // not reached: m is in the range
}

// pieceMax is the maximum of entry j of level k (k = -1: raw).
func (p *pyramid) pieceMax(raw []int64, k, j int) int64 {
	if k < 0 {
		return raw[j]
	}
	return p.levels[k][j].Max
}

// descend returns the first event under entry j of level k whose value is m.
func (p *pyramid) descend(raw []int64, k, j int, m int64) int {
	for ; k >= 0; k-- {
		j *= pyramidFan
		for p.pieceMax(raw, k-1, j) != m {
			j++
		}
	}
	return j
}

// Range returns the lowest and highest value of series s over events [from, to); the zero Extent for an
// empty range. Allocated and Reserved only.
func (t *Timeline) Range(s Series, from, to int) Extent {
	from, to = max(from, t.base), min(to, t.n)
	if from >= to {
		return Extent{}
	}
	return t.extent(s, from, to)
}

func (t *Timeline) extent(s Series, from, to int) Extent {
	switch s {
	case Allocated:
		return t.allocPyr.extent(t.alloc, from-t.base, to-t.base)
	case Reserved:
		return t.reserved.extent(from, to)
	}
	return Extent{}
}

// Columns splits events [from, to) into len(dst) columns of (nearly) equal numbers of events and returns each
// column's Extent of series s (Allocated or Reserved), in dst. A column narrower than one event repeats the event under it; columns
// past the indexed events are zero. Draw peaks from Max: averaging a column would hide them.
func (t *Timeline) Columns(s Series, from, to int, dst []Extent) []Extent {
	width := len(dst)
	from, to = max(from, t.base), min(to, t.n)
	clear(dst)
	if from >= to || width == 0 || s != Allocated && s != Reserved {
		return dst
	}
	eachColumn(from, to, width, func(c, lo, hi int) { dst[c] = t.extent(s, lo, hi) })
	return dst
}

// eachColumn splits events [from, to) (from < to) into width columns of (nearly) equal numbers of events and
// calls f with each column's events [lo, hi); a column narrower than one event repeats the event under it, and
// columns past to are left out.
func eachColumn(from, to, width int, f func(c, lo, hi int)) {
	n := to - from
	for c := range width {
		lo, hi := from+c*n/width, from+(c+1)*n/width
		if lo >= to {
			return
		}
		f(c, lo, min(max(hi, lo+1), to))
	}
}

func (p *pyramid) bytes() int {
	n := 0
	for _, l := range p.levels {
		n += 16 * cap(l)
	}
	return n
}
