package layout

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

// TestLayerActivationsTable2 checks LayerActivations against Table 2 of Korthikanti et al. 2022, each row's
// equation written out here, for shapes the equations are written for (bf16, multi-head attention, a 4h
// MLP): GPT-3 175B and MT-NLG 530B (the paper's Table 3), and the small GPT.
func TestLayerActivationsTable2(t *testing.T) {
	mtnlg := Model{Layers: 105, Hidden: 20480, Heads: 128, FFN: 4 * 20480, Vocab: 51200, Seq: 2048, MicroBatch: 1}
	for _, m := range []Model{gpt3, mtnlg, gpt1b} {
		s, b, h, a := float64(m.Seq), float64(m.MicroBatch), float64(m.Hidden), float64(m.Heads)
		sbh := s * b * h
		for _, tp := range []int{1, 2, 4, 8} {
			tt := float64(tp)
			rows := []struct {
				name string
				sp   bool
				r    Recompute
				want float64
			}{
				{"tensor parallel (baseline)", false, RecomputeNone, sbh * (10 + 24/tt + 5*a*s/(h*tt))},
				{"tensor + selective", false, RecomputeSelective, sbh * (10 + 24/tt)},
				{"tensor + sequence", true, RecomputeNone, sbh / tt * (34 + 5*a*s/h)},
				{"tensor + sequence + selective", true, RecomputeSelective, sbh / tt * 34},
				{"full recompute", false, RecomputeFull, 2 * sbh},
			}
			for _, row := range rows {
				got := LayerActivations(m, tp, row.sp, 1, row.r)
				if math.Abs(got-row.want) > 1e-9*row.want {
					t.Errorf("h=%d t=%d %s: %v bytes, Table 2 gives %v", m.Hidden, tp, row.name, got, row.want)
				}
			}
		}
		// No parallelism: sbh(34 + 5as/h), and 34sbh with selective recompute.
		if got, want := LayerActivations(m, 1, false, 1, RecomputeNone), sbh*(34+5*a*s/h); got != want {
			t.Errorf("h=%d no parallelism: %v, want %v", m.Hidden, got, want)
		}
	}
}

// TestEstimateReducesToMegatron checks that where Megatron-LM's assumptions hold (sequence parallelism,
// selective recompute, multi-head attention, a 4h GeLU MLP, no CP) Estimate's first stage is Megatron's
// figure, save the two simplifications Megatron's doc comment names, worked out here on their own: the
// final norm Megatron spreads over the stages, and the int64 token ids, which Megatron divides by TP.
func TestEstimateReducesToMegatron(t *testing.T) {
	for _, c := range megatronCases() {
		m, l := c.model, c.l
		if !l.SequenceParallel || l.TP == 1 || l.Recompute != RecomputeSelective || m.GatedMLP || m.QueryGroups != 0 {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			meg, err := Megatron(m, l)
			if err != nil {
				t.Fatal(err)
			}
			stages, err := Estimate(m, l)
			if err != nil {
				t.Fatal(err)
			}
			first := stages[0]
			bytesPerParam := 18.0
			if l.DistributedOptimizer {
				bytesPerParam = 6 + 12/float64(l.DP)
			}
			wantWeights := meg.WeightAndOptimizer
			if l.PP > 1 {
				wantWeights -= float64(2*m.Hidden) / float64(l.PP) * bytesPerParam // LayerNorm's weight and bias
			}
			inFlight := float64(min(l.PP, l.MicroBatches))
			if l.Schedule.Kind == Interleaved {
				inFlight = float64(l.PP) * (1 + float64(l.PP-1)/float64(l.PP*l.Schedule.Virtual))
			}
			tokenIDs := float64(8*m.Seq*m.MicroBatch) * inFlight
			wantActivation := meg.Activation + tokenIDs*(1-1/float64(l.TP))
			got := first.Weights + first.Gradients + first.Optimizer
			if math.Abs(got-wantWeights) > 1e-12*wantWeights || math.Abs(first.Activation-wantActivation) > 1e-12*wantActivation {
				t.Errorf("first stage: weights %v, activations %v; from Megatron's %v and %v, want %v and %v",
					got, first.Activation, meg.WeightAndOptimizer, meg.Activation, wantWeights, wantActivation)
			}
		})
	}
}

