package train

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tracer"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist"
)

// RecordOptions tune Record.
type RecordOptions struct {
	ToolVersion string          // written into the snapshot's metadata
	Tracer      []tracer.Option // e.g. a fixed clock for reproducible files
	Writer      []snapshot.WriterOption
	// OnStart, when set, is called with the recorder before the run starts (e.g. to feed it device
	// readings); the function it returns is called when the run has ended, before the snapshot is closed.
	OnStart func(rec *tracer.Recorder) (stop func())
	// FlushEvery, when positive, writes what was recorded to w at least this often in wall time, even while
	// the workload records nothing (a long op, a stuck loop): with w a file, a process killed at any moment
	// loses at most the last FlushEvery of events. The Writer also cuts a chunk at every phase end and when
	// its events span more than its chunk age. Zero leaves chunking to the Writer alone, so that a recording
	// with a fixed clock is a pure function of the run.
	FlushEvery time.Duration
	// Job, when set, is written into the metadata (snapshot.Meta.Job): the ranks of one job share it.
	Job string
	// Progress, when set, is called after each completed step, from the goroutine that runs the workload.
	Progress func(Progress)
}

// Progress is how far a run has got: Done of Of steps, and the last step's loss (0 on the meta device).
type Progress struct {
	Done, Of int
	Loss     float32
}

// DefaultFlushEvery is how often oomdbg run writes its recording out: kill -9 loses at most about this much.
const DefaultFlushEvery = 200 * time.Millisecond

// Record runs cfg and writes its snapshot to w: the header with the configuration, every event, and a
// footer with the summary and the allocator's final state. A run that ends in an OOM or is interrupted still
// leaves a complete snapshot; the error is for a configuration that cannot run or a write that failed.
func Record(ctx context.Context, cfg Config, w io.Writer, opts RecordOptions) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Event times count from Meta.Created, to the microsecond: a snapshot's events have wall-clock times.
	start := time.Now()
	meta := Meta(cfg, opts.ToolVersion)
	meta.Created = start.UTC().Truncate(time.Microsecond)
	meta.Job = opts.Job
	sw, err := snapshot.NewWriter(w, meta, opts.Writer...)
	if err != nil {
		return nil, err
	}
	clock := tracer.WithClock(func() int64 { return int64(time.Since(start)) })
	rec := tracer.New(sw, append([]tracer.Option{clock, tracer.WithSkippedFrames(runtimeFrames...)}, opts.Tracer...)...)
	stopFlush := flushEvery(rec, opts.FlushEvery)
	stop := func() {}
	if opts.OnStart != nil {
		stop = opts.OnStart(rec)
	}
	res, dev, err := runValid(ctx, cfg, rec, 0, opts.Progress)
	stop()
	stopFlush()
	if err != nil {
		rec.Close(nil)
		return nil, err
	}
	if err := rec.Close(FinalSegments(dev)); err != nil {
		return res, fmt.Errorf("writing the snapshot: %w", err)
	}
	return res, nil
}

// flushEvery flushes rec every interval until the returned function is called, which waits for the last
// flush to finish. A write error stops the flushing; the recorder keeps it and Close returns it.
func flushEvery(rec *tracer.Recorder, interval time.Duration) (stop func()) {
	if interval <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if rec.Flush() != nil {
					return
				}
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// runtimeFrames are the workload runtime's own plumbing, left out of stacks like the allocator's: a stack
// names the op (tensor.Linear), the module and the training loop that asked for memory, not how the runtime
// got it.
var runtimeFrames = []string{
	"github.com/oomdbg/oomdbg/workloads/device.",
	"github.com/oomdbg/oomdbg/workloads/tensor.(*Runtime).",
	"github.com/oomdbg/oomdbg/workloads/train.(*memTracker).",
}

// Meta describes a run of cfg for a snapshot header.
func Meta(cfg Config, toolVersion string) snapshot.Meta {
	workload, _ := json.Marshal(cfg)
	host, _ := os.Hostname()
	params, trainable, _ := ModelParameters(cfg) // 0 for a configuration that cannot run, which Record refuses
	name := fmt.Sprintf("simulated GPU (%s)", cfg.Device)
	if p := cfg.Parallel; p.Parallel() {
		name = fmt.Sprintf("simulated GPU (%s), rank %d of %d, %s", cfg.Device, p.Rank, p.World(), p.Strategy)
	}
	devices := []snapshot.DeviceInfo{{
		Index:          0,
		Name:           name,
		Kind:           string(cfg.Device),
		Capacity:       int64(cfg.GPUMemory),
		ContextReserve: int64(cfg.ContextReserve),
	}}
	if cfg.Parallel.Offload != dist.OffloadNone {
		devices = append(devices, snapshot.DeviceInfo{Index: snapshot.HostDeviceIndex, Kind: snapshot.DeviceKindHost,
			Name: "host memory (pinned blocks from the caching host allocator)"})
	}
	return snapshot.Meta{
		Parameters:          int64(params),
		TrainableParameters: int64(trainable),
		Tool:                "oomdbg",
		ToolVersion:         toolVersion,
		Created:             time.Now().UTC().Truncate(time.Second),
		Host:                host,
		Source:              "oomdbg",
		TimeUnit:            "ns",
		Devices:             devices,
		AllocatorSettings:   cfg.AllocConf.Config.String(),
		Workload:            workload,
	}
}

// FinalSegments returns the allocator state of dev as snapshot segments.
func FinalSegments(dev *device.Device) []snapshot.Segment {
	if dev == nil {
		return nil
	}
	segs := dev.Allocator().Segments()
	out := make([]snapshot.Segment, len(segs))
	for i, s := range segs {
		blocks := make([]snapshot.Block, len(s.Blocks))
		for j, b := range s.Blocks {
			blocks[j] = snapshot.Block{Addr: b.Addr, Size: int64(b.Size), Requested: int64(b.Requested), State: b.State}
		}
		out[i] = snapshot.Segment{Device: s.Device, Stream: s.Stream, Addr: s.Addr, Size: int64(s.Size),
			Pool: s.Pool, Expandable: s.Expandable, Blocks: blocks}
	}
	return out
}
