package layouts

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/charmbracelet/x/exp/golden"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/workloads/dist/layout"
	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
)

// tiny is a 4-layer model every size up to 8 divides: 8 heads, seq 64.
var tiny = layout.Model{Layers: 4, Hidden: 64, Heads: 8, FFN: 256, Vocab: 256, Seq: 64, MicroBatch: 1}

// llama70b is Llama-2-70B's config.json.
var llama70b = layout.Model{Layers: 80, Hidden: 8192, Heads: 64, QueryGroups: 8, FFN: 28672, Vocab: 32000, Seq: 4096,
	MicroBatch: 1, GatedMLP: true, RMSNorm: true, UntiedEmbeddings: true}

func gpu(t testing.TB, name string) fit.GPU {
	g, err := fit.LookupGPU(name)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestEnumerateCounts counts the layouts of the 4-layer model on 8 GPUs of one node by hand: the ordered
// factorizations 8 = TP x PP x CP x DP with PP dividing the 4 layers (PP = 8 cannot), each with its
// micro-batch sizes b dividing 8/DP, its schedules (PP 1: none to choose; PP 2: 1F1B, and interleaved:2,
// the 2 layers of a stage in 2 chunks, when 2 divides the 8/(DP b) micro-batches; PP 4: a layer a stage,
// 1F1B only), 3 recomputes, and the distributed optimizer on and off unless DP x CP is 1.
func TestEnumerateCounts(t *testing.T) {
	type dims struct{ tp, pp, cp, dp int }
	want := []dims{
		// PP 1: TP x CP x DP = 8, 10 ways.
		{1, 1, 1, 8}, {1, 1, 2, 4}, {1, 1, 4, 2}, {1, 1, 8, 1}, {2, 1, 1, 4}, {2, 1, 2, 2}, {2, 1, 4, 1},
		{4, 1, 1, 2}, {4, 1, 2, 1}, {8, 1, 1, 1},
		// PP 2: TP x CP x DP = 4, 6 ways.
		{1, 2, 1, 4}, {1, 2, 2, 2}, {1, 2, 4, 1}, {2, 2, 1, 2}, {2, 2, 2, 1}, {4, 2, 1, 1},
		// PP 4: TP x CP x DP = 2, 3 ways.
		{1, 4, 1, 2}, {1, 4, 2, 1}, {2, 4, 1, 1},
	}
	for _, micro := range []int{1, 0} {
		t.Run(fmt.Sprintf("micro-batch %d", micro), func(t *testing.T) {
			j := Job{Model: tiny, GPUs: 8, Nodes: 1, GlobalBatch: 8, MicroBatch: micro}
			count := 0
			for _, d := range want {
				optimizers := 2
				if d.dp*d.cp == 1 {
					optimizers = 1
				}
				sizes := []int{1}
				if micro == 0 {
					sizes = []int{1, 2, 4, 8}
				}
				for _, b := range sizes {
					if 8%(d.dp*b) != 0 {
						continue // b does not divide a replica's 8/DP sequences
					}
					schedules := 1
					if m := 8 / (d.dp * b); d.pp == 2 && m%2 == 0 {
						schedules = 2 // interleaved:2 too, where PP divides the M micro-batches
					}
					count += schedules * 3 * optimizers
				}
			}
			got := Enumerate(j)
			if len(got) != count {
				t.Errorf("%d layouts, want %d", len(got), count)
			}
			var seen []dims
			for _, c := range got {
				d := dims{c.Layout.TP, c.Layout.PP, c.Layout.CP, c.Layout.DP}
				if !slices.Contains(seen, d) {
					seen = append(seen, d)
				}
				if c.Layout.MicroBatches*c.Layout.DP*int(c.Model.MicroBatch) != 8 {
					t.Errorf("%v: %d micro-batches of %d on %d replicas is not the global batch 8", c.Layout, c.Layout.MicroBatches, c.Model.MicroBatch, c.Layout.DP)
				}
			}
			if len(seen) != len(want) {
				t.Errorf("%d factorizations, want %d: %v", len(seen), len(want), seen)
			}
			for _, d := range want {
				if !slices.Contains(seen, d) {
					t.Errorf("missing tp=%d pp=%d cp=%d dp=%d", d.tp, d.pp, d.cp, d.dp)
				}
			}
		})
	}
}

// TestEnumerateKeepsTPInANode: on 2 nodes of 4 GPUs, no layout has TP 8.
func TestEnumerateKeepsTPInANode(t *testing.T) {
	for _, c := range Enumerate(Job{Model: tiny, GPUs: 8, Nodes: 2, GlobalBatch: 8, MicroBatch: 1}) {
		if c.Layout.TP > 4 {
			t.Fatalf("%v: TP %d spans nodes of 4 GPUs", c.Layout, c.Layout.TP)
		}
	}
}

// TestBubbleFraction: Narayanan et al. 2021's bubble, (p - 1)/(v m), for given stages, chunks and
// micro-batches, and the share of compute each plan's bubble is.
func TestBubbleFraction(t *testing.T) {
	for _, c := range []struct {
		pp, v, m int
		want     float64
	}{
		{8, 1, 64, 7.0 / 64},
		{4, 2, 8, 3.0 / 16},
		{16, 5, 32, 15.0 / 160},
		{2, 1, 1, 1},
		{1, 1, 4, 0},
	} {
		if got := BubbleFraction(c.pp, c.v, c.m); math.Abs(got-c.want) > 1e-15 {
			t.Errorf("pp %d v %d m %d: %v, want %v", c.pp, c.v, c.m, got, c.want)
		}
	}
	j := Job{Model: tiny, GPUs: 8, Nodes: 1, GlobalBatch: 8, GPU: gpu(t, "h100")}
	for _, c := range Enumerate(j) {
		l := c.Layout
		v := 1
		if l.Schedule.Kind == layout.Interleaved {
			v = l.Schedule.Virtual
		}
		want := 0.0
		if l.PP > 1 {
			want = float64(l.PP-1) / float64(v*l.MicroBatches)
		}
		st := Time(j, c)
		if math.Abs(st.Bubble-want*st.Compute) > 1e-12*st.Compute {
			t.Fatalf("%v %s M=%d: bubble %g of compute %g, want %g of it", l, l.Schedule, l.MicroBatches, st.Bubble, st.Compute, want)
		}
	}
}

// TestComputeMatchesNarayanan: on one GPU, a GPT-shaped model (4h MLP, multi-head attention, tied
// embeddings) without recompute does 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) FLOPs a step (Narayanan et al.
// 2021, §5.1, with the recompute's extra forward taken out: 72 = 96 x 3/4), with full recompute
// 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) less the attention's saving under flash: the formula's attention is
// the full square, forward, twice backward and once more recomputed (16 B s^2 h l), flash's causal half 9/16 of it.
// The norms' weights, which the formula leaves out, are within 1e-3.
func TestComputeMatchesNarayanan(t *testing.T) {
	const B, s, l, h, V = 4, 2048, 24, 2048, 51200
	m := layout.Model{Layers: l, Hidden: h, Heads: 16, FFN: 4 * h, Vocab: V, Seq: s, MicroBatch: 1}
	j := Job{Model: m, GPUs: 1, Nodes: 1, GlobalBatch: B, MicroBatch: 1, GPU: gpu(t, "h100")}
	base := layout.Layout{GPUs: 1, DP: 1, TP: 1, PP: 1, CP: 1, MicroBatches: B}
	none := Time(j, Candidate{Model: m, Layout: base}).FLOPs
	wantNone := 72.0 * B * s * l * h * h * (1 + float64(s)/(6*h) + float64(V)/(12*l*h))
	full := base
	full.Recompute = layout.RecomputeFull
	gotFull := Time(j, Candidate{Model: m, Layout: full}).FLOPs
	wantFull := 96.0*B*s*l*h*h*(1+float64(s)/(6*h)+float64(V)/(16*l*h)) - 16.0*B*s*s*h*l*(1-9.0/16)
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"none", none, wantNone}, {"full", gotFull, wantFull}} {
		if math.Abs(c.got/c.want-1) > 1e-3 {
			t.Errorf("recompute %s: %.6g FLOPs, want %.6g", c.name, c.got, c.want)
		}
	}
}