// TestStages checks the stages' shares: every stage's layers, the in-flight micro-batches of each
// schedule (1F1B: PP - i; GPipe: M; interleaved's first stage Megatron's PP(1 + (PP-1)/(PP V))), and that
// the embedding sits on the first stage and the head on the last.
func TestStages(t *testing.T) {
	l := Layout{GPUs: 64, DP: 2, TP: 8, PP: 4, CP: 1, SequenceParallel: true, MicroBatches: 32,
		DistributedOptimizer: true, Recompute: RecomputeSelective}
	for _, tc := range []struct {
		schedule Schedule
		inFlight []float64
	}{
		{Schedule{Kind: OneFOneB}, []float64{4, 3, 2, 1}},
		{Schedule{Kind: GPipe}, []float64{32, 32, 32, 32}},
		// Chunks in flight 2(PP-i-1) + (V-1)PP + 1 = 11, 9, 7, 5 of V = 2; the first is 4(1 + 3/8) = 5.5.
		{Schedule{Kind: Interleaved, Virtual: 2}, []float64{5.5, 4.5, 3.5, 2.5}},
	} {
		l.Schedule = tc.schedule
		stages, err := Estimate(llama70b, l)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range stages {
			if s.InFlight != tc.inFlight[i] || s.Layers != 20 {
				t.Errorf("%s stage %d: %d layers, %v in flight; want 20 and %v", tc.schedule, i, s.Layers, s.InFlight, tc.inFlight[i])
			}
			if (s.Embedding > 0) != (i == 0) || (s.Output > 0) != (i == 3) {
				t.Errorf("%s stage %d: embedding %v, output %v", tc.schedule, i, s.Embedding, s.Output)
			}
		}
	}
	// Llama-2-70B's parameters, counted by hand from its config.json: per layer Q and O 8192x8192, K and V
	// 8192x1024, three 8192x28672 MLP matrices and two RMSNorm weights; 32000 x 8192 embeddings, untied.
	perLayer := int64(2*8192*8192+2*8192*1024+3*8192*28672) / 8
	norms := int64(2 * 8192)
	embedding := int64(32768 * 8192 / 8) // the vocabulary padded to a multiple of 128*8
	want := []int64{20*(perLayer+norms) + embedding, 20 * (perLayer + norms), 20 * (perLayer + norms), 20*(perLayer+norms) + embedding + 8192}
	for i := range 4 {
		if got := StageParams(llama70b, l, i); got != want[i] {
			t.Errorf("stage %d holds %d parameters, want %d", i, got, want[i])
		}
	}
	// Full recompute keeps 2sbh/t per layer and rebuilds one layer at a time.
	l.Recompute, l.Schedule = RecomputeFull, Schedule{}
	stages, _ := Estimate(llama70b, l)
	sbh := float64(4096 * 8192)
	if got, want := stages[1].Layer, 3*20*2*sbh/8; got != want {
		t.Errorf("full recompute, stage 1: %v bytes of layer inputs, want %v", got, want)
	}
	if stages[1].Workspace != LayerActivations(llama70b, 8, true, 1, RecomputeNone) {
		t.Errorf("full recompute's workspace is %v", stages[1].Workspace)
	}
}

// TestContextParallel checks that CP divides the activations' sequence and shards the distributed
// optimizer over DP*CP, and leaves the weights whole.
func TestContextParallel(t *testing.T) {
	base := Layout{GPUs: 16, DP: 2, TP: 8, PP: 1, CP: 1, SequenceParallel: true, MicroBatches: 1,
		DistributedOptimizer: true, Recompute: RecomputeSelective}
	cp := base
	cp.GPUs, cp.CP = 32, 2
	a, err := Estimate(llama7b, base)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Estimate(llama7b, cp)
	if err != nil {
		t.Fatal(err)
	}
	if a[0].Weights != b[0].Weights || a[0].Optimizer != 2*b[0].Optimizer || a[0].Activation != 2*b[0].Activation {
		t.Errorf("CP=2 against CP=1: weights %v/%v, optimizer %v/%v, activations %v/%v",
			b[0].Weights, a[0].Weights, b[0].Optimizer, a[0].Optimizer, b[0].Activation, a[0].Activation)
	}
}

