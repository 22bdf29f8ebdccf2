package torch

import (
	"strconv"
	"unsafe"
)

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

// inferBytesPerEvent bounds what the inference (Infer) holds for each event of the trace: by event, the alloc
// whose tags it carries (8); by allocation, its lifetime (16), its tag (24), its place and token in the
// search for a period (24, with the prefix function's 4) and the period's sums (24), and an entry in each of
// two maps of open blocks (48). Every event counted as an allocation, as a hostile trace can make them.
const inferBytesPerEvent = 8 + 16 + 24 + 24 + 4 + 24 + 48

// entryPeakBytes is what the import holds at most, all at once, for each trace entry: its record, its event
// and the inference over it.
var entryPeakBytes = int64(unsafe.Sizeof(entry{})) + eventBytes + inferBytesPerEvent

// fits fails, before any of a trace of n entries is read, when what its import would hold at its peak (each
// entry's record, event and inference, beside what is held already), or what its events would cost the
// caller after (Limits.EventBytes), passes Limits.MaxMemory: an input whose memo repeats one entry millions
// of times takes a few bytes each in the pickle and hundreds in memory, and counting them only as they are
// made let a refusal come after a gigabyte.
// The demand counts in the budget's peak, as what the import needs at least, though nothing is held for it
// yet.
func (im *importer) fits(n int) error {
	what := "importing " + strconv.Itoa(n) + " trace entries"
	need := int64(n) * entryPeakBytes
	im.mem.peak = max(im.mem.peak, im.mem.held+need)
	if im.mem.max <= 0 {
		return nil
	}
	if need > im.mem.max-im.mem.held {
		return &ImportError{Offset: -1, Err: &MemoryError{What: what, Held: im.mem.held, More: need, Max: im.mem.max}}
	}
	if after := int64(n) * im.lim.EventBytes; after > im.mem.max {
		return &ImportError{Offset: -1, Err: &MemoryError{What: what + " and analysing their events", More: after, Max: im.mem.max}}
	}
	return nil
}
