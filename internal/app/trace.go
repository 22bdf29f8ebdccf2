package app

import (
	"errors"
	"fmt"

	"github.com/oomdbg/oomdbg/allocator/replay"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/whatif/transform"
)

// traceError says why a replay or a what-if found the trace of the snapshot at path short of what it needs,
// where the blame lies: a file cut short is missing the rest of its recording; only a PyTorch snapshot is
// told how PyTorch records a trace. Other errors come back as they are, named after path.
func traceError(path string, s *snapshot.Snapshot, err error) error {
	var tags *transform.MissingTagsError
	noTrace := errors.Is(err, replay.ErrNoTrace)
	switch {
	case s.Warning != nil && noTrace:
		return fmt.Errorf("%s: %v, before any allocation: there is no trace to replay", path, s.Warning)
	case s.Warning != nil && errors.As(err, &tags):
		return fmt.Errorf("%s: %v, before the trace held the %s tags %s needs", path, s.Warning, tags.Tags, tags.Transform)
	case noTrace && s.Meta.Source == "pytorch":
		return fmt.Errorf("%s: %w; record one with torch.cuda.memory._record_memory_history()", path, replay.ErrNoTrace)
	case noTrace:
		return fmt.Errorf("%s: %w", path, replay.ErrNoTrace)
	case errors.As(err, &tags) && s.Meta.Source != "pytorch":
		return fmt.Errorf("%s: %s needs the trace's %s tags, which it lacks", path, tags.Transform, tags.Tags)
	}
	return fmt.Errorf("%s: %w", path, err)
}
