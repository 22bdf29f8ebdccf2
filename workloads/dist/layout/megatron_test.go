package layout

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
)

// megatronConfig is one configuration handed to testdata/megatron_memory.py, in its JSON names.
type megatronConfig struct {
	Layers      int64  `json:"layers"`
	Hidden      int64  `json:"hidden"`
	Heads       int64  `json:"heads"`
	QueryGroups int64  `json:"query_groups,omitempty"`
	FFN         int64  `json:"ffn"`
	Vocab       int64  `json:"vocab"`
	Seq         int64  `json:"seq"`
	MicroBatch  int64  `json:"micro_batch"`
	SwiGLU      bool   `json:"swiglu"`
	RMSNorm     bool   `json:"rmsnorm"`
	Untied      bool   `json:"untied"`
	TP          int    `json:"tp"`
	PP          int    `json:"pp"`
	CP          int    `json:"cp"`
	DP          int    `json:"dp"`
	Virtual     *int   `json:"virtual"`
	DistOpt     bool   `json:"distributed_optimizer"`
	SP          bool   `json:"sequence_parallel"`
	Recompute   string `json:"recompute,omitempty"`
	Micro       int    `json:"microbatches"`
}

func configOf(m Model, l Layout) megatronConfig {
	c := megatronConfig{Layers: m.Layers, Hidden: m.Hidden, Heads: m.Heads, QueryGroups: m.QueryGroups, FFN: m.FFN,
		Vocab: m.Vocab, Seq: m.Seq, MicroBatch: m.MicroBatch, SwiGLU: m.GatedMLP, RMSNorm: m.RMSNorm,
		Untied: m.UntiedEmbeddings, TP: l.TP, PP: l.PP, CP: l.CP, DP: l.DP, DistOpt: l.DistributedOptimizer,
		SP: l.SequenceParallel, Micro: l.MicroBatches}
	if l.PP > 1 && l.Schedule.Kind == Interleaved {
		c.Virtual = &l.Schedule.Virtual
	}
	if l.Recompute != RecomputeNone {
		c.Recompute = l.Recompute.String()
	}
	return c
}

var (
	// GPT-3 175B (Brown et al. 2020, Table 2.1), as Megatron's examples/gpt3/train_gpt3_175b_distributed.sh.
	gpt3 = Model{Layers: 96, Hidden: 12288, Heads: 96, FFN: 4 * 12288, Vocab: 50257, Seq: 2048, MicroBatch: 1}
	// Llama-2-70B's config.json.
	llama70b = Model{Layers: 80, Hidden: 8192, Heads: 64, QueryGroups: 8, FFN: 28672, Vocab: 32000, Seq: 4096,
		MicroBatch: 1, GatedMLP: true, RMSNorm: true, UntiedEmbeddings: true}
	// Llama-2-7B's config.json.
	llama7b = Model{Layers: 32, Hidden: 4096, Heads: 32, FFN: 11008, Vocab: 32000, Seq: 4096, MicroBatch: 1,
		GatedMLP: true, RMSNorm: true, UntiedEmbeddings: true}
	// A GPT-2 XL-sized model with a 4h GeLU MLP, where the paper's equations hold as written.
	gpt1b = Model{Layers: 24, Hidden: 2048, Heads: 16, FFN: 8192, Vocab: 50257, Seq: 2048, MicroBatch: 4}
)

type megatronCase struct {
	name  string
	model Model
	l     Layout
}

