package replay

import (
	"fmt"
	"testing"

	"github.com/oomdbg/oomdbg/internal/cputime"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// BenchmarkReplayManySegments replays snapshots whose final state holds many segments from before the trace
// (snapshottest.ManySegments): every one is rebuilt before the trace is replayed, and the final state is
// compared segment by segment. Target: 200k segments in at most 2 s, and time that grows with the segments,
// not with their square. cpu-s/op is the CPU time an op takes, which a shared machine does not inflate as it
// does the wall time; the replay runs on one goroutine, so on an idle machine it is the wall time.
func BenchmarkReplayManySegments(b *testing.B) {
	for _, n := range []int{25_000, 50_000, 200_000} {
		s, err := torch.Import(snapshottest.ManySegments(n))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("segments=%d", n), func(b *testing.B) {
			cpu := cputime.Process()
			for b.Loop() {
				if _, err := Run("many.pickle", s, nil, 0); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((cputime.Process()-cpu).Seconds()/float64(b.N), "cpu-s/op")
		})
	}
}