// TestCollectiveTimes: TP's 4 ring all-reduces a layer of 2(t-1)/t x s b h bf16 bytes on the node's link,
// and DP's all-reduce of a stage's fp32 gradients, 2(d-1)/d of them, on the network when DP spans nodes.
func TestCollectiveTimes(t *testing.T) {
	g := gpu(t, "h100")
	j := Job{Model: llama70b, GPUs: 64, Nodes: 8, GlobalBatch: 64, MicroBatch: 1, GPU: g}
	l := layout.Layout{GPUs: 64, DP: 2, TP: 8, PP: 4, CP: 1, SequenceParallel: true, Schedule: layout.Schedule{Kind: layout.OneFOneB},
		MicroBatches: 32, Recompute: layout.RecomputeSelective}
	st := Time(j, Candidate{Model: llama70b, Layout: l})
	const layers, M = 80 / 4, 32
	wantTP := M * 4 * layers * (2 * 7.0 / 8) * 4096 * 8192 * 2 / (450e9)
	if math.Abs(st.TP/wantTP-1) > 1e-12 {
		t.Errorf("TP %g s, want %g", st.TP, wantTP)
	}
	params := 0.0
	for i := range 4 {
		params = max(params, float64(layout.StageParams(llama70b, l, i)))
	}
	wantDP := 2 * (1.0 / 2) * 4 * params / 50e9 // 2 replicas: TP x DP = 16 GPUs span 2 nodes, on 400 Gb/s
	if math.Abs(st.DP/wantDP-1) > 1e-12 {
		t.Errorf("DP %g s, want %g", st.DP, wantDP)
	}
	if st.CP != 0 {
		t.Errorf("CP %g s without context parallelism", st.CP)
	}

	// CP 4 with TP 2: 8 GPUs, a node; K and V of the 1024 tokens a rank holds, 8 query groups of 128 split
	// over TP, passed 3 times each of CP - 1 = 3 steps (forward K, V; backward K, V and their gradients).
	l = layout.Layout{GPUs: 64, DP: 2, TP: 2, PP: 4, CP: 4, SequenceParallel: true, Schedule: layout.Schedule{Kind: layout.OneFOneB},
		MicroBatches: 32, Recompute: layout.RecomputeSelective}
	st = Time(j, Candidate{Model: llama70b, Layout: l})
	wantCP := M * 3 * 3 * (2 * 1024 * 8 * 128 / 2 * 2) * layers / 450e9
	if math.Abs(st.CP/wantCP-1) > 1e-12 {
		t.Errorf("CP %g s, want %g", st.CP, wantCP)
	}
}