func TestValidate(t *testing.T) {
	ok := Layout{GPUs: 512, DP: 8, TP: 8, PP: 8, CP: 1, MicroBatches: 8}
	for name, tc := range map[string]struct {
		m    Model
		l    func(*Layout)
		want string
	}{
		"product":       {gpt3, func(l *Layout) { l.GPUs = 256 }, "layout dp=8 tp=8 pp=8 cp=1: DP*TP*PP*CP = 512 but the job has 256 GPUs; choose sizes whose product is 256"},
		"heads":         {gpt3, func(l *Layout) { l.TP, l.DP = 64, 1 }, "layout dp=1 tp=64 pp=8 cp=1: 96 attention heads do not split over 64 TP ranks"},
		"query groups":  {llama70b, func(l *Layout) { l.TP, l.PP, l.DP = 16, 4, 8 }, "layout dp=8 tp=16 pp=4 cp=1: 8 query groups do not split over 16 TP ranks"},
		"layers":        {gpt3, func(l *Layout) { l.PP, l.DP = 64, 1 }, "layout dp=1 tp=8 pp=64 cp=1: 96 layers do not split over 64 pipeline stages"},
		"chunks":        {gpt3, func(l *Layout) { l.Schedule = Schedule{Kind: Interleaved, Virtual: 5} }, "layout dp=8 tp=8 pp=8 cp=1: 96 layers do not split into 8 stages of 5 model chunks"},
		"micro-batches": {gpt3, func(l *Layout) { l.MicroBatches = 0 }, "layout dp=8 tp=8 pp=8 cp=1: 0 micro-batches; a step needs at least 1"},
		"zero size":     {gpt3, func(l *Layout) { l.CP = 0 }, "layout dp=8 tp=8 pp=8 cp=0: every size must be at least 1"},
		"model":         {Model{}, func(*Layout) {}, "layout dp=8 tp=8 pp=8 cp=1: model layers is 0; it must be positive"},
	} {
		t.Run(name, func(t *testing.T) {
			l := ok
			tc.l(&l)
			_, err := Estimate(tc.m, l)
			var le *LayoutError
			if !errors.As(err, &le) || err.Error() != tc.want {
				t.Errorf("got %v, want *LayoutError %q", err, tc.want)
			}
		})
	}
	if err := ok.Validate(gpt3); err != nil {
		t.Errorf("GPT-3 on 512 GPUs: %v", err)
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]string{"gpipe": "gpipe", "1f1b": "1f1b", "interleaved:2": "interleaved:2", "interleaved:1": "error", "interleaved": "error", "zb": "error"} {
		s, err := ParseSchedule(in)
		got := s.String()
		if err != nil {
			got = "error"
		}
		if got != want {
			t.Errorf("ParseSchedule(%q) = %s (%v), want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"none", "selective", "full"} {
		if r, err := ParseRecompute(in); err != nil || r.String() != in {
			t.Errorf("ParseRecompute(%q) = %v, %v", in, r, err)
		}
	}
	if _, err := ParseRecompute("block"); err == nil {
		t.Error("ParseRecompute(block) accepted it")
	}
}

// ExampleEstimate prints the per-rank memory of GPT-3 175B on 64 nodes of 8 GPUs.
func ExampleEstimate() {
	stages, err := Estimate(gpt3, Layout{GPUs: 512, DP: 8, TP: 8, PP: 8, CP: 1, SequenceParallel: true,
		MicroBatches: 64, DistributedOptimizer: true, Recompute: RecomputeSelective})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range stages {
		fmt.Printf("stage %d: %.2f GiB of weights, gradients and optimizer states, %.2f GiB of activations (%v micro-batches)\n",
			s.Index, (s.Weights+s.Gradients+s.Optimizer)/(1<<30), s.Activation/(1<<30), s.InFlight)
	}
	// Output:
	// stage 0: 19.54 GiB of weights, gradients and optimizer states, 9.59 GiB of activations (8 micro-batches)
	// stage 1: 18.99 GiB of weights, gradients and optimizer states, 8.37 GiB of activations (7 micro-batches)
	// stage 2: 18.99 GiB of weights, gradients and optimizer states, 7.17 GiB of activations (6 micro-batches)
	// stage 3: 18.99 GiB of weights, gradients and optimizer states, 5.98 GiB of activations (5 micro-batches)
	// stage 4: 18.99 GiB of weights, gradients and optimizer states, 4.78 GiB of activations (4 micro-batches)
	// stage 5: 18.99 GiB of weights, gradients and optimizer states, 3.59 GiB of activations (3 micro-batches)
	// stage 6: 18.99 GiB of weights, gradients and optimizer states, 2.39 GiB of activations (2 micro-batches)
	// stage 7: 19.54 GiB of weights, gradients and optimizer states, 1.26 GiB of activations (1 micro-batches)
}
