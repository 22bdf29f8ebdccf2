package layout

// Bytes per parameter under Megatron's mixed precision (docs/user-guide/features/dist_optimizer.md, and
// num_bytes_per_parameter in megatron/training/theoretical_memory_usage.py).
const (
	weightBytes    = 2  // bf16 model parameters
	gradientBytes  = 4  // fp32 main gradients (--accumulate-allreduce-grads-in-fp32)
	optimizerBytes = 12 // fp32 master parameters and Adam's two fp32 moments
)

// Stage is what one rank of a pipeline stage holds at its peak, in bytes (fractional where the
// interleaved schedule's in-flight count is, as Megatron's own estimate is).
type Stage struct {
	Index  int   // the pipeline stage, 0 the first
	Layers int64 // transformer layers on the stage

	Params     int64   // parameters one rank of the stage holds (its TP shard)
	Weights    float64 // bf16 parameters
	Gradients  float64 // fp32 main gradients
	Optimizer  float64 // fp32 master parameters and Adam's moments, sharded under the distributed optimizer
	InFlight   float64 // micro-batches whose activations the stage holds at its peak (layer-equivalents)
	Layer      float64 // the transformer layers' saved activations, all in-flight micro-batches
	Embedding  float64 // the embedding's saved activations (first stage)
	Output     float64 // the final norm, output layer and cross-entropy's saved activations (last stage)
	Workspace  float64 // one layer's activations rebuilt in the backward pass under full recompute (selective's rebuilt scores are not counted)
	Activation float64 // Layer + Embedding + Output + Workspace
}

// Total is the rank's weights, gradients, optimizer states and activations.
func (s Stage) Total() float64 { return s.Weights + s.Gradients + s.Optimizer + s.Activation }

// Estimate gives the memory of one rank of every pipeline stage of m trained under l: element i is stage i
// (first, middle stages, last). It returns a *LayoutError when l cannot train m. Not counted: the CUDA
// context, communication buffers, the allocator's caching and fragmentation, and transient buffers.
func Estimate(m Model, l Layout) ([]Stage, error) {
	if err := l.Validate(m); err != nil {
		return nil, err
	}
	perLayer := LayerActivations(m, l.TP, l.SequenceParallel, l.CP, l.Recompute)
	stages := make([]Stage, l.PP)
	for i := range stages {
		s := Stage{Index: i, Layers: m.Layers / int64(l.PP), Params: StageParams(m, l, i)}
		p := float64(s.Params)
		s.Weights = weightBytes * p
		s.Gradients = gradientBytes * p
		s.Optimizer = optimizerBytes * p
		if l.DistributedOptimizer {
			s.Optimizer /= float64(l.DP * l.CP)
		}
		s.InFlight = InFlight(l, i)
		s.Layer = float64(s.Layers) * perLayer * s.InFlight
		if i == 0 {
			s.Embedding = s.InFlight * EmbeddingActivations(m, l.TP, l.SequenceParallel, l.CP)
		}
		if i == l.PP-1 {
			s.Output = outputInFlight(l) * OutputActivations(m, l.TP, l.SequenceParallel, l.CP)
		}
		if l.Recompute == RecomputeFull {
			s.Workspace = LayerActivations(m, l.TP, l.SequenceParallel, l.CP, RecomputeNone)
		}
		s.Activation = s.Layer + s.Embedding + s.Output + s.Workspace
		stages[i] = s
	}
	return stages, nil
}

// StageParams counts the parameters one TP rank of stage i holds (biases aside, as Megatron's estimate
// counts them): its layers' attention and MLP matrices divided over the TP ranks and their two norms whole;
// the first stage adds the word embeddings (vocabulary-parallel, PaddedVocab rows); the last adds the final
// norm and the output layer, which with tied embeddings and PP > 1 is a copy of the word embeddings
// (Megatron's shared embedding, kept in sync by an all-reduce between the first and last stages).
// Position embeddings are rotary (none held); learned ones (GPT-3's) are not counted, as Megatron's
// estimate does not count them.
func StageParams(m Model, l Layout, i int) int64 {
	t := int64(l.TP)
	layers := m.Layers / int64(l.PP)
	p := layers * ((m.attentionParams()+m.mlpParams())/t + 2*m.Hidden*m.normParams())
	embedding := m.PaddedVocab(l.TP) * m.Hidden / t
	if i == 0 {
		p += embedding
	}
	if i == l.PP-1 {
		p += m.normParams() * m.Hidden
		if m.UntiedEmbeddings || l.PP > 1 {
			p += embedding
		}
	}
	return p
}

