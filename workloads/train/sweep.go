package train

import (
	"context"
	"fmt"
	"reflect"
	"slices"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tracer"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist"
)

// A Fix is a named change to a configuration: one of the memory fixes or a combination of them.
type Fix struct {
	Name  string
	Apply func(c *Config)
}

// Fixes are the combinations a sweep tries, from none to all, as a user would try them.
var Fixes = []Fix{
	{"as configured", func(*Config) {}},
	{"flash attention", func(c *Config) { c.Attention = knob.AttentionFlash }},
	{"bf16 autocast", func(c *Config) { c.AMP = knob.AMPBF16 }},
	{"bf16 + flash", func(c *Config) { c.AMP, c.Attention = knob.AMPBF16, knob.AttentionFlash }},
	{"checkpoint every block", func(c *Config) { c.Checkpoint = knob.CheckpointAll }},
	{"bf16 + flash + checkpoint attention", func(c *Config) {
		c.AMP, c.Attention, c.Checkpoint = knob.AMPBF16, knob.AttentionFlash, knob.CheckpointAttention
	}},
	{"bf16 + flash + checkpoint every 2nd block", func(c *Config) {
		c.AMP, c.Attention, c.Checkpoint = knob.AMPBF16, knob.AttentionFlash, knob.CheckpointEvery(2)
	}},
	{"bf16 + flash + checkpoint every block", func(c *Config) {
		c.AMP, c.Attention, c.Checkpoint = knob.AMPBF16, knob.AttentionFlash, knob.CheckpointAll
	}},
	{"fp16 + flash + checkpoint every block", func(c *Config) {
		c.AMP, c.Attention, c.Checkpoint = knob.AMPFP16, knob.AttentionFlash, knob.CheckpointAll
	}},
	{"batch / 4, accumulate 4", quarterBatch},
	{"bf16 + flash + batch / 4, accumulate 4", func(c *Config) { c.AMP, c.Attention = knob.AMPBF16, knob.AttentionFlash; quarterBatch(c) }},
	{"bf16 + flash + checkpoint every block + SGD", func(c *Config) {
		c.AMP, c.Attention, c.Checkpoint, c.Optimizer = knob.AMPBF16, knob.AttentionFlash, knob.CheckpointAll, knob.SGD
	}},
}

// LlamaFixes are the choices people make to fine-tune a Llama-family model on one card, each named by the
// run it makes: a full fine-tune in 16-bit weights or in float32 weights with bf16 autocast, LoRA (rank 16
// on every projection) and QLoRA, each with and without checkpointing, and the 8-bit and paged optimizers.
// LoRA and QLoRA run under bf16 autocast, as Trainer(bf16=True) runs them (the QLoRA recipe).
var LlamaFixes = []Fix{
	{"as configured", func(*Config) {}},
	{"full, bf16 weights", fullBF16},
	{"full, bf16 weights, checkpoint", func(c *Config) { fullBF16(c); c.Checkpoint = knob.CheckpointAll }},
	{"full, bf16 weights, checkpoint, 8-bit AdamW", func(c *Config) { fullBF16(c); c.Checkpoint, c.Optimizer = knob.CheckpointAll, knob.AdamW8bit }},
	{"full, bf16 weights, checkpoint, paged 8-bit AdamW", func(c *Config) { fullBF16(c); c.Checkpoint, c.Optimizer = knob.CheckpointAll, knob.PagedAdamW8bit }},
	{"full, fp32 weights, bf16 autocast", fullMixed},
	{"full, fp32 weights, bf16 autocast, checkpoint", func(c *Config) { fullMixed(c); c.Checkpoint = knob.CheckpointAll }},
	{"LoRA, bf16 base", func(c *Config) { lora(c, WeightsBF16) }},
	{"LoRA, bf16 base, checkpoint", func(c *Config) { lora(c, WeightsBF16); c.Checkpoint = knob.CheckpointAll }},
	{"LoRA, fp32 base, checkpoint", func(c *Config) { lora(c, WeightsF32); c.Checkpoint = knob.CheckpointAll }},
	{"QLoRA", func(c *Config) { lora(c, WeightsBF16); c.QLoRA = true }},
	{"QLoRA, checkpoint", func(c *Config) { lora(c, WeightsBF16); c.QLoRA, c.Checkpoint = true, knob.CheckpointAll }},
	{"QLoRA, checkpoint, paged 8-bit AdamW", func(c *Config) {
		lora(c, WeightsBF16)
		c.QLoRA, c.Checkpoint, c.Optimizer = true, knob.CheckpointAll, knob.PagedAdamW8bit
	}},
}

