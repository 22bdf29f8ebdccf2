package whatif_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"testing"
	"time"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/whatif"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// memoryFixes are the fixes whose memory TestEventCostBoundsTheLiveHeap measures: one transformation of each
// kind, and the combinations that hold the most (accumulation's repeats at both ends of checkpointing, copied
// again by zero_grad).
func memoryFixes() map[string]whatif.Request {
	k, all, zero := 8, knob.CheckpointAll, knob.ZeroGradZero
	half := 0.5
	return map[string]whatif.Request{
		"batch x0.5":     {BatchScale: &half},
		"checkpoint all": {Checkpoint: &all},
		"accumulate 8":   {Accum: &k},
		"accumulate 8, checkpoint all, zero_grad": {Accum: &k, Checkpoint: &all, ZeroGrad: &zero},
	}
}

// TestEventCostBoundsTheLiveHeap holds Fix.EventCost, what oomdbg whatif refuses a trace by before reading
// it, against what a what-if really holds: in a child process of its own, with the collector running often,
// the highest live heap (runtime/metrics) while the recorded GPT trace is read and evaluated, less what the
// process held before. A cost under it would let a what-if admitted under --max-memory go past it.
func TestEventCostBoundsTheLiveHeap(t *testing.T) {
	if name := os.Getenv("OOMDBG_WHATIF_MEMORY"); name != "" {
		measureWhatIfMemory(name)
		return
	}
	if testing.Short() {
		t.Skip("records a GPT and evaluates four what-ifs in child processes")
	}
	for name, req := range memoryFixes() {
		fix, err := req.Fix()
		if err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestEventCostBoundsTheLiveHeap$")
			cmd.Env = append(os.Environ(), "OOMDBG_WHATIF_MEMORY="+name)
			out, err := cmd.CombinedOutput()
			m := regexp.MustCompile(`events (\d+) peak (\d+)`).FindSubmatch(out)
			if err != nil || m == nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			events, _ := strconv.ParseInt(string(m[1]), 10, 64)
			peak, _ := strconv.ParseInt(string(m[2]), 10, 64)
			cost := fix.EventCost()
			t.Logf("%d events: %d bytes an event at the peak, EventCost %d", events, peak/events, cost)
			if peak > cost*events {
				t.Errorf("the live heap reached %d bytes, %d an event: more than EventCost's %d", peak, peak/events, cost)
			}
		})
	}
}

// measureWhatIfMemory is the child: it records the trace, encodes it, and prints the events and the highest
// live heap above what it held before reading them, while the what-if runs.
func measureWhatIfMemory(name string) {
	cfg := whatIfShapes()["gpt L6 d384 T128 B16"]
	cfg.Steps = 12
	var buf bytes.Buffer
	if _, err := train.Record(context.Background(), cfg, &buf, train.RecordOptions{}); err != nil {
		panic(err)
	}
	fix, err := memoryFixes()[name].Fix()
	if err != nil {
		panic(err)
	}
	debug.SetGCPercent(5) // the live heap is read at each collection: collect often
	runtime.GC()
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	base := live[0].Value.Uint64()
	peak := uint64(0)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			metrics.Read(live)
			peak = max(peak, live[0].Value.Uint64())
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	s, err := snapshot.Read(bytes.NewReader(buf.Bytes()))
	if err != nil {
		panic(err)
	}
	buf = bytes.Buffer{}
	if _, err := whatif.Evaluate(s, fix, 0); err != nil {
		panic(err)
	}
	runtime.GC()
	close(stop)
	<-done
	fmt.Printf("events %d peak %d\n", s.Events.Len(), peak-min(peak, base))
	os.Exit(0)
}