func megatronCases() []megatronCase {
	onef := Schedule{Kind: OneFOneB}
	cases := []megatronCase{
		// The layout of the seeds: 64 nodes of 8, DP 64 x TP 8, ZeRO-1 (the distributed optimizer), no PP.
		{"gpt3-175b tp8 dp64 zero1", gpt3, Layout{GPUs: 512, DP: 64, TP: 8, PP: 1, CP: 1, SequenceParallel: true,
			MicroBatches: 2, DistributedOptimizer: true, Recompute: RecomputeSelective}},
		{"gpt3-175b tp8 dp64 zero1 full", gpt3, Layout{GPUs: 512, DP: 64, TP: 8, PP: 1, CP: 1, SequenceParallel: true,
			MicroBatches: 2, DistributedOptimizer: true, Recompute: RecomputeFull}},
		{"gpt3-175b tp8 pp8 dp8", gpt3, Layout{GPUs: 512, DP: 8, TP: 8, PP: 8, CP: 1, SequenceParallel: true, Schedule: onef,
			MicroBatches: 64, DistributedOptimizer: true, Recompute: RecomputeSelective}},
		{"gpt3-175b tp8 pp16 dp4", gpt3, Layout{GPUs: 512, DP: 4, TP: 8, PP: 16, CP: 1, SequenceParallel: true, Schedule: onef,
			MicroBatches: 128, DistributedOptimizer: true, Recompute: RecomputeSelective}},
		{"gpt3-175b tp8 pp16 M=8", gpt3, Layout{GPUs: 512, DP: 4, TP: 8, PP: 16, CP: 1, SequenceParallel: true, Schedule: onef,
			MicroBatches: 8, DistributedOptimizer: true, Recompute: RecomputeSelective}},
		{"llama2-70b tp8 pp4 dp2", llama70b, Layout{GPUs: 64, DP: 2, TP: 8, PP: 4, CP: 1, SequenceParallel: true, Schedule: onef,
			MicroBatches: 32, DistributedOptimizer: true, Recompute: RecomputeSelective}},
		{"llama2-7b tp2 pp2 v2", llama7b, Layout{GPUs: 8, DP: 2, TP: 2, PP: 2, CP: 1, SequenceParallel: true,
			Schedule: Schedule{Kind: Interleaved, Virtual: 2}, MicroBatches: 8, DistributedOptimizer: true, Recompute: RecomputeSelective}},
		{"llama2-7b tp2 pp2 v2 no-sp", llama7b, Layout{GPUs: 8, DP: 2, TP: 2, PP: 2, CP: 1,
			Schedule: Schedule{Kind: Interleaved, Virtual: 2}, MicroBatches: 8, Recompute: RecomputeSelective}},
	}
	for _, tp := range []int{1, 2, 4, 8} {
		for _, sp := range []bool{true, false} {
			for _, pp := range []struct {
				n int
				s Schedule
			}{{1, onef}, {4, onef}, {4, Schedule{Kind: Interleaved, Virtual: 3}}} {
				for _, r := range []Recompute{RecomputeSelective, RecomputeNone} {
					l := Layout{GPUs: 64, TP: tp, PP: pp.n, CP: 1, DP: 64 / (tp * pp.n), SequenceParallel: sp,
						Schedule: pp.s, MicroBatches: 16, DistributedOptimizer: tp%2 == 0, Recompute: r}
					m := gpt1b
					m.UntiedEmbeddings = sp
					name := fmt.Sprintf("gpt-1b tp%d sp=%v pp%d %s %s", tp, sp, pp.n, pp.s, r)
					cases = append(cases, megatronCase{name, m, l})
				}
			}
		}
	}
	return cases
}

// TestMegatronMatchesItsSource runs Megatron-LM's own report_theoretical_memory (transcribed in testdata
// from the commit named there) on each configuration and requires Megatron to give the same float64s.
func TestMegatronMatchesItsSource(t *testing.T) {
	cases := megatronCases()
	configs := make([]megatronConfig, len(cases))
	for i, c := range cases {
		configs[i] = configOf(c.model, c.l)
	}
	arg, err := json.Marshal(configs)
	if err != nil {
		t.Fatal(err)
	}
	var want [][3]float64
	torchtest.RunFile(t, "testdata/megatron_memory.py", &want, string(arg))
	if len(want) != len(cases) {
		t.Fatalf("python gave %d results for %d configurations", len(want), len(cases))
	}
	const mb = 1 << 20
	var table strings.Builder
	fmt.Fprintf(&table, "%-46s %10s %10s %10s %10s %10s %10s\n", "first stage", "w+opt Go", "Megatron", "act. Go", "Megatron",
		"total", "Estimate")
	for i, c := range cases {
		got, err := Megatron(c.model, c.l)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		w, a := got.WeightAndOptimizer/mb, got.Activation/mb
		if w != want[i][0] || a != want[i][1] || w+a != want[i][2] {
			t.Errorf("%s: Go gives %v, %v, %v MB; Megatron-LM %v", c.name, w, a, w+a, want[i])
		}
		stages, err := Estimate(c.model, c.l)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		fmt.Fprintf(&table, "%-46s %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f\n", c.name, w, want[i][0], a, want[i][1], want[i][2],
			stages[0].Total()/mb)
	}
	t.Logf("Go's Megatron against Megatron-LM's report_theoretical_memory (MiB, its \"MB\"), and Estimate's first stage:\n%s",
		table.String())
}
