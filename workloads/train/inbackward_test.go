package train

import (
	"context"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/dist"
)

// TestOptimizerInBackwardHoldsNoGradients runs a full fine-tune of a small Llama with and without the step
// in backward: at the end of the second step's backward the usual loop holds every parameter's gradient (the
// optimizer has its state from the first step in both), the step in backward none. The difference is the
// gradients' bytes, each a float32 tensor of its parameter's shape rounded up to the caching allocator's
// 512-byte blocks, counted here from the model's shape.
func TestOptimizerInBackwardHoldsNoGradients(t *testing.T) {
	base := smallLlama(t)
	base.Steps = 2
	backwardEnd := func(c Config) int64 {
		t.Helper()
		res, _, err := Run(context.Background(), c, nil)
		if err != nil || res.OOM != nil {
			t.Fatalf("%v %v", err, res.OOM)
		}
		for _, p := range res.Phases {
			if p.Iteration == 1 && p.Phase == snapshot.PhaseBackward {
				return p.End
			}
		}
		t.Fatal("no backward in the second step")
		return 0
	}
	in := base
	in.OptimizerInBackward = true
	d, hd, kv, ffn, v := 64, 16, 2, 128, len(tinyVocab)
	layer := []int{d * d, d * kv * hd, d * kv * hd, d * d, d * ffn, d * ffn, ffn * d, d, d}
	sizes := []int{v * d, d, v * d} // embeddings, final norm, lm_head
	for range 2 {
		sizes = append(sizes, layer...)
	}
	var grads int64
	for _, n := range sizes {
		grads += int64((n*4 + 511) / 512 * 512)
	}
	if got := backwardEnd(base) - backwardEnd(in); got != grads {
		t.Errorf("the step in backward holds %d bytes less after backward; the gradients are %d", got, grads)
	}
}

// TestOptimizerInBackwardRefuses checks what cannot be combined with the step in backward is refused in one
// line that says why.
func TestOptimizerInBackwardRefuses(t *testing.T) {
	tests := map[string]struct {
		change func(*Config)
		want   string
	}{
		"accumulation": {func(c *Config) { c.Accum = 2 }, "cannot accumulate gradients over --accum 2"},
		"fp16":         {func(c *Config) { c.AMP = knob.AMPFP16 }, "grad scaler unscales and checks every gradient"},
		"ddp":          {func(c *Config) { c.Parallel.GPUs, c.Parallel.Strategy = 2, dist.DDP }, "data parallelism is not modelled"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := smallLlama(t)
			c.OptimizerInBackward = true
			tc.change(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}
