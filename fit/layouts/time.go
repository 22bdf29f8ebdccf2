package layouts

import (
	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/workloads/dist/layout"
)

// StepTime is the modelled time of one optimizer step, in seconds, by part. As fit's Cost, every part runs
// at the card's published peak and the parts add up (nothing overlaps): it ranks layouts, it does not
// predict a step.
type StepTime struct {
	// Compute is the slowest stage's matmuls for all M micro-batches: forward, backward and recompute at the
	// card's 16-bit tensor peak, or its weights' reads through device memory when those take longer.
	Compute float64
	// Bubble is the pipeline's idle time: (PP - 1)/(V M) of Compute.
	Bubble float64
	// TP is the tensor-parallel collectives on the node's GPU link; CP the context-parallel K/V exchange;
	// DP the gradients' reduction (and the distributed optimizer's parameter all-gather) once a step.
	TP, CP, DP float64
	// Optimizer is Adam's step over the rank's shard, through device memory.
	Optimizer float64
	// FLOPs is the slowest stage's rank's matmul work of the step.
	FLOPs float64
}

// Total is the step time.
func (t StepTime) Total() float64 { return t.Compute + t.Bubble + t.TP + t.CP + t.DP + t.Optimizer }

// BubbleFraction is the pipeline bubble as a share of the compute of a step of m micro-batches on pp stages
// of v model chunks each: (pp - 1)/(v m) (Narayanan et al. 2021, "Efficient Large-Scale Language Model
// Training on GPU Clusters Using Megatron-LM", §2.2.1 for 1F1B and §2.2.2 for the interleaved schedule).
func BubbleFraction(pp, v, m int) float64 {
	if pp <= 1 || m < 1 {
		return 0
	}
	return float64(pp-1) / float64(max(v, 1)*m)
}

// Network is the bandwidth, GB/s per direction, of one GPU's share of the links between nodes: 400 Gb/s
// InfiniBand NDR per GPU on an H100 or H200 node (NVIDIA DGX H100/H200 user guide: eight ConnectX-7 at
// 400 Gb/s), 200 Gb/s HDR on an A100 (DGX A100: eight ConnectX-6 at 200 Gb/s), 100 Gb/s Ethernet otherwise.
func Network(g fit.GPU) float64 {
	switch g.Name {
	case "h100", "h200":
		return 50
	case "a100-40g", "a100-80g":
		return 25
	}
	return 12.5
}

// Bytes Megatron's collectives move per element: bf16 activations and parameters, fp32 main gradients
// (--accumulate-allreduce-grads-in-fp32).
const (
	activationBytes = 2
	gradientBytes   = 4
	paramBytes      = 2
	// adamBytes is what Adam's step reads and writes per fp32 parameter it updates: fit's cost model's
	// AdamW (optimizerBytes in fit/cost.go: the weight, gradient and two moments read, the weight and
	// moments written: 3 x 4 + 4 x 4).
	adamBytes = 3*4 + 4*4
)