// TestFitsByTheHeadroomRule: every layout the search judges fits exactly when layout.Estimate's worst stage
// is within 95% of the usable memory, the search reports as many, and both kinds occur.
func TestFitsByTheHeadroomRule(t *testing.T) {
	usable := int64(80<<30 - 512<<20)
	j := Job{Name: "llama-2-70b", Model: llama70b, GPUs: 64, Nodes: 8, GlobalBatch: 128, GPU: gpu(t, "h100"), Usable: usable, Margin: 0.05}
	limit := float64(usable) * 0.95
	fitting, rejected := 0, 0
	for _, c := range Enumerate(j) {
		stages, err := layout.Estimate(c.Model, c.Layout)
		if err != nil {
			t.Fatal(err)
		}
		worst := 0.0
		for _, s := range stages {
			worst = max(worst, s.Weights+s.Gradients+s.Optimizer+s.Activation)
		}
		p, err := Evaluate(j, c)
		if err != nil {
			t.Fatal(err)
		}
		if want := worst <= limit; p.Fits() != want {
			t.Errorf("%v %s %s: fits %v, but its worst stage holds %.0f of a %.0f limit", c.Layout, c.Layout.Schedule, c.Layout.Recompute, p.Fits(), worst, limit)
		}
		if p.Worst.Total() != worst {
			t.Errorf("%v: worst stage %v holds %v, want the largest, %v", c.Layout, p.Worst.Index, p.Worst.Total(), worst)
		}
		if p.Fits() {
			fitting++
		} else {
			rejected++
		}
	}
	if fitting == 0 || rejected == 0 {
		t.Fatalf("%d fit and %d do not: want both", fitting, rejected)
	}
	r, err := Search(j)
	if err != nil {
		t.Fatal(err)
	}
	if r.Fitting != fitting || r.Searched != fitting+rejected || len(r.Plans) != DefaultTop {
		t.Errorf("search: %d of %d fit, %d plans; want %d of %d, %d", r.Fitting, r.Searched, len(r.Plans), fitting, fitting+rejected, DefaultTop)
	}
}

