package layout

import "math"

// MegatronFigures are the figures Megatron-LM's report_theoretical_memory prints, in bytes (it prints them
// divided by 2^20 as "MB").
type MegatronFigures struct {
	WeightAndOptimizer float64
	Activation         float64
}

// Megatron computes what Megatron-LM's report_theoretical_memory (megatron/training/
// theoretical_memory_usage.py, at d98e8a64ddf3) reports for m under l, with the same arithmetic in the same
// order, for dense models (no MoE, MLA or multi-token prediction). Its figures are the first pipeline
// stage's, the one it takes for the most loaded. It is a special case of Estimate, which differs where
// Megatron simplifies:
//   - weights: the final norm's parameters are spread over the stages (divided by PP) instead of sitting
//     on the last; the optimizer is sharded over DP, not DP*CP, the group Megatron's distributed
//     optimizer actually uses;
//   - activations, with SP and selective recompute (compute_activation_memory): sbh(18 + 4*ffn/h)/t per
//     layer, which ignores grouped-query attention and a gated MLP's third tensor; the token ids are
//     divided by TP too; CP is ignored (the whole sequence is counted);
//   - activations otherwise (compute_activation_memory_without_sp, used for full recompute and for no
//     recompute too): sbh(10 + 24/t), whatever the MLP width, and no attention scores; the output layer's
//     logits counted in bf16 without the final norm's input; and 5% added for temporaries;
//   - the output layer's activations are counted only when PP is 1;
//   - there is no GPipe schedule: a GPipe layout is counted as 1F1B.
func Megatron(m Model, l Layout) (MegatronFigures, error) {
	if err := l.Validate(m); err != nil {
		return MegatronFigures{}, err
	}
	weights := megatronWeightAndOptimizer(m, l)
	var act float64
	// megatron/training/arguments.py turns sequence parallelism off when TP is 1.
	if l.SequenceParallel && l.TP > 1 && l.Recompute == RecomputeSelective {
		act = megatronActivation(m, l)
	} else {
		act = megatronActivationWithoutSP(m, l)
	}
	return MegatronFigures{WeightAndOptimizer: weights, Activation: act}, nil
}

// megatronWeightAndOptimizer is compute_weight_and_optimizer_memory for a dense model; each float64
// expression keeps Python's order of operations so that the results agree to the last bit (integer
// products are exact in both).
func megatronWeightAndOptimizer(m Model, l Layout) float64 {
	h, a, g := m.Hidden, m.Heads, m.queryGroups()
	pp, tp := float64(l.PP), float64(l.TP)
	queryProjectionToHidden := float64(m.kvChannels()*a) / float64(h)
	gated := 1.0
	if m.GatedMLP {
		gated = 3.0 / 2
	}
	norm := m.normParams()
	selfAttention := float64(2*h*h) * ((1 + float64(g)/float64(a)) * queryProjectionToHidden)
	embedding := float64(h * m.PaddedVocab(l.TP))
	finalNorm := float64(norm * h)
	mlp := float64(2*h*m.FFN) * gated
	layerNorms := float64(2 * h * norm)
	tpSharded := (selfAttention + mlp) * float64(m.Layers)
	replicated := layerNorms*float64(m.Layers) + finalNorm
	tpShardedMostLoaded := (tpSharded/pp + 0 + embedding) / tp
	replicatedMostLoaded := replicated / pp
	if m.UntiedEmbeddings && l.PP == 1 {
		tpShardedMostLoaded += embedding / tp
	}
	bytesPerParam := 18.0
	if l.DistributedOptimizer {
		bytesPerParam = 6 + 12/float64(l.DP)
	}
	return (tpShardedMostLoaded + replicatedMostLoaded) * bytesPerParam
}

// megatronPipelineFactor applies compute_activation_memory's pipeline discount: the interleaved penalty
// 1 + (PP-1)/(PP*V), or min(1, M/PP) under 1F1B.
func megatronPipelineFactor(act float64, l Layout) float64 {
	pp := float64(l.PP)
	if l.PP > 1 && l.Schedule.Kind == Interleaved {
		act *= 1 + (pp-1)/(pp*float64(l.Schedule.Virtual))
	}
	if l.Schedule.Kind != Interleaved && l.PP > 1 {
		act *= math.Min(1, float64(l.MicroBatches)/pp)
	}
	return act
}

// megatronActivation is compute_activation_memory (Table 2's TP+SP+selective row, per layer
// sbh(18 + 4*ffn/h)/t).
func megatronActivation(m Model, l Layout) float64 {
	s, b, h, pp := m.Seq, m.MicroBatch, m.Hidden, int64(l.PP)
	act := float64(s*b*h) * (18 + 4*(float64(m.FFN)/float64(h)))
	act *= float64(m.Layers)
	act += float64(8 * s * b * pp)
	act += float64(s * b * h * pp)
	act = megatronPipelineFactor(act, l)
	if l.PP == 1 {
		act += float64(s*b*h*4) * (1 + float64(m.PaddedVocab(l.TP))/float64(h))
	}
	return act / float64(l.TP)
}

// megatronActivationWithoutSP is compute_activation_memory_without_sp (Table 2's TP+selective row,
// sbh(10 + 24/t), and 5% for temporaries).
func megatronActivationWithoutSP(m Model, l Layout) float64 {
	s, b, h, pp := m.Seq, m.MicroBatch, m.Hidden, int64(l.PP)
	act := float64(s*b*h) * (10 + 24/float64(l.TP))
	act *= float64(m.Layers)
	act += float64(8 * s * b * pp)
	act += float64(s * b * h * pp)
	act = megatronPipelineFactor(act, l)
	if l.PP == 1 {
		logits := float64(s * b * m.PaddedVocab(l.TP))
		logits /= float64(l.TP)
		finalNorm := float64(s * b * h)
		act += (logits + finalNorm) * 2
	}
	return act * 1.05
}
