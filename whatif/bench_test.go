package whatif_test

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/oomdbg/oomdbg/internal/cputime"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/whatif"
	"github.com/oomdbg/oomdbg/whatif/transform"
	"github.com/oomdbg/oomdbg/workloads/train"
)

var (
	whatIfTraceOnce sync.Once
	whatIfTrace     *snapshot.Snapshot
)

// millionEventTrace records a GPT long enough for about a million events, once.
func millionEventTrace(b *testing.B) *snapshot.Snapshot {
	whatIfTraceOnce.Do(func() {
		cfg := whatIfShapes()["gpt L6 d384 T128 B16"]
		for cfg.Steps = 1; ; cfg.Steps = cfg.Steps*1_000_000/whatIfTrace.Events.Len() + 1 {
			var buf bytes.Buffer
			if _, err := train.Record(context.Background(), cfg, &buf, train.RecordOptions{}); err != nil {
				b.Fatal(err)
			}
			var err error
			if whatIfTrace, err = snapshot.Read(&buf); err != nil {
				b.Fatal(err)
			}
			if whatIfTrace.Events.Len() >= 1_000_000 {
				break
			}
		}
	})
	return whatIfTrace
}

// BenchmarkWhatIf is a what-if on a recording of about a million events: the replay before, the
// transformation and the replay after (target: 1 s). cpu-s/op is the CPU time it takes, which contention on a
// shared machine does not inflate as it does the wall time.
func BenchmarkWhatIf(b *testing.B) {
	s := millionEventTrace(b)
	for _, c := range []struct {
		name string
		t    transform.Transform
	}{
		{"batch/2", transform.BatchScale(0.5)},
		{"checkpoint-all", transform.Checkpoint(knob.CheckpointAll)},
		{"sgd", transform.SwitchOptimizer(knob.SGD)},
	} {
		b.Run(c.name, func(b *testing.B) {
			cpu := cputime.Process()
			for b.Loop() {
				if _, err := whatif.Evaluate(s, whatif.Fix{Transforms: []transform.Transform{c.t}}, 0); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((cputime.Process()-cpu).Seconds()/float64(b.N), "cpu-s/op")
			b.ReportMetric(float64(s.Events.Len()), "events")
		})
	}
}
