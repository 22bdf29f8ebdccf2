package fit_test

import (
	"math"
	"testing"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestEstimateFLOPs holds the cost model's FLOPs to the published rules of thumb, with the parameter count
// the runtime builds (train.ModelParameters), not the cost model's own: 6 x parameters x tokens for a full
// training step (Kaplan et al. 2020, less the position embeddings, which no matmul uses), plus attention's
// 12 x tokens x seq x d_model per block (forward 4, backward 8) for naive attention; checkpointing every
// block adds one forward of the blocks.
func TestEstimateFLOPs(t *testing.T) {
	cfg := preset(t, "gpt2-small", 24, func(c *train.Config) { c.Batch = 2 })
	all, _, err := train.ModelParameters(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := float64(all - cfg.Seq*cfg.DModel) // less wpe
	tokens := float64(cfg.Batch * cfg.Seq)
	attn := 12 * tokens * float64(cfg.Seq*cfg.DModel*cfg.Layers)
	g, _ := fit.LookupGPU("h100")
	got := fit.Estimate(cfg, g).FLOPs
	want := 6*n*tokens + attn
	if math.Abs(got/want-1) > 0.01 {
		t.Errorf("FLOPs %.4g, want 6·N·tokens + attention = %.4g", got, want)
	}
	ck := cfg
	ck.Checkpoint = knob.CheckpointAll
	blocks := 12 * float64(cfg.Layers*cfg.DModel*cfg.DModel) // the blocks' matmul weights
	extra := fit.Estimate(ck, g).FLOPs - got
	if wantExtra := 2*blocks*tokens + attn/3; math.Abs(extra/wantExtra-1) > 0.01 {
		t.Errorf("checkpointing adds %.4g FLOPs, want one forward of the blocks, %.4g", extra, wantExtra)
	}
	// selective:ops keeps every matmul's output: its recompute runs no matrix product.
	sel := cfg
	sel.Checkpoint = knob.CheckpointOps
	if extra := fit.Estimate(sel, g).FLOPs - got; extra != 0 {
		t.Errorf("selective:ops adds %.4g FLOPs; its policy recomputes no matmul", extra)
	}
	if fit.Estimate(sel, g).Attention <= fit.Estimate(cfg, g).Attention {
		t.Error("selective:ops with naive attention reads the kept scores again for their softmax: its attention time must grow")
	}
	// A LoRA fine-tune's backward skips the frozen weights' gradients: about 4 of the 6.
	l := preset(t, "llama-3.2-1b", 24, loraBF16)
	lall, trainable, err := train.ModelParameters(l)
	if err != nil {
		t.Fatal(err)
	}
	ltok := float64(l.Batch * l.Seq)
	// Tied embeddings: the lm_head's matmul uses the embedding's weights, counted once, as the matmul is.
	lattn := 0.5 * 4 * ltok * float64(l.Seq*l.DModel*l.Layers) * 3.5 // flash: causal half, backward 2.5x
	if wantL, gotL := 4*float64(lall)*ltok+2*float64(trainable)*ltok+lattn, fit.Estimate(l, g).FLOPs; math.Abs(gotL/wantL-1) > 0.02 {
		t.Errorf("LoRA FLOPs %.4g, want 4·N·tokens + 2·trainable·tokens + attention = %.4g", gotL, wantL)
	}
	// Compute time: the FLOPs at the card's peak, bf16 on tensor cores, fp32 without them.
	bf := cfg
	bf.AMP = knob.AMPBF16
	if r := fit.Estimate(cfg, g).Compute / fit.Estimate(bf, g).Compute; math.Abs(r-989/67.0) > 0.01*989/67 {
		t.Errorf("fp32 / bf16 compute time %.2f, want the peaks' ratio %.2f", r, 989/67.0)
	}
}
