package fit

import (
	"math"
	"strings"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// Cost is the estimated time of one optimizer step of one GPU, in seconds, by part. docs/fit.md states the
// model; in short, every part runs at the card's published peak and the parts add up (nothing overlaps):
// an idealised step that ranks plans, not a prediction of a real one.
type Cost struct {
	// Compute is the matmuls of forward, backward and recompute: FLOPs at the precision's peak, or the
	// weights' reads from device memory when those take longer (a roofline per micro-batch).
	Compute float64
	// Attention is naive attention's score matrices written and read through device memory.
	Attention float64
	// Optimizer is the optimizer step and an in-place zero_grad, through device memory.
	Optimizer float64
	// Host is the bytes moved over PCIe: offloaded state, and what a paged optimizer had evicted.
	Host float64
	// Comm is the bytes a rank sends in collectives over the GPU link.
	Comm float64
	// FLOPs is the matmul work of the step: forward, backward and recompute.
	FLOPs float64
}

// Total is the step time.
func (c Cost) Total() float64 { return c.Compute + c.Attention + c.Optimizer + c.Host + c.Comm }

// shape is what the cost model reads of a configuration.
type shape struct {
	layers      int
	blockParams float64 // matmul weights of one block
	headParams  float64 // the output projection (lm_head, or the MLP's last layer)
	attnWidth   float64 // heads x head size (0: no attention)
	seq         float64 // tokens per sample
	heads       float64
	adapter     float64 // LoRA weights of all blocks
}

func shapeOf(c train.Config) shape {
	switch c.Model {
	case "mlp":
		return shape{layers: max(c.Layers-1, 0), blockParams: float64(c.Hidden) * float64(c.Hidden),
			headParams: float64(c.InFeatures)*float64(c.Hidden) + float64(c.Hidden)*float64(c.Classes), seq: 1}
	case "gpt":
		d := float64(c.DModel)
		return shape{layers: c.Layers, blockParams: 12 * d * d, headParams: float64(c.Vocab) * d, attnWidth: d,
			seq: float64(c.Seq), heads: float64(c.Heads)}
	}
	d, hd := float64(c.DModel), float64(c.HeadDim)
	if hd == 0 {
		hd = d / float64(c.Heads)
	}
	kv := float64(c.KVHeads)
	if kv == 0 {
		kv = float64(c.Heads)
	}
	q, ffn := float64(c.Heads)*hd, float64(c.FFN)
	dims := map[string][2]float64{"q": {d, q}, "k": {d, kv * hd}, "v": {d, kv * hd}, "o": {q, d},
		"gate": {d, ffn}, "up": {d, ffn}, "down": {ffn, d}}
	s := shape{layers: c.Layers, headParams: float64(c.Vocab) * d, attnWidth: q, seq: float64(c.Seq), heads: float64(c.Heads)}
	for _, io := range dims {
		s.blockParams += io[0] * io[1]
	}
	if c.LoRA > 0 {
		targets := c.LoRATargets.String()
		if targets == "" {
			targets = "q,v" // peft's default for Llama-family models
		}
		for _, t := range strings.Split(targets, ",") {
			s.adapter += float64(c.LoRA) * (dims[t][0] + dims[t][1]) * float64(c.Layers)
		}
	}
	return s
}

// checkpointed returns the share of blocks checkpointing recomputes whole, and whether it recomputes the
// attention of every block instead. selective:ops recomputes no matrix product (its policy keeps their
// outputs): it adds no FLOPs, only the passes of naive attention's pointwise ops over the scores (Estimate).
func checkpointed(c knob.Checkpoint, layers int) (share float64, attention bool) {
	switch {
	case c.Every() == 1:
		return 1, false
	case layers == 0:
		return 0, c.Attention()
	}
	return float64(c.Blocks(layers)) / float64(layers), c.Attention()
}

// Estimate is the part of cfg's step time that follows from the configuration alone (everything but Host
// and Comm, which Measure adds from a run's traffic): a lower bound of the step's cost.
func Estimate(c train.Config, g GPU) Cost {
	s := shapeOf(c)
	full := c.LoRA == 0
	tokens := float64(c.Batch) * s.seq // per micro-batch

	// Matmul FLOPs per micro-batch: forward 2 per weight per token; backward 2 for the input's gradient and,
	// for trained weights, 2 for the weight's.
	weights := float64(s.layers)*s.blockParams + s.headParams
	fwd := 2 * (weights + s.adapter) * tokens
	bwd := 2 * (weights + s.adapter) * tokens
	if full {
		bwd += 2 * weights * tokens
	} else {
		bwd += 2 * s.adapter * tokens
	}
	// Attention's two matmuls (QK^T and AV): 4 x tokens x seq x width per block forward. Flash attention
	// skips the masked half of a causal mask and recomputes the scores in backward (2.5x forward, as
	// FlashAttention-2's five matmuls to two); naive attention computes the full square.
	attnFwd := 4 * tokens * s.seq * s.attnWidth * float64(s.layers)
	attnBwd := 2 * attnFwd
	if c.Attention == knob.AttentionFlash {
		attnFwd /= 2
		attnBwd = 2.5 * attnFwd
	}
	share, attnOnly := checkpointed(c.Checkpoint, s.layers)
	recompute := share * (2*float64(s.layers)*(s.blockParams)*tokens + attnFwd)
	if attnOnly {
		recompute = attnFwd
	}
	flops := fwd + bwd + attnFwd + attnBwd + recompute

	fp32 := c.AMP == knob.AMPOff && c.Weights == train.WeightsF32 && !c.QLoRA
	peak := g.Tensor
	if fp32 {
		peak = g.FP32
	}
	elem := 2.0 // bytes of a weight, an activation, a gradient
	if c.Weights == train.WeightsF32 && !c.QLoRA {
		elem = 4
	}
	// Weights read per micro-batch: forward, backward and the recomputed forward; QLoRA reads 4-bit weights
	// and writes and reads their bf16 dequantisation each time. Trained weights' gradients are written.
	perRead := elem
	if c.QLoRA {
		perRead = 0.5 + 2 + 2
	}
	trained := weights
	if !full {
		trained = s.adapter
	}
	weightBytes := (2+share)*weights*perRead + trained*elem
	micro := math.Max(flops/(peak*1e12), weightBytes/(g.HBM*1e9))

	// Naive attention writes the B x H x T x T scores and probabilities and reads them back: 4 passes
	// forward, 8 in backward, 4 more when checkpointing recomputes them; in float32 without autocast.
	var attnBytes float64
	if s.attnWidth > 0 && c.Attention == knob.AttentionNaive {
		passes := 12.0
		switch {
		case attnOnly, c.Checkpoint.Ops(): // selective:ops: the scores kept, their scale, mask and softmax run again
			passes += 4
		default:
			passes += 4 * share
		}
		scoreElem := 2.0
		if fp32 {
			scoreElem = 4
		}
		attnBytes = passes * scoreElem * tokens * s.seq * s.heads * float64(s.layers)
	}

	accum := float64(max(c.Accum, 1))
	cost := Cost{Compute: accum * micro, Attention: accum * attnBytes / (g.HBM * 1e9), FLOPs: accum * flops}
	cost.Optimizer = optimizerBytes(c, trained, elem) / (g.HBM * 1e9)
	return cost
}

// optimizerBytes is what the optimizer step reads and writes of device memory per step, and zero_grad
// when it fills the gradients with zeros: for AdamW the weight, gradient and two moments read and the
// weight and moments written; 8-bit optimizers keep the moments in a byte each; a sharded strategy steps on
// a rank's shard, and an offloaded optimizer steps on the host.
func optimizerBytes(c train.Config, trained, elem float64) float64 {
	p := c.Parallel
	if p.Offload != dist.OffloadNone {
		return 0
	}
	if p.Strategy.ZeRO() || p.Strategy.FSDP() {
		trained /= float64(p.ShardGroup())
	}
	state := elem // torch.optim keeps the moments in the parameter's dtype
	var perWeight float64
	switch c.Optimizer {
	case knob.SGD:
		perWeight = 3 * elem
	case knob.Momentum:
		perWeight = 3*elem + 2*state
	case knob.AdamW8bit, knob.PagedAdamW8bit:
		perWeight = 3*elem + 4
	default: // adam, adamw, paged-adamw
		perWeight = 3*elem + 4*state
	}
	bytes := perWeight * trained
	if c.ZeroGrad == knob.ZeroGradZero {
		bytes += elem * trained
	}
	return bytes
}

// Measure completes an estimate with what a run of the configuration moved in its last step: host
// transfers over PCIe (offload), the paged optimizer's evictions, and the collectives over the GPU link.
func Measure(est Cost, res *train.Result, g GPU) Cost {
	if res == nil {
		return est
	}
	if n := len(res.Traffic); n > 0 {
		t := res.Traffic[n-1]
		est.Host += float64(t.Payload[dist.HostToDevice]+t.Payload[dist.DeviceToHost]) / (g.PCIe * 1e9)
		est.Comm += float64(t.Sent) / (g.Link * 1e9)
	}
	if res.PagedEvicted > 0 && res.Steps > 0 {
		// Evicted pages come back when the optimizer touches them: twice over PCIe, per step.
		est.Host += 2 * float64(res.PagedEvicted) / float64(res.Steps) / (g.PCIe * 1e9)
	}
	return est
}
