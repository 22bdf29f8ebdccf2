package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Routing chooses which experts each token of a mixture-of-experts layer goes to where the device computes
// no router scores (the meta and cuda devices): the memory of a layer depends on how many tokens each expert
// gets, so the choice is stated, not implied. Route returns k distinct experts of experts for each of tokens
// tokens, token-major. rng is the runtime's generator, which activation checkpointing restores for its
// recompute, so a recomputed layer routes its tokens as its forward did, and a run with the same seed routes
// the same way.
type Routing interface {
	Route(rng *rand.Rand, layer, tokens, experts, k int) []int32
}

// UniformRouting sends each token to k experts drawn uniformly: every expert gets tokens x k / experts on
// average, the balance load-balancing losses aim at.
type UniformRouting struct{}

// Route draws k distinct experts per token (a partial Fisher-Yates shuffle).
func (UniformRouting) Route(rng *rand.Rand, _, tokens, experts, k int) []int32 {
	perm := make([]int32, experts)
	for i := range perm {
		perm[i] = int32(i)
	}
	out := make([]int32, 0, tokens*k)
	for range tokens {
		for j := range k {
			r := j + rng.IntN(experts-j)
			perm[j], perm[r] = perm[r], perm[j]
			out = append(out, perm[j])
		}
	}
	return out
}

// SkewedRouting favours some experts: in each layer the experts, in an order of their own (a permutation fixed
// by the layer's index), are chosen with probability proportional to 1 / rank^Alpha (Zipf's law; Alpha 0 is
// uniform, 1 gives the first of 8 experts 37% of the draws), each token taking k distinct ones.
type SkewedRouting struct{ Alpha float64 }

// Route draws each token's k experts from the layer's skewed weights.
func (s SkewedRouting) Route(rng *rand.Rand, layer, tokens, experts, k int) []int32 {
	order := rand.New(rand.NewPCG(uint64(layer), 0x6d6f65)).Perm(experts)
	w := make([]float64, experts)
	for rank, e := range order {
		w[e] = math.Pow(float64(rank+1), -s.Alpha)
	}
	return weightedRoute(rng, w, tokens, k)
}

// LoadRouting draws each token's experts in proportion to measured loads: Loads[layer] holds each expert's
// share (tokens counted in a real run, say), the last row standing for the layers past it.
type LoadRouting struct{ Loads [][]float64 }

// Route draws each token's k experts from the layer's loads.
func (l LoadRouting) Route(rng *rand.Rand, layer, tokens, experts, k int) []int32 {
	w := l.Loads[min(layer, len(l.Loads)-1)]
	if len(w) != experts {
		panic(fmt.Sprintf("routing loads of %d experts for a layer of %d", len(w), experts))
	}
	return weightedRoute(rng, w, tokens, k)
}

// FixedRouting sends the tokens where Experts[layer] says (token-major, k a token).
type FixedRouting struct{ Experts [][]int32 }

// Route returns the layer's experts.
func (f FixedRouting) Route(_ *rand.Rand, layer, tokens, _, k int) []int32 {
	r := f.Experts[layer]
	if len(r) != tokens*k {
		panic(fmt.Sprintf("fixed routing of layer %d has %d entries for %d tokens of %d experts each", layer, len(r), tokens, k))
	}
	return r
}

// weightedRoute draws k distinct experts per token with probabilities proportional to w (positive somewhere):
// Walker's alias method and rejection of experts the token already has, and an exact draw over the rest
// when a few experts hold nearly all the weight.
func weightedRoute(rng *rand.Rand, w []float64, tokens, k int) []int32 {
	a := newAlias(w)
	out := make([]int32, 0, tokens*k)
	chosen := make([]bool, len(w))
	picked := make([]int32, 0, k)
	for range tokens {
		picked = picked[:0]
		for range k {
			e := -1
			for try := 0; try < 32; try++ {
				if c := a.draw(rng); !chosen[c] {
					e = c
					break
				}
			}
			if e < 0 {
				e = exactDraw(rng, w, chosen)
			}
			chosen[e] = true
			picked = append(picked, int32(e))
		}
		for _, e := range picked {
			chosen[e] = false
		}
		out = append(out, picked...)
	}
	return out
}

// exactDraw draws an expert not chosen yet, in proportion to w (uniformly among them if none has weight).
func exactDraw(rng *rand.Rand, w []float64, chosen []bool) int {
	var total float64
	var free []int
	for e, x := range w {
		if !chosen[e] {
			total += x
			free = append(free, e)
		}
	}
	if total <= 0 {
		return free[rng.IntN(len(free))]
	}
	u := rng.Float64() * total
	for _, e := range free {
		if u -= w[e]; u < 0 {
			return e
		}
	}
	return free[len(free)-1]
}

// alias is Walker's alias table of a discrete distribution.
type alias struct {
	prob  []float64
	other []int
}

func newAlias(w []float64) alias {
	n := len(w)
	var total float64
	for _, x := range w {
		total += x
	}
	a := alias{prob: make([]float64, n), other: make([]int, n)}
	scaled := make([]float64, n)
	var small, large []int
	for i, x := range w {
		scaled[i] = x / total * float64(n)
		if scaled[i] < 1 {
			small = append(small, i)
		} else {
			large = append(large, i)
		}
	}
	for len(small) > 0 && len(large) > 0 {
		s, l := small[len(small)-1], large[len(large)-1]
		small = small[:len(small)-1]
		a.prob[s], a.other[s] = scaled[s], l
		scaled[l] -= 1 - scaled[s]
		if scaled[l] < 1 {
			large = large[:len(large)-1]
			small = append(small, l)
		}
	}
	for _, i := range append(small, large...) {
		a.prob[i], a.other[i] = 1, i
	}
	return a
}

func (a alias) draw(rng *rand.Rand) int {
	i := rng.IntN(len(a.prob))
	if rng.Float64() < a.prob[i] {
		return i
	}
	return a.other[i]
}
