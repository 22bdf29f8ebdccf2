package layout

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
)

// TestLayerActivationsAgainstPyTorch builds one tensor-parallel rank of a Megatron GPT layer in PyTorch on the
// CPU (testdata/saved_activations.py) and counts what autograd saves with saved-tensor hooks: LayerActivations
// must give that count exactly, for every TP size, grouped-query attention, a gated MLP, each recompute, and
// fp32 as well as bf16 activations.
func TestLayerActivationsAgainstPyTorch(t *testing.T) {
	type config struct {
		S, B, H, A, G, KV, F int64
		Gated                bool
		T                    int
		Recompute, DType     string
	}
	type kase struct {
		m Model
		c config
	}
	var cases []kase
	for _, shape := range []struct{ s, b, h, a, g, kv, f int64 }{
		{64, 2, 64, 8, 8, 8, 256},  // multi-head attention, a 4h MLP
		{32, 3, 64, 8, 2, 8, 192},  // grouped-query attention, a 3h MLP
		{48, 1, 64, 4, 4, 32, 128}, // heads wider than h/a
	} {
		for _, gated := range []bool{false, true} {
			for _, tp := range []int{1, 2, 4} {
				for _, r := range []Recompute{RecomputeNone, RecomputeSelective, RecomputeFull} {
					for _, dtype := range []string{"float32", "bfloat16"} {
						m := Model{Layers: 1, Hidden: shape.h, Heads: shape.a, QueryGroups: shape.g, KVChannels: shape.kv,
							FFN: shape.f, Vocab: 1, Seq: shape.s, MicroBatch: shape.b, GatedMLP: gated, ActivationBytes: 2}
						if dtype == "float32" {
							m.ActivationBytes = 4
						}
						if shape.g%int64(tp) != 0 {
							continue
						}
						cases = append(cases, kase{m, config{shape.s, shape.b, shape.h, shape.a, shape.g, shape.kv, shape.f, gated, tp, r.String(), dtype}})
					}
				}
			}
		}
	}
	configs := make([]map[string]any, len(cases))
	for i, c := range cases {
		configs[i] = map[string]any{"s": c.c.S, "b": c.c.B, "h": c.c.H, "a": c.c.A, "g": c.c.G, "kv": c.c.KV, "f": c.c.F,
			"gated": c.c.Gated, "t": c.c.T, "recompute": c.c.Recompute, "dtype": c.c.DType}
	}
	arg, err := json.Marshal(configs)
	if err != nil {
		t.Fatal(err)
	}
	var want []float64
	torchtest.RunFile(t, "testdata/saved_activations.py", &want, string(arg))
	if len(want) != len(cases) {
		t.Fatalf("python gave %d results for %d configurations", len(want), len(cases))
	}
	for i, c := range cases {
		r, err := ParseRecompute(c.c.Recompute)
		if err != nil {
			t.Fatal(err)
		}
		if got := LayerActivations(c.m, c.c.T, false, 1, r); got != want[i] {
			t.Errorf("%s: LayerActivations gives %v bytes, PyTorch saves %v", fmt.Sprintf("%+v", c.c), got, want[i])
		}
	}
}