// Time models the step time of c for j.
//
// Compute follows fit's cost model (fit/cost.go, Estimate): per micro-batch and rank, 2 FLOPs per matmul
// weight per token forward and 4 backward, on the rank's TP shard of its stage's weights and its CP share
// of the tokens; attention's QK^T and AV at 4 x tokens x seq x heads x head width per layer forward
// (the full square and twice that backward for the unfused core that layout counts under no recompute
// without CP; flash's causal half and 2.5x backward otherwise); recompute adds the layers' forward (full)
// or attention's (selective). A micro-batch takes the longer of its FLOPs at the tensor peak and its
// weights' traffic (read forward, backward and on recompute in bf16, fp32 gradients written). The pipeline
// paces at its slowest stage.
//
// TP: Megatron's layer runs 2 all-reduces forward and 2 backward (Shoeybi et al. 2019, "Megatron-LM", §3,
// Figure 4: g and f of the attention and MLP blocks; with SP each becomes an all-gather and a
// reduce-scatter moving the same bytes, Korthikanti et al. 2022 §4.2.2), 2 more under full recompute; a
// ring all-reduce moves 2(t - 1)/t of the tensor's bytes per rank (Patarasuk and Yuan 2009), at the node's
// GPU link (fit's GPU.Link).
//
// CP: ring attention passes each rank's K and V chunk to the next rank CP - 1 times forward, and K, V and
// their gradients backward (Megatron's context parallelism, docs/source/api-guide/context_parallel.rst;
// Liu et al. 2023, "Ring Attention"), once more under full recompute; on the node's link when TP x CP
// GPUs fit a node, else on the network.
//
// DP: once a step the stage's fp32 gradients are all-reduced over the DP x CP ranks that share them, or,
// under the distributed optimizer, reduce-scattered and the bf16 parameters all-gathered
// (docs/user-guide/features/dist_optimizer.md); on the network when that group spans nodes (Megatron
// orders ranks TP, CP, DP, PP), else on the node's link.
func Time(j Job, c Candidate) StepTime {
	m, l, g := c.Model, c.Layout, j.GPU
	tp, cp, pp := float64(l.TP), float64(l.CP), l.PP
	tokens := float64(m.Seq) / cp * float64(m.MicroBatch) // per rank and micro-batch
	layers := float64(m.Layers / int64(pp))
	heads, groups, kv := float64(m.Heads), float64(m.Heads), float64(m.Hidden/m.Heads)
	if m.QueryGroups > 0 {
		groups = float64(m.QueryGroups)
	}
	if m.KVChannels > 0 {
		kv = float64(m.KVChannels)
	}
	unfused := l.Recompute == layout.RecomputeNone && l.CP == 1
	attnFwd := 4 * tokens * float64(m.Seq) * heads * kv / tp * layers
	attnBwd := 2 * attnFwd
	if !unfused {
		attnFwd /= 2
		attnBwd = 2.5 * attnFwd
	}
	var stage StepTime
	var params float64
	for i := range pp {
		p := float64(layout.StageParams(m, l, i))
		params = max(params, p)
		// The layers' weights: the stage's less the embedding (first stage) and the output layer (last,
		// when it is not the first stage's embedding itself); the head's matmul runs on the last stage
		// whether or not its weight is tied.
		head := float64(m.PaddedVocab(l.TP) * m.Hidden / int64(l.TP))
		layerWeights := p
		if i == 0 {
			layerWeights -= head
		}
		if i == pp-1 && (pp > 1 || m.UntiedEmbeddings) {
			layerWeights -= head
		}
		weights := layerWeights
		if i == pp-1 {
			weights += head
		}
		flops := 6*weights*tokens + attnFwd + attnBwd
		reads := 2.0
		switch l.Recompute {
		case layout.RecomputeFull:
			flops += 2*layerWeights*tokens + attnFwd
			reads = 3
		case layout.RecomputeSelective:
			flops += attnFwd
		}
		traffic := reads*paramBytes*weights + gradientBytes*weights
		t := max(flops/(g.Tensor*1e12), traffic/(g.HBM*1e9))
		if t > stage.Compute {
			stage.Compute, stage.FLOPs = t, flops
		}
	}
	micro := float64(l.MicroBatches)
	st := StepTime{Compute: micro * stage.Compute, FLOPs: micro * stage.FLOPs}
	v := 1
	if l.Schedule.Kind == layout.Interleaved {
		v = l.Schedule.Virtual
	}
	st.Bubble = st.Compute * BubbleFraction(pp, v, l.MicroBatches)

	if l.TP > 1 {
		collectives := 4.0
		if l.Recompute == layout.RecomputeFull {
			collectives = 6
		}
		bytes := collectives * layers * 2 * (tp - 1) / tp * tokens * float64(m.Hidden) * activationBytes
		st.TP = micro * bytes / (g.Link * 1e9)
	}
	if l.CP > 1 {
		passes := 3.0 // K and V forward; K, V, dK and dV backward
		if l.Recompute == layout.RecomputeFull {
			passes = 4
		}
		chunk := 2 * tokens * groups * kv / tp * activationBytes // K and V of one rank's tokens
		link := g.Link
		if l.TP*l.CP > j.GPUsPerNode() {
			link = Network(g)
		}
		st.CP = micro * passes * (cp - 1) * chunk * layers / (link * 1e9)
	}
	shard := params
	if d := float64(l.DP * l.CP); d > 1 {
		link := g.Link
		if l.TP*l.CP*l.DP > j.GPUsPerNode() {
			link = Network(g)
		}
		bytes := 2 * (d - 1) / d * gradientBytes * params
		if l.DistributedOptimizer {
			bytes = (d - 1) / d * (gradientBytes + paramBytes) * params
			shard = params / d
		}
		st.DP = bytes / (link * 1e9)
	}
	st.Optimizer = adamBytes * shard / (g.HBM * 1e9)
	return st
}
