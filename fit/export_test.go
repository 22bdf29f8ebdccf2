package fit

import (
	"context"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// Trial simulates cfg as a search does (its accumulation cut to the micro-batches that show its memory), for
// tests that hold it to a full run.
func (o Options) Trial(ctx context.Context, cfg train.Config) (Trial, error) {
	return o.simulate(ctx, cfg)
}
