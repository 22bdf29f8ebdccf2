package train

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tracer"
)

// lockedBuffer is a bytes.Buffer written by the recording and read by the test at the same time.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// TestRecordFlushesWhileStalled records an event and then stalls, as a workload stuck in a long op does: with
// FlushEvery the event reaches the output within the interval, although no phase ends and no later event
// ages the chunk.
func TestRecordFlushesWhileStalled(t *testing.T) {
	cfg := DefaultMLP()
	cfg.Steps = 1
	var out lockedBuffer
	var waited time.Duration
	_, err := Record(context.Background(), cfg, &out, RecordOptions{FlushEvery: 50 * time.Millisecond, OnStart: func(rec *tracer.Recorder) func() {
		rec.Sample(0, "probe", 42)
		start := time.Now()
		for waited = 0; waited < 10*time.Second; waited = time.Since(start) {
			if s, _ := snapshot.Read(bytes.NewReader(out.bytes())); s != nil && s.Events.Len() == 1 {
				return func() {}
			}
			time.Sleep(5 * time.Millisecond)
		}
		return func() {}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if waited >= 10*time.Second {
		t.Fatalf("the sample recorded before the stall never reached the output while it lasted")
	}
	t.Logf("the stalled event reached the output after %v", waited)
}
