package train

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/oomdbg/oomdbg/internal/cputime"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tracer"
	"github.com/oomdbg/oomdbg/versions"
	"github.com/oomdbg/oomdbg/workloads/dist"
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
	benchmarkMetaStep(b, cfg, []benchFix{
		{"as-is", func(*Config) {}},
		{"bf16+flash+checkpoint", func(c *Config) {
			c.AMP, c.Attention, c.Checkpoint = knob.AMPBF16, knob.AttentionFlash, knob.CheckpointAll
		}},
	})
}

// BenchmarkMetaStepLlama8BQLoRA measures one training step of Llama-3.1-8B under QLoRA (rank 16 on every
// projection, bf16 autocast as Trainer(bf16=True) runs it, batch 4 of 2048 tokens, AdamW) on the meta
// device, recorded as BenchmarkMetaStepBuildalong records: the dequantized weight temporaries of every 4-bit
// matmul, forward and backward, included. The target is 100 ms per step.
func BenchmarkMetaStepLlama8BQLoRA(b *testing.B) {
	cfg, err := PresetConfig("llama-3.1-8b")
	if err != nil {
		b.Fatal(err)
	}
	cfg.LoRA, cfg.LoRATargets, cfg.QLoRA, cfg.AMP = 16, AllLoRATargets, true, knob.AMPBF16
	benchmarkMetaStep(b, cfg, []benchFix{
		{"qlora", func(*Config) {}},
		{"qlora+checkpoint+paged-adamw8bit", func(c *Config) { c.Checkpoint, c.Optimizer = knob.CheckpointAll, knob.PagedAdamW8bit }},
	})
}

type benchFix struct {
	name string
	mod  func(*Config)
}

// benchmarkMetaStep times iterate (one step and its heap dump) after setup, per fix.
func benchmarkMetaStep(b *testing.B, cfg Config, fixes []benchFix) {
	cfg.GPUMemory = 1 << 40
	for _, fixes := range fixes {
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
			before, cpu := w.Events(), cputime.Process()
			b.ResetTimer()
			for i := range b.N {
				if err := r.rt.Catch(func() { r.iterate(i, false) }); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(w.Events()-before)/float64(b.N), "events/step")
			b.ReportMetric(b.Elapsed().Seconds()*1000/float64(b.N), "ms/step")
			// CPU time, what the step costs whatever else the machine runs (the garbage collector's included).
			b.ReportMetric((cputime.Process()-cpu).Seconds()*1000/float64(b.N), "cpu-ms/step")
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
				events = s.Events.Len()
			}
			b.ReportMetric(float64(size)/float64(events), "bytes/event")
			b.ReportMetric(float64(events)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkMetaStepRank measures one training step of a data-parallel rank of Llama-3.1-8B on 8 GPUs (mixed
// precision, checkpointing, batch 4 of 2048 tokens), recorded as BenchmarkMetaStepBuildalong records: what
// each strategy adds to the single GPU's step (DDP's buckets, ZeRO-3's module-by-module gathering and its
// notes, FSDP's units).
func BenchmarkMetaStepRank(b *testing.B) {
	cfg, err := PresetConfig("llama-3.1-8b")
	if err != nil {
		b.Fatal(err)
	}
	cfg.Weights, cfg.AMP, cfg.Checkpoint, cfg.Optimizer = WeightsF32, knob.AMPBF16, knob.CheckpointAll, knob.AdamW
	var fixes []benchFix
	for _, s := range []dist.Strategy{dist.Single, dist.DDP, dist.ZeRO3, dist.FSDPFull} {
		fixes = append(fixes, benchFix{s.String(), func(c *Config) {
			if s != dist.Single {
				c.Parallel = dist.Settings{GPUs: 8, Strategy: s}
			}
		}})
	}
	benchmarkMetaStep(b, cfg, fixes)
}

// BenchmarkMetaStepMoE measures one training step of the mixtures of experts on the meta device, recorded as
// BenchmarkMetaStepBuildalong records: Mixtral-8x7B (QLoRA on peft's default q and v, and on every expert,
// bf16 autocast and checkpointing; and a full fine-tune's step in bf16), and Qwen3-30B-A3B's 128 experts a
// layer under QLoRA on every projection, each of 48 layers looping over its experts forward, in the
// recompute and backward. The target for Mixtral is that of a dense model of its layers, 100 ms per step.
func BenchmarkMetaStepMoE(b *testing.B) {
	mixtral, err := PresetConfig("mixtral-8x7b")
	if err != nil {
		b.Fatal(err)
	}
	qlora := func(targets LoRATargets) func(*Config) {
		return func(c *Config) {
			c.LoRA, c.LoRATargets, c.QLoRA, c.AMP, c.Checkpoint = 16, targets, true, knob.AMPBF16, knob.CheckpointAll
		}
	}
	benchmarkMetaStep(b, mixtral, []benchFix{
		{"mixtral-8x7b/qlora q,v", qlora(DefaultLoRATargets)},
		{"mixtral-8x7b/qlora all", qlora(AllLoRATargets)},
		{"mixtral-8x7b/full bf16", func(c *Config) { c.Checkpoint = knob.CheckpointAll }},
	})
	qwen, err := PresetConfig("qwen3-30b-a3b")
	if err != nil {
		b.Fatal(err)
	}
	benchmarkMetaStep(b, qwen, []benchFix{{"qwen3-30b-a3b/qlora all", qlora(AllLoRATargets)}})
}

// BenchmarkMetaStepLlama8BQLoRALoad measures a whole run of one step of Llama-3.1-8B under QLoRA as
// transformers, peft and bitsandbytes run it: from_pretrained's load phase (each weight in bf16 on the device,
// then quantized), peft's kbit preparation, then one step (rank 16 on every projection, bf16 autocast,
// checkpointing, batch 4 of 2048 tokens, bitsandbytes 0.43.1's kept inputs, transformers 4.47's loss), every
// event recorded. The target is 150 ms.
func BenchmarkMetaStepLlama8BQLoRALoad(b *testing.B) {
	cfg, err := PresetConfig("llama-3.1-8b")
	if err != nil {
		b.Fatal(err)
	}
	cfg.LoRA, cfg.LoRATargets, cfg.QLoRA, cfg.AMP, cfg.Checkpoint = 16, AllLoRATargets, true, knob.AMPBF16, knob.CheckpointAll
	cfg.Load, cfg.Steps, cfg.GPUMemory = LoadHF, 1, 1<<40
	if cfg.Versions, err = versions.Parse("transformers=4.47.0,bitsandbytes=0.43.1"); err != nil {
		b.Fatal(err)
	}
	cpu := cputime.Process()
	var events uint64
	for range b.N {
		w, err := snapshot.NewWriter(io.Discard, Meta(cfg, "bench"))
		if err != nil {
			b.Fatal(err)
		}
		res, _, err := Run(context.Background(), cfg, tracer.New(w))
		if err != nil || res.OOM != nil || res.Steps != 1 {
			b.Fatalf("%v, %+v", err, res)
		}
		events += w.Events()
	}
	b.ReportMetric(float64(events)/float64(b.N), "events/run")
	b.ReportMetric(b.Elapsed().Seconds()*1000/float64(b.N), "ms/run")
	b.ReportMetric((cputime.Process()-cpu).Seconds()*1000/float64(b.N), "cpu-ms/run")
}
