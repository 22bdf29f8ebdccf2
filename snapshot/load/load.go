// Package load opens a snapshot file of any format oomdbg reads, telling them apart by their first bytes,
// never by their names: oomdbg's own format (the magic "\x89OOMDBG\n"), and PyTorch memory snapshots (the
// pickle torch.cuda.memory._dump_snapshot writes, memory_snapshot()'s list of segments, or either as JSON).
// The view, report, check, diff and replay commands open their files through File.
package load

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// ErrUnknownFormat means a file is neither an oomdbg snapshot nor a PyTorch memory snapshot. File's error
// reads "PATH is neither an oomdbg snapshot nor a PyTorch memory snapshot (pickle or JSON)".
var ErrUnknownFormat = errors.New("neither an oomdbg snapshot nor a PyTorch memory snapshot (pickle or JSON)")

// Format is a snapshot file format.
type Format int

// The formats File reads.
const (
	FormatUnknown Format = iota
	FormatNative         // oomdbg's own (docs/format.md)
	FormatPyTorch        // a PyTorch memory snapshot, pickle or JSON
)

// String names the format.
func (f Format) String() string {
	switch f {
	case FormatNative:
		return "oomdbg"
	case FormatPyTorch:
		return "pytorch"
	}
	return "unknown"
}

// Sniff tells the format of a file from its first bytes (16 are plenty).
func Sniff(prefix []byte) Format {
	switch {
	case bytes.HasPrefix(prefix, []byte(snapshot.Magic)):
		return FormatNative
	case torch.Sniff(prefix):
		return FormatPyTorch
	}
	return FormatUnknown
}

// File reads the snapshot at path, whatever its format. An oomdbg snapshot cut short returns its readable
// prefix with Snapshot.Warning set, as snapshot.ReadFile does; a damaged one returns what came before the
// damage together with the error. A PyTorch snapshot is imported whole (torch.Import) or not at all. Errors
// name the path; a file of another kind gives ErrUnknownFormat.
func File(path string) (*snapshot.Snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	var prefix [16]byte
	n, err := io.ReadFull(f, prefix[:])
	f.Close()
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch Sniff(prefix[:n]) {
	case FormatNative:
		return snapshot.ReadFile(path)
	case FormatPyTorch:
		return torch.ImportFile(path)
	}
	return nil, fmt.Errorf("%s is %w", path, ErrUnknownFormat)
}