func fullBF16(c *Config) {
	c.LoRA, c.QLoRA, c.LoRATargets, c.Weights, c.AMP = 0, false, 0, WeightsBF16, knob.AMPOff
}
func fullMixed(c *Config) {
	c.LoRA, c.QLoRA, c.LoRATargets, c.Weights, c.AMP = 0, false, 0, WeightsF32, knob.AMPBF16
}

func lora(c *Config, weights Weights) {
	c.LoRA, c.LoRATargets, c.QLoRA, c.Weights, c.AMP = 16, c.EveryProjection(), false, weights, knob.AMPBF16
	if c.LoRAAlpha == 0 {
		c.LoRAAlpha = 32
	}
}

// DistFixes are the strategies a sweep of a data-parallel job tries, each with mixed-precision AdamW as the
// ZeRO paper counts it (bf16; DDP and FSDP keep fp32 weights, ZeRO's model is bf16 with fp32 master
// weights), and with its offloads. The job's GPUs, nodes and the rest of its configuration are kept.
var DistFixes = []Fix{
	{"ddp", parallel(dist.DDP, dist.OffloadNone)},
	{"ddp, gradient_as_bucket_view", func(c *Config) {
		parallel(dist.DDP, dist.OffloadNone)(c)
		c.Parallel.GradientAsBucketView = true
	}},
	{"zero1", parallel(dist.ZeRO1, dist.OffloadNone)},
	{"zero2", parallel(dist.ZeRO2, dist.OffloadNone)},
	{"zero3", parallel(dist.ZeRO3, dist.OffloadNone)},
	{"fsdp full shard", parallel(dist.FSDPFull, dist.OffloadNone)},
	{"fsdp shard grad op", parallel(dist.FSDPGradOp, dist.OffloadNone)},
	{"hsdp", parallel(dist.HSDP, dist.OffloadNone)},
	{"fsdp2", parallel(dist.FSDP2, dist.OffloadNone)},
	{"zero2, offload optimizer", parallel(dist.ZeRO2, dist.OffloadOptimizer)},
	{"zero3, offload optimizer", parallel(dist.ZeRO3, dist.OffloadOptimizer)},
	{"zero3, offload optimizer+params", parallel(dist.ZeRO3, dist.OffloadOptimizerParams)},
	{"fsdp full shard, offload params", parallel(dist.FSDPFull, dist.OffloadOptimizerParams)},
}

// parallel returns the fix that runs a job with strategy s and offload o in mixed precision.
func parallel(s dist.Strategy, o dist.Offload) func(*Config) {
	return func(c *Config) {
		p := c.Parallel
		c.Parallel = dist.Settings{GPUs: p.GPUs, Nodes: p.Nodes, Rank: p.Rank, Strategy: s, Offload: o, Wrap: p.Wrap}
		c.AMP, c.LoRA, c.QLoRA, c.LoRATargets, c.LoRAAlpha, c.LoRADropout = knob.AMPBF16, 0, false, 0, 0, 0
		if c.HF() {
			c.Weights = WeightsF32 // fp32 weights under autocast; ZeRO casts the model to bf16 itself
		}
		if c.Optimizer != knob.Adam {
			c.Optimizer, c.OptimizerImpl = knob.AdamW, ""
		}
	}
}

// FixesFor returns the fixes a sweep of cfg tries: DistFixes for a job of several GPUs, LlamaFixes for a
// Hugging Face model (llama, bert), Fixes otherwise.
func FixesFor(cfg Config) []Fix {
	switch {
	case cfg.Parallel.World() > 1:
		return DistFixes
	case cfg.HF():
		return LlamaFixes
	}
	return Fixes
}

// AdviceFixesFor returns the fixes a run's advice is measured with (the report's --measure-fixes, the TUI's
// fixes pane): the run as configured first, so that every saving is measured from the run's own settings and
// strategy; then the model's fixes (FixesFor's for one GPU) under the same strategy; and, for a rank of a
// data-parallel job, each other strategy and offload with the rest of the run as configured. (FixesFor's
// DistFixes compare the strategies with each other, each in mixed precision, as oomdbg fixes tabulates
// them: none of them is the run as configured.)
func AdviceFixesFor(cfg Config) []Fix {
	if cfg.Parallel.World() <= 1 {
		return FixesFor(cfg)
	}
	model := Fixes
	if cfg.Model == "llama" {
		model = LlamaFixes
	}
	out := slices.Clone(model)
	for _, f := range DistFixes {
		probe := Config{Parallel: cfg.Parallel}
		f.Apply(&probe)
		p := probe.Parallel
		out = append(out, Fix{f.Name, func(c *Config) {
			c.Parallel.Strategy, c.Parallel.Offload, c.Parallel.GradientAsBucketView = p.Strategy, p.Offload, p.GradientAsBucketView
		}})
	}
	return out
}

