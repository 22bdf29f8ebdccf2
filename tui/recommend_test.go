package tui

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/exp/golden"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
)

// TestRankPutsWhatFitsFirstThenTheCheapest ranks a hand-made table as the rule says: fits first; then the
// batch kept, less recomputation, the precision kept, the optimizer kept, fewer settings changed; then the
// smallest need.
func TestRankPutsWhatFitsFirstThenTheCheapest(t *testing.T) {
	base := Fixes{AMP: knob.AMPOff, Attention: knob.AttentionNaive, Checkpoint: knob.CheckpointOff, Batch: 16, Accum: 1, Optimizer: knob.AdamW, ZeroGrad: knob.ZeroGradNone}
	with := func(f func(*Fixes)) Fixes { c := base; f(&c); return c }
	rows := []Measured{
		{Fix: "as configured", Fixes: base, Needs: 64, OOM: true},
		{Fix: "flash", Fixes: with(func(c *Fixes) { c.Attention = knob.AttentionFlash }), Needs: 40, OOM: true},
		{Fix: "quarter batch", Fixes: with(func(c *Fixes) { c.Batch, c.Accum = 4, 4 }), Needs: 20},
		{Fix: "checkpoint all", Fixes: with(func(c *Fixes) { c.Checkpoint = knob.CheckpointAll }), Needs: 18},
		{Fix: "bf16 + checkpoint every 2", Fixes: with(func(c *Fixes) { c.AMP, c.Checkpoint = knob.AMPBF16, knob.CheckpointEvery(2) }), Needs: 21},
		{Fix: "bf16 + checkpoint all", Fixes: with(func(c *Fixes) { c.AMP, c.Checkpoint = knob.AMPBF16, knob.CheckpointAll }), Needs: 15},
		{Fix: "bf16 + checkpoint all + sgd", Fixes: with(func(c *Fixes) { c.AMP, c.Checkpoint, c.Optimizer = knob.AMPBF16, knob.CheckpointAll, knob.SGD }), Needs: 12},
		{Fix: "flash + checkpoint all", Fixes: with(func(c *Fixes) { c.Attention, c.Checkpoint = knob.AttentionFlash, knob.CheckpointAll }), Needs: 16},
	}
	for i := range rows { // on a card of 100 bytes for the allocator, each reserving what it needs
		rows[i].Usable, rows[i].Reserved = 100, rows[i].Needs
	}
	var got []string
	for _, r := range rank(base, rows) {
		got = append(got, r.Fix)
	}
	want := []string{"bf16 + checkpoint every 2", "checkpoint all", "flash + checkpoint all", "bf16 + checkpoint all",
		"bf16 + checkpoint all + sgd", "quarter batch", "flash"}
	if !slices.Equal(got, want) {
		t.Errorf("ranked\n %q\nwant\n %q", got, want)
	}
	// A leak's fix, when the run fits without the leak, comes first; every other fix is measured without it.
	leaky := base
	leaky.Bug = "retain-graph"
	rows[0].OOM = false
	got = got[:0]
	for _, r := range rank(leaky, rows) {
		got = append(got, r.Fix)
	}
	if got[0] != "the leak fixed" || !strings.HasSuffix(got[1], ", leak fixed") {
		t.Errorf("a leak's ranking: %q", got)
	}
}

// TestOOMPanel checks the panel against the report: PyTorch's message as triage writes it, the request,
// allocated and reserved memory then, and what the run needs as measured (the frozen sweep of the fixture).
func TestOOMPanel(t *testing.T) {
	s := fixture(t, "tiny-oom")
	m := newTestModel(t, s, 160, 48)
	out := screen(m)
	r := triage.Analyze(context.Background(), timeline.New(s), triage.Options{})
	sentence, _, _ := strings.Cut(r.OOM.Message, ". GPU")
	rows, err := playback{}.MeasureFixes(context.Background(), *workload(t, "tiny-oom"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"OUT OF MEMORY at event " + strconv.Itoa(r.OOM.Event),
		"request " + units.FormatSize(r.OOM.AllocSize) + "  " + r.OOM.Label + "  in " + r.OOM.Scope,
		sentence,
		"allocated " + units.FormatSize(r.OOM.Allocated) + " · reserved " + units.FormatSize(r.OOM.Reserved),
		"the run needs " + units.FormatSize(rows[0].Needs),
		"at " + r.OOM.Stack[0],
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the OOM panel lacks %q:\n%s", want, out)
		}
	}
	press(m, "esc")
	if out := screen(m); strings.Contains(out, "OUT OF MEMORY") || !strings.Contains(out, "blocks,") {
		t.Errorf("esc does not show the live set:\n%s", out)
	}
	press(m, "o")
	if !strings.Contains(screen(m), "OUT OF MEMORY") {
		t.Error("o does not show the panel again")
	}
}