// TestPlansOrderedByStepTime: the plans come fastest first, each step the sum of its parts.
func TestPlansOrderedByStepTime(t *testing.T) {
	j := Job{Model: llama70b, GPUs: 64, Nodes: 8, GlobalBatch: 256, GPU: gpu(t, "a100-80g"), Usable: 79 << 30, Margin: 0.05, Top: 200}
	r, err := Search(j)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Plans) != 200 {
		t.Fatalf("%d plans, want 200", len(r.Plans))
	}
	for i, p := range r.Plans {
		st := p.Time
		if sum := st.Compute + st.Bubble + st.TP + st.CP + st.DP + st.Optimizer; sum != st.Total() {
			t.Errorf("plan %d: parts add to %g, total %g", i, sum, st.Total())
		}
		if i > 0 && st.Total() < r.Plans[i-1].Time.Total() {
			t.Errorf("plan %d (%g s) is faster than plan %d (%g s)", i, st.Total(), i-1, r.Plans[i-1].Time.Total())
		}
	}
}

func TestCheck(t *testing.T) {
	ok := Job{Model: tiny, GPUs: 8, Nodes: 1, GlobalBatch: 8, Usable: 1 << 30}
	for name, change := range map[string]func(*Job){
		"gpus not divisible by nodes": func(j *Job) { j.GPUs, j.Nodes = 12, 8 },
		"no gpus":                     func(j *Job) { j.GPUs = 0 },
		"more nodes than gpus":        func(j *Job) { j.Nodes = 16 },
		"no batch":                    func(j *Job) { j.GlobalBatch = 0 },
		"micro-batch above the batch": func(j *Job) { j.MicroBatch = 9 },
		"no memory":                   func(j *Job) { j.Usable = 0 },
		"margin of all":               func(j *Job) { j.Margin = 1 },
		"a model without layers":      func(j *Job) { j.Model.Layers = 0 },
		"scores past int64":           func(j *Job) { j.Model.Seq, j.MicroBatch, j.GlobalBatch = 1<<24, 1<<10, 1<<10 },
		"negative tp":                 func(j *Job) { j.TP = -1 },
		"tp beyond a node":            func(j *Job) { j.GPUs, j.Nodes, j.TP = 16, 2, 16 },
		"tp x pp not dividing":        func(j *Job) { j.TP, j.PP = 2, 3 },
	} {
		j := ok
		change(&j)
		err := j.Check()
		if _, isInput := err.(*InputError); !isInput {
			t.Errorf("%s: %v, want an *InputError", name, err)
		}
	}
	if err := ok.Check(); err != nil {
		t.Errorf("a valid job: %v", err)
	}
}