func quarterBatch(c *Config) {
	if c.Batch >= 4 {
		c.Batch, c.Accum = c.Batch/4, c.Accum*4
	}
}

// SweepRow is what one fix does: the peak on the configured device, or where it ran out, and the peak it
// needs when given all the memory it wants.
type SweepRow struct {
	Fix             string
	Config          Config
	PeakAllocated   int64 // on the configured device (up to the OOM when it ran out)
	PeakReserved    int64
	OOM             *OOM
	NeedsAllocated  int64 // with unlimited memory: what the run needs
	NeedsReserved   int64
	MeasuredOnSteps int
	// Paged is the optimizer state in unified memory (of the run with unlimited memory when the configured
	// one stopped before the optimizer made it), which the peaks above leave out, and PagedEvicted the bytes
	// of it evicted to host over the configured run.
	Paged, PagedEvicted uint64
	// Result is the run on the configured device: its steps, each with what it asked of the device.
	Result *Result
	// Composition is the allocated bytes by category at the peak: the configured run's, or, when it ran out
	// of memory, the peak of the run with unlimited memory.
	Composition [snapshot.NumCategories]int64
	// Host is a data-parallel rank's host memory, and Traffic what it moved in its last step (of the same
	// run as Composition).
	Host    allocator.HostStats
	Traffic dist.Traffic
}

// Fragmentation returns (reserved - allocated) / reserved when reserved memory peaked on the configured device.
func (r *SweepRow) Fragmentation() float64 {
	if r.Result == nil || r.Result.PeakReserved <= 0 {
		return 0
	}
	return float64(r.Result.UnallocatedAtPeak) / float64(r.Result.PeakReserved)
}

// Sweep runs cfg with each fix on the meta device, once on the configured device and once with unlimited
// memory, two steps each (the second step carries the optimizer state). It takes a fraction of a second per
// fix for a GPT-2-medium-sized model.
func Sweep(ctx context.Context, cfg Config, fixes []Fix) ([]SweepRow, error) {
	return sweep(ctx, cfg, fixes, 2)
}

// SweepSettings runs cfg with each fix as Sweep does, but for as many steps as cfg asks: fragmentation builds
// up over steps of different shapes.
func SweepSettings(ctx context.Context, cfg Config, fixes []Fix) ([]SweepRow, error) {
	return sweep(ctx, cfg, fixes, cfg.Steps)
}