// TestLeakAnnouncedOnOpen: a leaky snapshot says so in its title and a banner that reads as oomdbg check
// would, before any key; the Leaks pane gives the code change; enter on a suspect shows its block in the
// live set under the category the Leaks pane gave it.
func TestLeakAnnouncedOnOpen(t *testing.T) {
	s := fixture(t, "leaky")
	m := newTestModel(t, s, 160, 48)
	r := leaks.Analyze(timeline.New(s))
	lines := strings.Split(screen(m), "\n")
	if !strings.Contains(lines[0], "LEAK +"+units.FormatSize(r.LeakPerIteration)+" per iteration") {
		t.Errorf("title %q does not announce the leak", lines[0])
	}
	if want := "FAIL: " + r.Reason; !strings.HasPrefix(lines[1], want[:min(len(want), 100)]) {
		t.Errorf("banner %q, want check's %q", lines[1], want)
	}
	press(m, "4")
	if out := screen(m); !strings.Contains(out, "loss_history.append(loss.item()), not loss_history.append(loss)") {
		t.Errorf("the Leaks pane does not give the code change:\n%s", out)
	}
	sus := m.leaks.res.Suspects[0]
	press(m, "enter")
	if b := m.live.shown[m.live.selected]; b.Alloc != sus.Example.Alloc || b.Category != sus.Category {
		t.Errorf("enter shows block %d (%s), the suspect's is %d (%s)", b.Alloc, b.Category, sus.Example.Alloc, sus.Category)
	}
	// A snapshot without a leak has no banner.
	if out := screen(newTestModel(t, fixture(t, "leaky-fixed"), 160, 48)); strings.Contains(out, "FAIL") || strings.Contains(out, "LEAK") {
		t.Errorf("a snapshot without a leak is announced as one:\n%s", out)
	}
}

// TestApplyingAMeasuredFixRunsIt: the settings the pane chooses for a measured fix are the fix's, so that
// the re-run is the run that was measured.
func TestApplyingAMeasuredFixRunsIt(t *testing.T) {
	for _, name := range []string{"tiny-oom", "leaky"} {
		w := workload(t, name)
		rows, err := playback{}.MeasureFixes(context.Background(), *w)
		if err != nil {
			t.Fatal(err)
		}
		p := newFixesPane(w, playback{}, 0)
		for _, r := range rows {
			p.choose(r.Fixes)
			if got := p.config().Fixes; got != r.Fixes {
				t.Errorf("%s, %s: the pane runs\n%+v\nthe fix measured\n%+v", name, r.Fix, got, r.Fixes)
			}
		}
	}
}

// defaultRun is a measurement of the default workload's fixes after README.md's table (gpt2-medium, batch
// 16, on 24 GiB less the 512 MiB CUDA context: 23.50 GiB for the allocator), with step times in the order
// the planner estimates them: "bf16 + flash + checkpoint every 2nd block" is the fastest that runs, and
// reserves 23.49 GiB, 10 MiB short of the card.
func defaultRun() (Fixes, []Measured) {
	const usable = 24<<30 - 512<<20
	base := Fixes{AMP: knob.AMPOff, Attention: knob.AttentionNaive, Checkpoint: knob.CheckpointOff, Batch: 16, Accum: 1, Optimizer: knob.AdamW, ZeroGrad: knob.ZeroGradNone}
	with := func(amp knob.AMP, att knob.Attention, c knob.Checkpoint) Fixes {
		f := base
		f.AMP, f.Attention, f.Checkpoint = amp, att, c
		return f
	}
	gib := func(g float64) int64 { return int64(g * (1 << 30)) }
	return base, []Measured{
		{Fix: "as configured", Fixes: base, Needs: gib(64.49), Reserved: gib(22.88), OOM: true, OOMPhase: "forward", Usable: usable, StepTime: 0.30},
		{Fix: "bf16 + flash + checkpoint every 2nd block", Fixes: with(knob.AMPBF16, knob.AttentionFlash, knob.CheckpointEvery(2)),
			Needs: gib(21.16), Reserved: usable - 10<<20, Usable: usable, StepTime: 0.141},
		{Fix: "bf16 + flash + checkpoint every block", Fixes: with(knob.AMPBF16, knob.AttentionFlash, knob.CheckpointAll),
			Needs: gib(14.86), Reserved: gib(19.19), Usable: usable, StepTime: 0.160},
		{Fix: "checkpoint every block", Fixes: with(knob.AMPOff, knob.AttentionNaive, knob.CheckpointAll),
			Needs: gib(17.96), Reserved: gib(21.21), Usable: usable, StepTime: 0.410},
	}
}

