package export

import "github.com/oomdbg/oomdbg/snapshot/timeline"

// TorchJSONSize returns the bytes TorchJSON writes for tl, without writing them. JSON has no references, so
// the document repeats every entry's stack in full, and a snapshot of a few hundred kilobytes as a pickle can
// take gigabytes: its size is worth knowing before it is written. Each distinct stack is encoded once and its
// length counted for every entry after, so the count takes a fraction of the time the writing does.
func TorchJSONSize(tl *timeline.Timeline) (int64, error) {
	var n counter
	z := &jsonSizer{jsonEncoder: newJSONEncoder(&n), n: &n, stacks: map[uint32]int64{}, pending: -1}
	writeTorch(z, tl)
	if err := z.close(); err != nil {
		return 0, err
	}
	return n.n + z.extra, nil
}

// counter is a writer that counts the bytes it is given and keeps none.
type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// jsonSizer is a jsonEncoder that counts, and that writes each stack's frames once: a stack met again adds
// the length it had, without encoding it.
type jsonSizer struct {
	*jsonEncoder
	n       *counter
	stacks  map[uint32]int64 // a stack's encoded length, by StackID
	pending int64            // the stack being encoded for the first time (-1: none)
	depth   int              // the depth of its list
	start   int64            // the bytes before its list began
	extra   int64            // the bytes of the stacks counted, not written
}

// total is the bytes the document has so far.
func (z *jsonSizer) total() int64 {
	return z.n.n + int64(z.w.Buffered()) + int64(len(z.buf)) + z.extra
}

func (z *jsonSizer) shared(kind refKind, id uint32) bool {
	if kind != refStack {
		return false
	}
	if n, ok := z.stacks[id]; ok {
		z.item() // a stack is a dict's value, which the key has separated: this writes nothing
		z.extra += n
		return true
	}
	z.pending, z.depth = int64(id), len(z.stack)+1
	return false
}

func (z *jsonSizer) beginList() {
	if z.pending >= 0 && len(z.stack)+1 == z.depth {
		z.start = z.total() // the key before it wrote its separator
	}
	z.jsonEncoder.beginList()
}

func (z *jsonSizer) endList() {
	z.jsonEncoder.endList()
	if z.pending >= 0 && len(z.stack)+1 == z.depth {
		z.stacks[uint32(z.pending)] = z.total() - z.start
		z.pending = -1
	}
}