// TestPinnedSearchIsTheFullOnesSubset: pinning TP, PP or CP enumerates exactly the full search's layouts of
// those sizes, and judges them alike.
func TestPinnedSearchIsTheFullOnesSubset(t *testing.T) {
	full := Job{Model: llama70b, GPUs: 64, Nodes: 8, GlobalBatch: 256, GPU: gpu(t, "h100"), Usable: 80<<30 - 512<<20,
		Margin: 0.05, Top: 1 << 20}
	all := Enumerate(full)
	for _, pin := range []struct{ tp, pp, cp int }{{8, 1, 0}, {0, 4, 0}, {2, 0, 2}, {8, 8, 1}} {
		j := full
		j.TP, j.PP, j.CP = pin.tp, pin.pp, pin.cp
		var want []Candidate
		for _, c := range all {
			l := c.Layout
			if (pin.tp == 0 || l.TP == pin.tp) && (pin.pp == 0 || l.PP == pin.pp) && (pin.cp == 0 || l.CP == pin.cp) {
				want = append(want, c)
			}
		}
		got := Enumerate(j)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("pinned %+v: %d layouts, the full search has %d of those sizes", pin, len(got), len(want))
		}
		rep, err := Search(j)
		if err != nil {
			t.Fatal(err)
		}
		fitting := 0
		for _, c := range want {
			if p, err := Evaluate(full, c); err == nil && p.Fits() {
				fitting++
			}
		}
		if rep.Searched != len(want) || rep.Fitting != fitting {
			t.Errorf("pinned %+v: %d searched, %d fit; the full search's %d, %d", pin, rep.Searched, rep.Fitting, len(want), fitting)
		}
	}
}

// BenchmarkSearch70BOn64GPUs is the search oomdbg layouts runs for Llama-2-70B on 8 nodes of 8 GPUs.
func BenchmarkSearch70BOn64GPUs(b *testing.B) {
	j := Job{Model: llama70b, GPUs: 64, Nodes: 8, GlobalBatch: 1024, GPU: gpu(b, "h100"), Usable: 80<<30 - 512<<20, Margin: 0.05}
	for b.Loop() {
		if _, err := Search(j); err != nil {
			b.Fatal(err)
		}
	}
}

// TestWriteTextGolden pins the table's form for the 4-layer model on 8 GPUs of an H100 node.
func TestWriteTextGolden(t *testing.T) {
	r, err := Search(Job{Name: "tiny", Model: tiny, GPUs: 8, Nodes: 1, GlobalBatch: 8, MicroBatch: 1, GPU: gpu(t, "h100"),
		Usable: 1 << 30, Margin: 0.05, Top: 5})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	golden.RequireEqual(t, b.Bytes())
}

// TestModelFromHF: the published configs read into the shapes their config.json files give (Llama-2-70B's
// as Megatron's test writes it; GPT-2's 4h MLP, tied); experts and BERT are refused.
func TestModelFromHF(t *testing.T) {
	for name, want := range map[string]layout.Model{
		"llama-2-70b": llama70b,
		"llama-3.1-8b": {Layers: 32, Hidden: 4096, Heads: 32, QueryGroups: 8, KVChannels: 128, FFN: 14336, Vocab: 128256, Seq: 4096,
			MicroBatch: 1, GatedMLP: true, RMSNorm: true, UntiedEmbeddings: true},
	} {
		hf, err := hfconfig.Published(name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ModelFromHF(hf, 0)
		if err != nil {
			t.Fatal(err)
		}
		if want.KVChannels == 0 {
			want.KVChannels = want.Hidden / want.Heads // config.json's head_dim, implied
		}
		if got != want {
			t.Errorf("%s: %+v, want %+v", name, got, want)
		}
	}
	for _, name := range []string{"mixtral-8x7b", "bert-base"} {
		hf, err := hfconfig.Published(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ModelFromHF(hf, 0); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