// TestBestFixLeavesTheMargin: the best fix is the fastest of those that fit by the headroom rule. The
// fastest that runs leaves 10 MiB of 23.50 GiB and would fail on a real card: it is tight, ranked after
// those that fit, and a applies bf16 + flash + checkpointing every block, which leaves 4.31 GiB.
func TestBestFixLeavesTheMargin(t *testing.T) {
	base, rows := defaultRun()
	r := recommendation{base: &rows[0], measured: rank(base, rows)}
	r.withPlans(base)
	b := r.best()
	if b == nil || b.Fix != "bf16 + flash + checkpoint every block" {
		t.Fatalf("best %+v, want bf16 + flash + checkpoint every block", b)
	}
	if left := b.Usable - b.Reserved; units.FormatSize(left) != "4.31 GiB" {
		t.Errorf("the best leaves %s of the card", units.FormatSize(left))
	}
	var got []string
	for _, m := range r.ranked {
		got = append(got, m.Fix+": "+m.verdict().Word)
	}
	want := []string{"bf16 + flash + checkpoint every block: fits", "checkpoint every block: fits",
		"bf16 + flash + checkpoint every 2nd block: tight"}
	if !slices.Equal(got, want) {
		t.Errorf("ranked %q, want %q", got, want)
	}
	p := fixesPane{base: &Workload{Fixes: base}, rec: r}
	view := ansi.Strip(strings.Join(p.rankedView(DefaultStyles(colorprofile.Ascii), 80, 3), "\n"))
	golden.RequireEqual(t, []byte(view)) // the head of the fixes pane at 80 columns
	for _, s := range []string{"best (fits, 5% margin): bf16 + flash + checkpoint every block", "fits if ≤ 22.32 GiB", "tight, 10.00 MiB left"} {
		if !strings.Contains(view, s) {
			t.Errorf("the pane at 80 columns does not say %q:\n%s", s, view)
		}
	}
}

// TestOOMPanelWeighsWhatTheRunNeeds: tiny-oom's request met free blocks that, together with the device's
// free memory, could have held it: a fragmentation OOM at that moment (triage.OOMKind). Once the run is
// measured to need more than the 36 MiB its allocator can use, the panel calls it a capacity OOM, as the
// report does; a run that needs less stays a fragmentation one.
func TestOOMPanelWeighsWhatTheRunNeeds(t *testing.T) {
	ix := newIndex(fixture(t, "tiny-oom"))
	var p oomPanel
	if o := p.explain(ix); o.Kind != triage.OOMFragmentation || ix.usable != 36<<20 {
		t.Fatalf("tiny-oom's OOM is %s on %d usable bytes", o.Kind, ix.usable)
	}
	for _, c := range []struct {
		needs int64
		kind  string
	}{{0, "fragmentation"}, {30 << 20, "fragmentation"}, {64 << 20, "capacity"}} {
		view := ansi.Strip(p.view(DefaultStyles(colorprofile.Ascii), ix, "", c.needs, 120, 30))
		if first := strings.SplitN(view, "\n", 2)[0]; !strings.HasSuffix(first, "("+c.kind+")") {
			t.Errorf("needs %d: %q, want %s", c.needs, first, c.kind)
		}
	}
	if p.oom.Kind != triage.OOMFragmentation {
		t.Error("weighing changed the panel's explanation itself")
	}
}
