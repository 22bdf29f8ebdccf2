package torch

// budget counts the bytes an import holds at once against Limits.MaxMemory, before they are allocated: the
// decoded pickle (its Footprint), the records read from it, the tables, and the events. Slices count their
// capacity; maps, which hide theirs, count mapEntryBytes per entry.
type budget struct {
	held, peak, max int64
}

// mapEntryBytes is what one entry of a Go map with small keys and values costs, counted generously.
const mapEntryBytes = 64

// add accounts for n more bytes held, for what (named in the error), failing with ErrMemory past the
// ceiling.
func (b *budget) add(n int64, what string) error {
	if b.max > 0 && n > b.max-b.held {
		return &ImportError{Offset: -1, Err: &MemoryError{What: what, Held: b.held, More: n, Max: b.max}}
	}
	b.held += n
	b.peak = max(b.peak, b.held)
	return nil
}

// left returns the bytes the ceiling leaves, for a Limits.MaxMemory field: 0, no ceiling, when there is none.
func (b *budget) left() int64 {
	if b.max <= 0 {
		return 0
	}
	return max(b.max-b.held, 1)
}

// release accounts for n bytes no longer held.
func (b *budget) release(n int64) { b.held -= n }

// mapMeter charges the entries of a few maps to a budget in steps of mapStep, as their total length passes
// each step: checking per insertion would cost a comparison, a step costs 256 KiB at most.
type mapMeter struct {
	charged int
}

const mapStep = 4096

// grew charges the maps' entries, n in all, beyond what was charged before.
func (m *mapMeter) grew(b *budget, n int, what string) error {
	for n > m.charged {
		if err := b.add(mapStep*mapEntryBytes, what); err != nil {
			return err
		}
		m.charged += mapStep
	}
	return nil
}
