package train

import (
	"context"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/dist/layout"
)

// splitBase is a small Llama in bf16 with flash attention (Megatron's selective recompute: no scores
// stored), one step of one micro-batch on the meta device.
func splitBase(t *testing.T) Config {
	t.Helper()
	c, err := PresetConfig("llama-3.2-1b")
	if err != nil {
		t.Fatal(err)
	}
	c.Device, c.Steps, c.Batch, c.Accum, c.Seq = device.Meta, 1, 2, 1, 512
	c.Weights, c.AMP, c.Attention = WeightsBF16, knob.AMPOff, knob.AttentionFlash
	c.Parallel = dist.Settings{GPUs: 8, Strategy: dist.DDP}
	return c
}

// forwardActivations runs c and returns what its forward left allocated beyond what setup had: the saved
// activations of one micro-batch.
func forwardActivations(t *testing.T, c Config) int64 {
	t.Helper()
	res, _, err := Run(context.Background(), c, nil)
	if err != nil || res.OOM != nil {
		t.Fatalf("%+v: %v %v", c.Split, err, res.OOM)
	}
	var setup, forward int64 = -1, -1
	for _, p := range res.Phases {
		switch {
		case p.Phase == snapshot.PhaseSetup:
			setup = p.End
		case p.Phase == snapshot.PhaseForward && forward < 0:
			forward = p.End
		}
	}
	if setup < 0 || forward < 0 {
		t.Fatalf("no setup or forward phase: %+v", res.Phases)
	}
	return forward - setup
}

// layerActivations is one decoder layer's saved activations under split s: the difference between the
// forwards of four layers and of two, halved (the embeddings, head and loss cancel).
func layerActivations(t *testing.T, s Split) float64 {
	t.Helper()
	c := splitBase(t)
	c.Split = s
	c.Layers = 4
	four := forwardActivations(t, c)
	c.Layers = 2
	two := forwardActivations(t, c)
	return float64(four-two) / 2
}

// TestTensorParallelLayersDivideAsKorthikanti holds the runtime's tensor-parallel rank against Korthikanti et
// al. 2022, Table 2: without sequence parallelism a layer keeps a part replicated on every rank (the norms'
// tensors and the projections' inputs) and divides the rest by t, so its activations are R + S/t for every t;
// with sequence parallelism everything divides, sbh(34 + 5as/h)/t: the whole layer's, over t.
func TestTensorParallelLayersDivideAsKorthikanti(t *testing.T) {
	one := layerActivations(t, Split{})
	two := layerActivations(t, Split{TP: 2})
	// R + S = one, R + S/2 = two.
	s := 2 * (one - two)
	r := one - s
	if r <= 0 || s <= 0 {
		t.Fatalf("replicated %v and sharded %v bytes: both must be positive", r, s)
	}
	for _, tp := range []int{4, 8} {
		if got, want := layerActivations(t, Split{TP: tp}), r+s/float64(tp); got != want {
			t.Errorf("TP %d: %v bytes a layer, R + S/t gives %v", tp, got, want)
		}
	}
	for _, tp := range []int{2, 4, 8} {
		if got, want := layerActivations(t, Split{TP: tp, SP: true}), one/float64(tp); got != want {
			t.Errorf("TP %d with SP: %v bytes a layer, want the whole layer's over t, %v", tp, got, want)
		}
	}
	// Context parallelism: each rank's 1/CP of the tokens, every saved tensor with them.
	if got, want := layerActivations(t, Split{CP: 2}), one/2; got != want {
		t.Errorf("CP 2: %v bytes a layer, want %v", got, want)
	}
}

// TestPipelineStagesHoldTheirSchedulesMicroBatches runs each stage of a 4-stage pipeline of 8 micro-batches
// under 1F1B and under GPipe with as many micro-batches as 1F1B holds in flight on that stage
// (layout.InFlight: min(PP-i, M)): 1F1B holds that many passes at once, so it peaks at least as high, and at
// most the stage's gradients higher (its steady state runs forwards after the first backward made them),
// give or take the activations passed between stages; GPipe with all 8 holds more on every stage, and each middle stage less than the one
// before it.
func TestPipelineStagesHoldTheirSchedulesMicroBatches(t *testing.T) {
	const pp, m = 4, 8
	peak := func(stage int, s layout.Schedule, micro int) (most, weights int64) {
		c := splitBase(t)
		c.Layers, c.Accum = 8, micro
		c.Split = Split{PP: pp, Schedule: s}
		c.Parallel = dist.Settings{GPUs: pp, Strategy: dist.DDP, Rank: stage} // no data parallelism left
		res, _, err := Run(context.Background(), c, nil)
		if err != nil || res.OOM != nil {
			t.Fatalf("stage %d %s: %v %v", stage, s, err, res.OOM)
		}
		for _, p := range res.Phases { // the passes' peak: the first step's optimizer state may peak higher
			switch p.Phase {
			case snapshot.PhaseForward, snapshot.PhaseBackward:
				most = max(most, p.Peak)
			case snapshot.PhaseSetup:
				weights = p.End // the stage's bf16 parameters: its gradients are as large
			}
		}
		return most, weights
	}
	c := splitBase(t)
	received := int64(c.Batch * c.Seq * c.DModel * 2) // one bf16 activation sent between stages
	gpipe, oneF := layout.Schedule{Kind: layout.GPipe}, layout.Schedule{Kind: layout.OneFOneB}
	prev := int64(0)
	for i := range pp {
		inFlight := int(layout.InFlight(layout.Layout{PP: pp, MicroBatches: m, Schedule: oneF}, i))
		got, grads := peak(i, oneF, m)
		want, _ := peak(i, gpipe, inFlight)
		// 1F1B holds those passes at once, and its later forwards run with the first backward's gradients
		// allocated, which GPipe's never do.
		if got < want || got > want+grads+2*received {
			t.Errorf("stage %d: 1F1B of %d micro-batches peaks at %d bytes; GPipe of the %d it holds at %d, and %d more with the gradients", i, m, got, inFlight, want, grads)
		}
		if all, _ := peak(i, gpipe, m); all <= got {
			t.Errorf("stage %d: GPipe of all %d micro-batches peaks at %d bytes, not above 1F1B's %d", i, m, all, got)
		}
		if i > 0 && i < pp-1 && got >= prev {
			t.Errorf("stage %d peaks at %d bytes, not below stage %d's %d: it holds fewer micro-batches", i, got, i-1, prev)
		}
		prev = got
	}
}

