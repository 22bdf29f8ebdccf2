package load

import (
	"errors"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Partial reports whether a read that stopped at err after events events left something to use: the events
// before damage found part-way (a bad chunk, a cut in a pickle). A file refused for the memory it needs
// (ErrMemory) or for a count past a reader's limit (snapshot.ErrLimit) did not, nor did a read without
// events. A file cut short at a chunk boundary is not an error: it loads whole up to there, with
// Snapshot.Warning saying so. This is the one rule by which every command accepts a file read only in part;
// each says in its own words what it did with it.
func Partial(events int, err error) bool {
	return err != nil && events > 0 && !errors.Is(err, ErrMemory) && !errors.Is(err, snapshot.ErrLimit)
}
