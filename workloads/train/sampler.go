package train

import (
	"math"
	"math/rand/v2"
	"slices"
)

// megabatchBatches is how many batches the length-grouped sampler sorts together. transformers'
// get_length_grouped_indices (Trainer's group_by_length) takes mega_batch_mult = min(len(dataset) //
// (4 * batch_size), 50): 50 for any dataset of 200 batches or more.
const megabatchBatches = 50

// batchShape is what the loop hands a dataset for one batch: n samples of the given lengths, padded to t
// tokens. A model that is not a sequence model uses n alone.
type batchShape struct {
	n, t    int
	lengths []int // each sample's tokens before padding, len n; nil when every sample is t long
}

// lengthSampler draws the length of every sample and pads each batch, as a DataLoader with a length-grouped
// sampler and a padding collator does. Its random stream is its own, seeded from Config.Seed, so the lengths
// of a run are reproducible and do not change what the data or the model draw.
type lengthSampler struct {
	dist    SeqDist
	pad     Padding
	sorted  bool
	context int // Config.Seq: the model's context, the longest a sample may be
	rng     *rand.Rand
	pool    []int // sort-by-length: the rest of the current megabatch, longest first
}

func newLengthSampler(cfg *Config) *lengthSampler {
	return &lengthSampler{dist: cfg.SeqDist, pad: cfg.Padding, sorted: cfg.SortByLength, context: cfg.Seq,
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x5e91e7))}
}

// next returns the shape of the next batch of n samples. With fixed lengths it draws nothing: every batch is
// (n, context), as before lengths varied.
func (s *lengthSampler) next(n int) batchShape {
	if s.dist.Fixed() {
		return batchShape{n: n, t: s.context}
	}
	lengths := make([]int, n)
	if s.sorted {
		// Trainer's LengthGroupedSampler: a megabatch of 50 batches' samples, sorted longest first, then
		// cut into consecutive batches, so that a batch's samples have similar lengths and little padding.
		if len(s.pool) < n {
			s.pool = make([]int, megabatchBatches*n)
			for i := range s.pool {
				s.pool[i] = s.draw()
			}
			slices.SortFunc(s.pool, func(a, b int) int { return b - a })
		}
		copy(lengths, s.pool[:n])
		s.pool = s.pool[n:]
	} else {
		for i := range lengths {
			lengths[i] = s.draw()
		}
	}
	return batchShape{n: n, t: s.pad.pad(slices.Max(lengths), s.context), lengths: lengths}
}

// draw returns one sample's length, cut to the context.
func (s *lengthSampler) draw() int {
	d := &s.dist
	var l int
	switch d.kind {
	case seqUniform:
		l = d.min + s.rng.IntN(d.max-d.min+1)
	case seqLognormal:
		// Clamp before converting: exp of a large draw is +Inf.
		v := d.median * math.Exp(d.sigma*s.rng.NormFloat64())
		l = int(math.Round(min(max(v, 1), float64(d.max))))
	case seqFile:
		l = d.file.draw(s.rng.Int64N(d.file.Samples()))
	default:
		l = s.context
	}
	return min(l, s.context)
}
