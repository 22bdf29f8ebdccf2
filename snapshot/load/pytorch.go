package load

import (
	"fmt"
	"io"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// pytorchBytesPerByte is what importing a PyTorch snapshot costs per byte of input while torch.Import decodes
// from memory: the input itself, held whole, and the pickle decoder's Doc, 4 to 7 times the input
// (internal/pickle's Limits).
const pytorchBytesPerByte = 8

// importPyTorch imports a PyTorch snapshot within b.
//
// It is the seam with the pickle decoder. torch.Import decodes from a byte slice, so the input is read
// whole: a regular file that would not fit b is refused from its size before a byte of it is read, and a
// stream is read no further than b allows. A streaming import takes this function's place: it is given the
// buffered input (in.Reader()) and the budget in bytes (b.Memory) to honour while it decodes.
func importPyTorch(in *Input, b Budget) (*snapshot.Snapshot, error) {
	var lim torch.Limits
	if b.Memory > 0 {
		lim.MaxInput = max(b.Memory/pytorchBytesPerByte, 1)
		if in.Size > lim.MaxInput {
			return nil, &MemoryError{Path: in.Path, Need: in.Size * pytorchBytesPerByte, Budget: b}
		}
	}
	r := in.Reader()
	if lim.MaxInput > 0 {
		r = io.LimitReader(r, lim.MaxInput+1) // one byte more tells "at the limit" from "over it"
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", in.Path, err)
	}
	if lim.MaxInput > 0 && int64(len(data)) > lim.MaxInput {
		return nil, &MemoryError{Path: in.Path, Need: int64(len(data)) * pytorchBytesPerByte, Budget: b}
	}
	s, err := torch.Import(data, torch.WithLimits(lim))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", in.Path, err)
	}
	if n := b.MaxEvents(); n > 0 && uint64(len(s.Events)) > n {
		return nil, &MemoryError{Path: in.Path, Events: n, Need: int64(len(s.Events)) * perEvent(b), Budget: b}
	}
	return s, nil
}