// TestSplitRefusals: a split the model or the job cannot take is one line saying what to change.
func TestSplitRefusals(t *testing.T) {
	for _, tc := range []struct {
		s    Split
		edit func(*Config)
		want string
	}{
		{Split{TP: 3}, nil, "does not divide the 8 GPUs"},
		{Split{TP: 16}, func(c *Config) { c.Parallel.GPUs = 16 }, "key-value heads do not both split"},
		{Split{CP: 2}, func(c *Config) { c.Attention = knob.AttentionNaive }, "give --attention flash"},
		{Split{PP: 2, Schedule: layout.Schedule{Kind: layout.Interleaved, Virtual: 1 << 62}}, func(c *Config) { c.Accum = 2 }, "layers do not split"},
		{Split{SP: true}, nil, "give --tp 2 or more"},
		{Split{TP: 2, SP: true}, func(c *Config) { c.SeqDist = UniformSeq(3, 512) }, "sequences of --seq tokens"},
		{Split{PP: 3}, func(c *Config) { c.Parallel.GPUs = 6 }, "layers do not split"},
		{Split{PP: 2, Schedule: layout.Schedule{Kind: layout.Interleaved, Virtual: 2}}, func(c *Config) { c.Accum = 3 }, "multiple of 2"},
		{Split{PP: 2}, func(c *Config) { c.Parallel.Strategy = dist.ZeRO3 }, "ddp or zero1"},
		{Split{TP: 2}, func(c *Config) { c.LoRA = 8 }, "adapters"},
		{Split{PP: 2}, func(c *Config) { c.AMP = knob.AMPFP16 }, "--amp bf16"},
		{Split{TP: 2}, func(c *Config) { c.Model, c.Weights = "gpt", WeightsF32 }, "Llama-architecture"},
	} {
		c := splitBase(t)
		c.Split = tc.s
		if tc.edit != nil {
			tc.edit(&c)
		}
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: %v, want one line with %q", tc.s, err, tc.want)
		}
	}
}

// TestPipelinePeaksWithinTwiceItsStages holds what fit relies on when it simulates a pipeline's first 2 x PP
// micro-batches: under 1F1B and interleaving, the first and last stages reach the same peak allocated with
// 2 x PP micro-batches as with 8 x PP (the steady state repeats one forward and one backward).
func TestPipelinePeaksWithinTwiceItsStages(t *testing.T) {
	const pp = 2
	for _, s := range []layout.Schedule{{Kind: layout.OneFOneB}, {Kind: layout.Interleaved, Virtual: 2}} {
		for _, stage := range []int{0, pp - 1} {
			peak := func(micro int) int64 {
				c := splitBase(t)
				c.Layers, c.Accum, c.Steps = 8, micro, 2
				c.Split = Split{PP: pp, Schedule: s}
				c.Parallel = dist.Settings{GPUs: pp, Strategy: dist.DDP, Rank: stage}
				res, _, err := Run(context.Background(), c, nil)
				if err != nil || res.OOM != nil {
					t.Fatalf("%s stage %d: %v %v", s, stage, err, res.OOM)
				}
				return res.PeakAllocated
			}
			if short, long := peak(2*pp), peak(8*pp); short != long {
				t.Errorf("%s stage %d: %d bytes at peak with %d micro-batches, %d with %d", s, stage, short, 2*pp, long, 8*pp)
			}
		}
	}
}

// TestPipelineReducesOncePerStep: a pipeline stage's data-parallel strategy reduces the gradients once a step,
// after its last backward, as Megatron's pipeline does, whatever the schedule and the micro-batches: a step
// of 8 moves what a step of one moves.
func TestPipelineReducesOncePerStep(t *testing.T) {
	for _, s := range []dist.Strategy{dist.DDP, dist.ZeRO1} {
		for _, sched := range []layout.Schedule{{Kind: layout.OneFOneB}, {Kind: layout.GPipe}} {
			traffic := func(micro int) dist.Traffic {
				c := splitBase(t)
				c.Layers, c.Accum, c.Optimizer = 4, micro, knob.AdamW
				c.Split = Split{PP: 2, Schedule: sched}
				c.Parallel = dist.Settings{GPUs: 4, Strategy: s}
				res, _, err := Run(context.Background(), c, nil)
				if err != nil || res.OOM != nil || len(res.Traffic) == 0 {
					t.Fatalf("%s %s: %v %v", s, sched, err, res.OOM)
				}
				return res.Traffic[0]
			}
			if one, eight := traffic(1), traffic(8); one != eight {
				t.Errorf("%s %s: a step of 8 micro-batches moves %+v, a step of one %+v", s, sched, eight, one)
			}
		}
	}
}
