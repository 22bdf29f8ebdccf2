package load

import (
	"errors"
	"fmt"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// pytorchBytesPerByte is the least an import holds at its peak per byte of a large pickle: 3.3 for an 87 MB
// snapshot of 1.5M trace entries, more for smaller ones (4 to 6 for the real snapshots of 0.1 to 2.4 MB).
const pytorchBytesPerByte = 3

// importPyTorch imports a PyTorch snapshot within b. A pickle is decoded as it is read from the buffered
// input, never held whole, and the import counts what it holds against b.Memory before each allocation
// (torch.Limits.MaxMemory), and, once the trace's length is known and before any of it is read, what the
// trace will take at its peak and what its events will cost the command after (b.PerEvent): a snapshot that
// would not fit fails there, before it takes the memory, with a *MemoryError saying what it needs at least:
// what it had reached, or, for a file, what its size says.
func importPyTorch(in *Input, b Budget) (*snapshot.Snapshot, error) {
	lim := torch.Limits{MaxMemory: max(b.Memory, 0)}
	if b.Memory > 0 {
		lim.EventBytes = perEvent(b)
	}
	s, err := torch.ImportReader(in.Reader(), torch.WithLimits(lim))
	var me *torch.MemoryError
	if errors.As(err, &me) {
		return nil, &MemoryError{Path: in.Path, Need: max(me.Held+me.More, in.Size*pytorchBytesPerByte), Budget: b}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", in.Path, err)
	}
	if n := b.MaxEvents(); n > 0 && uint64(s.Events.Len()) > n {
		return nil, &MemoryError{Path: in.Path, Events: n, Need: int64(s.Events.Len()) * perEvent(b), Budget: b}
	}
	return s, nil
}