// LayerActivations is the bytes one transformer layer saves for its backward pass for one micro-batch on
// one rank, from Korthikanti et al. 2022, §4.1-4.2 and Table 2, with s the sequence per CP rank:
//
//	no parallelism             sbh(34 + 5as/h)
//	TP t                       sbh(10 + 24/t + 5as/(ht))
//	TP t with SP               sbh/t (34 + 5as/h)
//	selective recompute        the same without the 5as/h term
//	full recompute             2sbh (2sbh/t with SP): the layer's input only
//
// The equations are written for bf16 activations, multi-head attention and a 4h GeLU MLP; this is their
// general form, which reduces to them there (so 34 = 18 + 4*ffn/h, Megatron's compute_activation_memory):
// kept whole on every TP rank without SP are the two norms' inputs, the QKV and first MLP linears' inputs
// (4 elements of h) and two one-byte dropout masks; split over TP are Q, K and V (K and V g/a as wide
// under grouped-query attention), the output projection's input, and the MLP's activation input and
// output (three of ffn when gated: Megatron's fused SwiGLU keeps its 2*ffn input, the second linear its
// ffn input); the attention core keeps the softmax, its dropout mask and output (2d+1 bytes per score,
// a*s*s scores, split over TP), and K and V repeated to all a heads. Context parallelism runs
// attention on fused kernels that save no scores (Megatron requires Transformer Engine's), so with CP > 1
// the score term is dropped whatever the recompute.
func LayerActivations(m Model, tp int, sp bool, cp int, r Recompute) float64 {
	d := m.activationBytes()
	s := m.Seq / int64(cp)
	t := float64(tp)
	sbh := s * m.MicroBatch * m.Hidden
	if r == RecomputeFull {
		input := float64(d * sbh)
		if sp {
			input /= t
		}
		return input
	}
	replicated := float64((4*d + 2) * sbh)
	// The unfused attention core, the one that saves scores, repeats K and V to every head before using
	// them (repeat_interleave in megatron/core/transformer/dot_product_attention.py) and so saves them
	// that wide; flash attention and selective recompute's checkpoint save them at g heads.
	unfused := r == RecomputeNone && cp == 1
	kvHeads := m.queryGroups()
	if unfused {
		kvHeads = m.Heads
	}
	attention := d * s * m.MicroBatch * 2 * m.kvChannels() * (m.Heads + kvHeads)
	mlpTensors := int64(2)
	if m.GatedMLP {
		mlpTensors = 3
	}
	mlp := d * mlpTensors * s * m.MicroBatch * m.FFN
	split := float64(attention + mlp)
	var scores float64
	if unfused {
		scores = float64((2*d + 1) * m.Heads * s * s * m.MicroBatch)
	}
	if sp {
		return (replicated+split)/t + scores/t
	}
	return replicated + split/t + scores/t
}

// EmbeddingActivations is what the embedding saves for one micro-batch (Megatron's
// compute_activation_memory, "input to embedding" and "dropout in embedding layer"): the int64 token ids,
// whole on every TP rank, and the embedding dropout's one-byte mask, split over TP under SP.
func EmbeddingActivations(m Model, tp int, sp bool, cp int) float64 {
	sb := m.Seq / int64(cp) * m.MicroBatch
	mask := float64(sb * m.Hidden)
	if sp {
		mask /= float64(tp)
	}
	return float64(8*sb) + mask
}

// OutputActivations is what the last stage's head saves for one micro-batch: the final norm's input and
// the output layer's input (split over TP under SP) and the vocabulary-parallel cross-entropy's fp32
// softmax, split over TP: 4sbh(1 + v/h)/t with SP and bf16 (Korthikanti et al. §4.3, Megatron's "inputs to
// output layer and CE loss").
func OutputActivations(m Model, tp int, sp bool, cp int) float64 {
	sb := m.Seq / int64(cp) * m.MicroBatch
	inputs := float64(2 * m.activationBytes() * sb * m.Hidden)
	if sp {
		inputs /= float64(tp)
	}
	return inputs + float64(4*sb*m.PaddedVocab(tp))/float64(tp)
}

// InFlight is how many micro-batches' activations stage i holds at its peak: the forward passes its
// schedule runs before its first backward, plus the one whose backward comes next (Megatron's
// get_pp_rank_microbatches in megatron/core/pipeline_parallel/schedules.py), capped by the micro-batches a
// step has. GPipe holds all M; 1F1B holds min(PP - i, M), so the first stage holds PP (Narayanan et al.
// 2021, §2.2). Interleaved counts model chunks, each 1/V of the stage's layers: 2(PP - i - 1) + (V - 1)PP
// + 1, capped at MV, divided by V; for the first stage that is PP(1 + (PP - 1)/(PP V)), the factor of
// Megatron's report_theoretical_memory. With as many micro-batches as stages the interleaved schedule runs
// every forward first (all_warmup_microbatches), so each stage holds all M, which that factor misses
// (Ops runs the schedules; its test holds the two together).
func InFlight(l Layout, i int) float64 {
	if l.PP == 1 {
		return 1
	}
	switch l.Schedule.Kind {
	case GPipe:
		return float64(l.MicroBatches)
	case Interleaved:
		v := l.Schedule.Virtual
		if l.MicroBatches == l.PP { // Megatron runs every forward first then (all_warmup_microbatches)
			return float64(l.MicroBatches)
		}
		chunks := min(2*(l.PP-i-1)+(v-1)*l.PP+1, l.MicroBatches*v)
		return float64(chunks) / float64(v)
	}
	return float64(min(l.PP-i, l.MicroBatches))
}

// outputInFlight is how many micro-batches' loss the last stage holds: under 1F1B and interleaving it runs
// each micro-batch's backward right after its forward; GPipe holds them all.
func outputInFlight(l Layout) float64 {
	if l.PP > 1 && l.Schedule.Kind == GPipe {
		return float64(l.MicroBatches)
	}
	return 1
}
