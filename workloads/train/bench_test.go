package train

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tracer"
)

// BenchmarkMetaStepBuildalong measures one training step of the OOM build-along model (d_model 2048, 24
// layers, 32 heads, seq 1024, batch 16: 1.3B parameters) on the meta device with every event recorded into a
// snapshot writer (heap dump included), on a device large enough not to run out. The target is 50 ms per
// step.
func BenchmarkMetaStepBuildalong(b *testing.B) {
	cfg, err := PresetConfig("buildalong")
	if err != nil {
		b.Fatal(err)
	}
	cfg.GPUMemory = 1 << 40
	for _, fixes := range []struct {
		name string
		mod  func(*Config)
	}{
		{"as-is", func(*Config) {}},
		{"bf16+flash+checkpoint", func(c *Config) { c.AMP, c.Attention, c.Checkpoint = AMPBF16, AttentionFlash, CheckpointAll }},
	} {
		b.Run(fixes.name, func(b *testing.B) {
			c := cfg
			fixes.mod(&c)
			w, err := snapshot.NewWriter(io.Discard, Meta(c, "bench"))
			if err != nil {
				b.Fatal(err)
			}
			rec := tracer.New(w)
			r, err := newRun(context.Background(), c, rec)
			if err != nil {
				b.Fatal(err)
			}
			if err := r.rt.Catch(r.setup); err != nil {
				b.Fatal(err)
			}
			before := w.Events()
			b.ResetTimer()
			for i := range b.N {
				if err := r.rt.Catch(func() { r.iterate(i, false) }); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(w.Events()-before)/float64(b.N), "events/step")
			b.ReportMetric(b.Elapsed().Seconds()*1000/float64(b.N), "ms/step")
		})
	}
}

// BenchmarkRecordGPT records ten steps of GPT runs on the meta device into memory and reports the snapshot's
// size per event (the format's figure on the real workload; target 8 bytes/event) and the recording rate.
func BenchmarkRecordGPT(b *testing.B) {
	for _, preset := range []string{"gpt2-small", "gpt2-medium"} {
		b.Run(preset, func(b *testing.B) {
			cfg, _ := PresetConfig(preset)
			cfg.Steps, cfg.GPUMemory = 10, 1<<40
			var size, events int
			for range b.N {
				var buf bytes.Buffer
				if _, err := Record(context.Background(), cfg, &buf, RecordOptions{}); err != nil {
					b.Fatal(err)
				}
				size = buf.Len()
				s, err := snapshot.Read(&buf)
				if err != nil {
					b.Fatal(err)
				}
				events = len(s.Events)
			}
			b.ReportMetric(float64(size)/float64(events), "bytes/event")
			b.ReportMetric(float64(events)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
