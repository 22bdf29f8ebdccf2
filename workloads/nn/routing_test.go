package nn

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/workloads/device"
)

// routeCounts routes tokens and checks each token's experts are k distinct ones in range; it returns each
// expert's tokens.
func routeCounts(t *testing.T, r Routing, layer, tokens, experts, k int) []int {
	t.Helper()
	got := r.Route(rand.New(rand.NewPCG(1, 2)), layer, tokens, experts, k)
	if len(got) != tokens*k {
		t.Fatalf("%d experts for %d tokens of %d", len(got), tokens, k)
	}
	counts := make([]int, experts)
	for i := 0; i < len(got); i += k {
		tok := slices.Clone(got[i : i+k])
		slices.Sort(tok)
		if len(slices.Compact(tok)) != k || tok[0] < 0 || int(tok[k-1]) >= experts {
			t.Fatalf("token %d goes to %v", i/k, got[i:i+k])
		}
		for _, e := range tok {
			counts[e]++
		}
	}
	return counts
}

// TestRoutings checks the routings' distributions against their formulas: uniform gives every expert
// tokens x k / experts (within sampling noise), skewed gives the most favoured expert of a top-1 routing its
// Zipf share 1 / H(experts, alpha), loads give each expert its share of them, and a routing whose weight is
// all on one expert still gives each token k distinct experts.
func TestRoutings(t *testing.T) {
	const tokens = 20000
	within := func(name string, got, want float64) {
		if math.Abs(got-want) > 4*math.Sqrt(want) {
			t.Errorf("%s: %.0f tokens, expected %.0f", name, got, want)
		}
	}
	for e, n := range routeCounts(t, UniformRouting{}, 0, tokens, 8, 2) {
		within("uniform expert "+string(rune('0'+e)), float64(n), tokens*2/8)
	}
	counts := routeCounts(t, SkewedRouting{Alpha: 1.2}, 3, tokens, 8, 1)
	var h float64
	for r := 1; r <= 8; r++ {
		h += math.Pow(float64(r), -1.2)
	}
	within("skewed busiest expert", float64(slices.Max(counts)), tokens/h)
	loads := []float64{5, 1, 1, 1}
	for e, n := range routeCounts(t, LoadRouting{Loads: [][]float64{loads}}, 7, tokens, 4, 1) {
		within("loads expert "+string(rune('0'+e)), float64(n), tokens*loads[e]/8)
	}
	degenerate := routeCounts(t, LoadRouting{Loads: [][]float64{{1, 0, 0, 0}}}, 0, 100, 4, 3)
	if degenerate[0] != 100 {
		t.Errorf("the only weighted expert got %d of 100 tokens", degenerate[0])
	}
	a := SkewedRouting{Alpha: 1}.Route(rand.New(rand.NewPCG(9, 9)), 2, 50, 16, 4)
	b := SkewedRouting{Alpha: 1}.Route(rand.New(rand.NewPCG(9, 9)), 2, 50, 16, 4)
	if !slices.Equal(a, b) {
		t.Error("the same generator routes differently")
	}
}

// TestRecomputedLayersRouteAsTheirForward checks on the meta device that a checkpointed mixture of experts
// routes its tokens in the recompute exactly as in its forward (the routing draws from the runtime's
// generator, which checkpointing restores), so the recomputed tensors have the forward's shapes.
func TestRecomputedLayersRouteAsTheirForward(t *testing.T) {
	c := familyCases()[0]
	rt := gptRuntime(device.Meta)
	m, err := NewDecoder(rt, c.decoderConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	m.Routing = SkewedRouting{Alpha: 1}
	m.Checkpoint = func(int) bool { return true }
	seen := map[int][][]int{}
	m.OnRoute = func(layer int, perExpert []int) { seen[layer] = append(seen[layer], perExpert) }
	idx := tokens(rt, c.Batch, c.Seq, c.Vocab)
	loss := m.Loss(idx, idx)
	backwardAndRelease(t, rt, loss, idx, m.Release)
	for layer, routes := range seen {
		if len(routes) != 2 || !slices.Equal(routes[0], routes[1]) {
			t.Errorf("layer %d routed %v in its forward and its recompute", layer, routes)
		}
	}
	if len(seen) != c.Layers {
		t.Errorf("%d layers routed, want %d", len(seen), c.Layers)
	}
}
