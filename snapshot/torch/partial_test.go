package torch_test

import (
	"bytes"
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/allocator/replay"
	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/export"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/snapshot/torch"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// The traces users bring are cut short: the OOM observer dumps one mid-step, a notebook records one step.
// These tests record oomdbg's own workloads cut where users meet them, export each to PyTorch's format,
// strip what PyTorch does not record (torchtest.StripToPyTorch), import it again, and score what the import
// inferred against the recording's own tags, byte-weighted, at the OOM (or the peak where the run did not
// run out of memory). The recording's tags are the runtime's knowledge of each tensor, which the importer
// never sees.

// partialModel is one model of the table.
type partialModel struct {
	name string
	cfg  func() train.Config
}

// partialModels are a GPT-2, a Llama and a QLoRA fine-tune of the Llama, at shapes where a cut in each
// phase can happen.
var partialModels = []partialModel{
	{"gpt2", func() train.Config {
		c := preset("gpt2-medium")
		c.Batch, c.Seq = 2, 512
		return c
	}},
	{"llama", func() train.Config {
		c := preset("llama-3.2-1b")
		c.Batch, c.Seq = 1, 512
		return c
	}},
	{"qlora", func() train.Config {
		c := preset("llama-3.2-1b")
		c.Batch, c.Seq = 1, 128
		c.LoRA, c.QLoRA, c.LoRATargets = 64, true, train.AllLoRATargets
		return c
	}},
}

func preset(name string) train.Config {
	c, err := train.PresetConfig(name)
	if err != nil {
		panic(err)
	}
	c.Device = "meta"
	return c
}

// partialCut is where a trace ends.
type partialCut struct {
	name  string
	steps int
	oom   snapshot.Phase // the phase of iteration 0 the run runs out of memory in; PhaseNone: none
}

var partialCuts = []partialCut{
	{"oom in forward", 1, snapshot.PhaseForward},
	{"oom in backward", 1, snapshot.PhaseBackward},
	{"oom in optimizer", 1, snapshot.PhaseOptimizer},
	{"one step", 1, snapshot.PhaseNone},
	{"two steps", 2, snapshot.PhaseNone},
}

// capacityFor returns the device memory at which cfg's first iteration runs out of memory in phase p,
// found by replaying a recording on a device too large to run out through the allocator model at
// capacities bisected between the most allocated before p (too little) and the most reserved up to p's end
// (enough): the run is deterministic, so it fails at the request the replay fails. ok is false where no
// capacity fails in p (the allocator serves all of p from what it cached).
func capacityFor(t *testing.T, cfg train.Config, p snapshot.Phase) (uint64, bool) {
	t.Helper()
	cfg.Steps, cfg.GPUMemory = 1, 1<<40
	rec := leakstest.Record(t, cfg)
	tl := timeline.New(rec)
	var lo, hi int64
	in := false
	for i := range tl.Len() {
		e := rec.Events.At(i)
		switch {
		case e.Iteration == 0 && e.Phase == p:
			in = true
			hi = max(hi, tl.Reserved(i))
		case !in:
			lo = max(lo, tl.Allocated(i))
			hi = max(hi, tl.Reserved(i))
		}
	}
	ac, _ := replay.RecordedSettings(rec)
	// failsIn is the phase the replay at capacity c fails in, and whether it fails.
	failsIn := func(c int64) (snapshot.Phase, int32, bool) {
		out, err := replay.Simulate(rec, ac, uint64(c))
		if err != nil {
			t.Fatal(err)
		}
		if o := out[0].Outcome.OOM; o != nil {
			e := rec.Events.At(int(o.Seq))
			return e.Phase, e.Iteration, true
		}
		return snapshot.PhaseNone, 0, false
	}
	for range 40 {
		mid := lo + (hi-lo)/2
		if hi-lo < 1<<20 {
			break
		}
		ph, it, fails := failsIn(mid)
		switch {
		case fails && it == 0 && ph == p:
			return cfg.ContextReserve + uint64(mid), true
		case fails && (it < 0 || it == 0 && phaseOrder(ph) < phaseOrder(p)):
			lo = mid
		default:
			hi = mid
		}
	}
	return 0, false
}

// phaseOrder ranks the phases of an iteration in the order they run.
func phaseOrder(p snapshot.Phase) int {
	return slices.Index([]snapshot.Phase{snapshot.PhaseSetup, snapshot.PhaseData, snapshot.PhaseForward,
		snapshot.PhaseBackward, snapshot.PhaseOptimizer, snapshot.PhaseZeroGrad}, p)
}

// partialScore is how much of the memory alive at the OOM (or the peak) the import categorised as the
// recording did.
type partialScore struct {
	at            string // "oom" or "peak"
	live          int64
	right         int64
	unknown       int64
	wrong         map[[2]snapshot.Category]int64 // recorded, inferred
	iterations    string
	oomIteration  int32
	oomPhase      snapshot.Phase
	wantIteration int32
	wantPhase     snapshot.Phase
}

func (s partialScore) share() float64        { return float64(s.right) / float64(s.live) }
func (s partialScore) unknownShare() float64 { return float64(s.unknown) / float64(s.live) }

// scorePartial records cfg, exports, strips and imports it, and scores the import.
func scorePartial(t *testing.T, cfg train.Config) partialScore {
	t.Helper()
	rec := leakstest.Record(t, cfg)
	var buf bytes.Buffer
	if err := export.TorchJSON(&buf, timeline.New(rec)); err != nil {
		t.Fatal(err)
	}
	imp, err := torch.Import(torchtest.StripToPyTorch(t, buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	rtl, itl := timeline.New(rec), timeline.New(imp)
	ra, ia := oomOrPeak(rec, rtl), oomOrPeak(imp, itl)
	sc := partialScore{at: "peak", wrong: map[[2]snapshot.Category]int64{}}
	if rec.Events.At(ra).Action == snapshot.ActionOOM {
		sc.at = "oom"
	}
	o, _ := torch.OriginOf(imp)
	sc.iterations = o.Iterations
	re, ie := rec.Events.At(ra), imp.Events.At(ia)
	sc.wantIteration, sc.wantPhase = re.Iteration, re.Phase
	sc.oomIteration, sc.oomPhase = ie.Iteration, ie.Phase
	rlive, ilive := rtl.LiveAt(ra, nil), itl.LiveAt(ia, nil)
	if len(rlive) != len(ilive) {
		t.Fatalf("%d blocks live at the import's %s, %d at the recording's", len(ilive), sc.at, len(rlive))
	}
	for k := range rlive {
		r, i := rlive[k], ilive[k]
		if r.Size != i.Size {
			t.Fatalf("live block %d: %d B imported, %d B recorded", k, i.Size, r.Size)
		}
		sc.live += r.Size
		switch {
		case i.Category == r.Category:
			sc.right += r.Size
		default:
			sc.wrong[[2]snapshot.Category{r.Category, i.Category}] += r.Size
		}
		if i.Category == snapshot.CategoryUnknown {
			sc.unknown += r.Size
		}
	}
	return sc
}

// oomOrPeak returns the OOM event, else the peak of allocated memory.
func oomOrPeak(s *snapshot.Snapshot, tl *timeline.Timeline) int {
	for i := range s.Events.Len() {
		if s.Events.At(i).Action == snapshot.ActionOOM {
			return i
		}
	}
	return tl.Peak(timeline.Allocated).Seq
}

func (s partialScore) String() string {
	var w []string
	for k, b := range s.wrong {
		w = append(w, fmt.Sprintf("%s as %s %.1f%%", k[0], k[1], 100*float64(b)/float64(s.live)))
	}
	slices.SortFunc(w, func(a, b string) int { return cmp.Compare(a, b) })
	return fmt.Sprintf("%s: %.1f%% right, %.1f%% unknown of %d B (iteration %d %s, recorded %d %s; iterations %s) %s",
		s.at, 100*s.share(), 100*s.unknownShare(), s.live, s.oomIteration, s.oomPhase, s.wantIteration, s.wantPhase,
		s.iterations, strings.Join(w, ", "))
}

// TestCategoriesOfCutTraces: at every cut a user meets (an OOM in the forward, the backward and the
// optimizer step of the first iteration; one step; two steps), for a GPT-2, a Llama and a QLoRA fine-tune,
// at least 95% of the bytes alive at the OOM (or the peak) are in the category the recording gave them, at
// most 5% are unknown, and the OOM is in the iteration and phase it was recorded in. -v prints the table.
func TestCategoriesOfCutTraces(t *testing.T) {
	table := map[string]map[string]string{}
	for _, m := range partialModels {
		table[m.name] = map[string]string{}
		for _, c := range partialCuts {
			t.Run(m.name+"/"+c.name, func(t *testing.T) {
				cfg := m.cfg()
				cfg.Steps, cfg.GPUMemory = c.steps, 1<<40
				if c.oom != snapshot.PhaseNone {
					capacity, ok := capacityFor(t, cfg, c.oom)
					if !ok {
						t.Fatalf("no capacity runs out of memory in %s", c.oom)
					}
					cfg.GPUMemory = capacity
				}
				sc := scorePartial(t, cfg)
				t.Log(sc)
				table[m.name][c.name] = fmt.Sprintf("%.1f%% (%.1f%% unknown)", 100*sc.share(), 100*sc.unknownShare())
				if c.oom != snapshot.PhaseNone && (sc.at != "oom" || sc.wantPhase != c.oom || sc.wantIteration != 0) {
					t.Fatalf("the recording did not run out of memory in iteration 0's %s: %s at iteration %d %s", c.oom, sc.at, sc.wantIteration, sc.wantPhase)
				}
				if sc.share() < 0.95 || sc.unknownShare() > 0.05 {
					t.Errorf("%.1f%% right (want at least 95%%), %.1f%% unknown (want at most 5%%)", 100*sc.share(), 100*sc.unknownShare())
				}
				if sc.oomIteration != sc.wantIteration || sc.oomPhase != sc.wantPhase {
					t.Errorf("the %s is in iteration %d %s, recorded in %d %s", sc.at, sc.oomIteration, sc.oomPhase, sc.wantIteration, sc.wantPhase)
				}
			})
		}
	}
	var b strings.Builder
	b.WriteString("\n| cut |")
	for _, m := range partialModels {
		b.WriteString(" " + m.name + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(partialModels)) + "\n")
	for _, c := range partialCuts {
		b.WriteString("| " + c.name + " |")
		for _, m := range partialModels {
			b.WriteString(" " + table[m.name][c.name] + " |")
		}
		b.WriteString("\n")
	}
	t.Log(b.String())
}

// TestStrippedDefaultRun: oomdbg's default run (gpt2-medium, batch 16 on 24 GiB, out of memory in its first
// forward), exported and stripped as PyTorch records it, shows at the OOM what the recording shows: the
// bytes of every category (all but the position indices' 8 KiB, which the runtime tags as input and a
// trace cannot tell from an activation), and every block and the request scoped to the module and layer
// the recording's module path names (transformer.h.<layer>.attn, .mlp, or the block itself; its torch.nn
// leaves, c_attn or ln_1, are the model module's that called them, as frames show).
func TestStrippedDefaultRun(t *testing.T) {
	cfg := preset("gpt2-medium")
	cfg.Steps = 1
	rec := leakstest.Record(t, cfg)
	var buf bytes.Buffer
	if err := export.TorchJSON(&buf, timeline.New(rec)); err != nil {
		t.Fatal(err)
	}
	imp, err := torch.Import(torchtest.StripToPyTorch(t, buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	rtl, itl := timeline.New(rec), timeline.New(imp)
	ra, ia := oomOrPeak(rec, rtl), oomOrPeak(imp, itl)
	if rec.Events.At(ra).Action != snapshot.ActionOOM {
		t.Fatal("the default run did not run out of memory")
	}
	path := regexp.MustCompile(`^transformer\.h\.(\d+)(?:\.(attn|mlp))?`)
	inferred := regexp.MustCompile(`^layer (\d+): nn\.\(\*(\w+)\)\.Forward gpt\.go:\d+$`)
	class := map[string]string{"attn": "CausalSelfAttention", "mlp": "GPTMLP", "": "Block"}
	match := func(native, got string) bool {
		m := path.FindStringSubmatch(native)
		if m == nil {
			return true // not in a block: the embeddings, the head, or a weight
		}
		g := inferred.FindStringSubmatch(got)
		return g != nil && g[1] == m[1] && g[2] == class[m[2]]
	}
	if re, ie := rec.Events.At(ra), imp.Events.At(ia); !match(rec.String(re.Scope), imp.String(ie.Scope)) || ie.Iteration != 0 || ie.Phase != snapshot.PhaseForward {
		t.Errorf("the OOM in iteration %d, %s, in %q; recorded in %d, %s, in %q", ie.Iteration, ie.Phase, imp.String(ie.Scope),
			re.Iteration, re.Phase, rec.String(re.Scope))
	}
	rlive, ilive := rtl.LiveAt(ra, nil), itl.LiveAt(ia, nil)
	if len(rlive) != len(ilive) {
		t.Fatalf("%d blocks live at the import's OOM, %d at the recording's", len(ilive), len(rlive))
	}
	var live, wrong int64
	for k := range rlive {
		r, i := rlive[k], ilive[k]
		live += r.Size
		if r.Category != i.Category {
			wrong += r.Size
			t.Logf("%s (%d B): %s, recorded %s", rec.String(r.Label), r.Size, i.Category, r.Category)
		}
		if r.Phase == snapshot.PhaseForward && !match(rec.String(r.Scope), imp.String(i.Scope)) {
			t.Errorf("%s (%d B) scoped to %q; recorded in %q", rec.String(r.Label), r.Size, imp.String(i.Scope), rec.String(r.Scope))
		}
	}
	if wrong > 8<<10 {
		t.Errorf("%d of %d B live at the OOM in another category than recorded", wrong, live)
	}
}