func sweep(ctx context.Context, cfg Config, fixes []Fix, steps int) ([]SweepRow, error) {
	base := cfg
	base.Device, base.Steps, base.Bug = device.Meta, steps, ""
	var rows []SweepRow
	var seen []Config
	for _, f := range fixes {
		c := base
		f.Apply(&c)
		if err := c.Validate(); err != nil {
			continue // the fix does not apply to this model (e.g. attention on an MLP)
		}
		if slices.ContainsFunc(seen, func(s Config) bool { return reflect.DeepEqual(s, c) }) {
			continue // the configuration already is the fix (e.g. bf16 weights on a bf16 preset)
		}
		seen = append(seen, c)
		res, comp, err := measure(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		// With unlimited memory: 16 TiB, more than any run here needs and within the address space the
		// simulated device reserves expandable segments in (they reserve 9/8 of the device's memory).
		unlimited := c
		unlimited.GPUMemory = max(c.GPUMemory, 16<<40)
		need, needComp, err := measure(ctx, unlimited)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		row := SweepRow{Fix: f.Name, Config: c, PeakAllocated: res.PeakAllocated, PeakReserved: res.PeakReserved,
			OOM: res.OOM, NeedsAllocated: need.PeakAllocated, NeedsReserved: need.PeakReserved, MeasuredOnSteps: c.Steps,
			Paged: max(res.Paged, need.Paged), PagedEvicted: res.PagedEvicted, Result: res, Composition: comp, Host: res.Host}
		last := res
		if res.OOM != nil {
			row.Composition, row.Host, last = needComp, need.Host, need
		}
		if n := len(last.Traffic); n > 0 {
			row.Traffic = last.Traffic[n-1]
		}
		rows = append(rows, row)
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
	}
	return rows, nil
}

// SettingsFixes are what a run that fragments can change without touching the model: the caching allocator's
// settings (PYTORCH_CUDA_ALLOC_CONF) and emptying the cache, each named as users write it. DataFixes change
// the shapes of a variable-length run's batches instead.
var SettingsFixes = []Fix{
	{"as configured", func(*Config) {}},
	{"expandable_segments:True", allocSetting(func(a *allocator.Config, _ *Config) { a.ExpandableSegments = true })},
	{"max_split_size_mb:128", allocSetting(func(a *allocator.Config, _ *Config) { a.MaxSplitSize = 128 << 20 })},
	{"max_split_size_mb:512", allocSetting(func(a *allocator.Config, _ *Config) { a.MaxSplitSize = 512 << 20 })},
	{"garbage_collection_threshold:0.6", allocSetting(func(a *allocator.Config, c *Config) {
		// Garbage collection acts only under a memory fraction (PyTorch's set_fraction); the one set here
		// limits the allocator to what the card has for it anyway.
		a.GarbageCollectionThreshold = 0.6
		if a.PerProcessMemoryFraction == 0 {
			a.PerProcessMemoryFraction = float64(c.GPUMemory-c.ContextReserve) / float64(c.GPUMemory)
		}
	})},
	{"empty_cache every step", func(c *Config) { c.EmptyCache = EmptyCacheStep }},
}

// DataFixes change the shapes a variable-length run's batches take: fewer distinct lengths, or batches of
// similar lengths.
var DataFixes = []Fix{
	{"padding multiple:64", func(c *Config) { c.Padding = PadToMultiple(64) }},
	{"sort-by-length", func(c *Config) { c.SortByLength = true }},
}

// SettingsFixesFor returns the fixes a settings sweep of cfg tries: SettingsFixes, and DataFixes when its
// lengths vary.
func SettingsFixesFor(cfg Config) []Fix {
	if cfg.SeqDist.Fixed() {
		return SettingsFixes
	}
	return append(slices.Clip(SettingsFixes), DataFixes...)
}

// allocSetting changes the allocator's settings of a configuration; one it already has is left as it is, so
// that a sweep takes it for the configuration itself rather than advise it.
func allocSetting(set func(a *allocator.Config, c *Config)) func(*Config) {
	return func(c *Config) {
		a := c.AllocConf.Config
		set(&a, c)
		if c.AllocConf.Config.Includes(a) {
			return
		}
		a.Source = "" // the settings are no longer the string they were parsed from
		c.AllocConf = AllocConf{a}
	}
}

// measure runs cfg with a recorder that keeps no events, only the bytes by category at the peak.
func measure(ctx context.Context, cfg Config) (*Result, [snapshot.NumCategories]int64, error) {
	m := &peakMeter{live: map[uint64]meterBlock{}}
	rec := tracer.New(m, tracer.WithStackDepth(0))
	res, _, err := Run(ctx, cfg, rec)
	rec.Close(nil)
	return res, m.atPeak, err
}

// peakMeter is a tracer.Sink that follows the GPU's allocated bytes by category and keeps them at their
// highest total: what a sweep's peak is made of, without writing a snapshot.
type peakMeter struct {
	live        map[uint64]meterBlock
	cur, atPeak [snapshot.NumCategories]int64
	total, peak int64
}

type meterBlock struct {
	size int64
	cat  snapshot.Category
}

func (m *peakMeter) InternString(string) snapshot.StringID            { return 0 }
func (m *peakMeter) InternFrame(string, string, int) snapshot.FrameID { return 0 }
func (m *peakMeter) InternStack([]snapshot.FrameID) snapshot.StackID  { return 0 }
func (m *peakMeter) Flush() error                                     { return nil }
func (m *peakMeter) Close(*snapshot.Footer) error                     { return nil }

func (m *peakMeter) Write(e *snapshot.Event) error {
	if e.Device != 0 {
		return nil
	}
	switch e.Action {
	case snapshot.ActionAlloc:
		c := e.Category
		if !c.Valid() {
			c = snapshot.CategoryUnknown
		}
		m.live[e.Addr] = meterBlock{e.BlockSize, c}
		m.cur[c] += e.BlockSize
		m.total += e.BlockSize
		if m.total > m.peak {
			m.peak, m.atPeak = m.total, m.cur
		}
	case snapshot.ActionFreeRequested:
		if b, ok := m.live[e.Addr]; ok {
			delete(m.live, e.Addr)
			m.cur[b.cat] -= b.size
			m.total -= b.size
		}
	case snapshot.ActionCategory:
		if b, ok := m.live[e.Addr]; ok && e.Category.Valid() && e.Category != b.cat {
			m.cur[b.cat] -= b.size
			m.cur[e.Category] += b.size
			m.live[e.Addr] = meterBlock{b.size, e.Category}
		}
	}
	return nil
}
