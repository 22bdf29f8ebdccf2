package tui

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
	"charm.land/lipgloss/v2/table"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// fixesPane changes the workload's fixes and re-runs it on the meta device in the background: the re-run's
// curve is drawn over the timeline, and a table compares the peaks, whether it fits, the bytes by category at
// each peak, and what the fix costs in recomputation.
type fixesPane struct {
	run      Runner
	base     *Workload // the workload as recorded; nil when the snapshot is not oomdbg's own
	choice   [numFixRows]int
	selected int
	before   *runSummary
	after    *runSummary
	afterIx  *index
	running  context.CancelFunc
	progress *snapshot.Snapshot // the re-run as it streams in
	stream   *stream
	budget   int64 // the memory the re-run's events may take (the view's memory budget)
	err      error
	fit      fitList    // the plans that fit (fitplans.go)
	trace    traceFixes // the pane on a snapshot that is not oomdbg's own (tracefixes.go)

	rec         recommendation
	beforeLeak  *leaks.Result // the loaded run's leak analysis
	afterNeeds  int64         // what the re-run needs, measured; 0 until known
	focusRanked bool          // ↑↓ move in the ranked fixes rather than the settings
}

// The rows of the pane, each a setting with its choices.
const (
	rowAMP = iota
	rowWeights
	rowAdapter
	rowAttention
	rowCheckpoint
	rowAccum
	rowOptimizer
	rowZeroGrad
	rowBug
	rowParallel // a data-parallel rank's rows, shown for one only
	rowOffload
	numFixRows
)

var fixRowNames = [numFixRows]string{"mixed precision", "weights", "adapter", "attention", "checkpointing", "batch x accumulation", "optimizer", "zero_grad", "leak bug", "data parallel", "offload"}

// parallelChoices are the data-parallel row's choices: DDP, DeepSpeed's stages and FSDP's strategies.
var parallelChoices = []string{"ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op", "hsdp"}

// rows lists the rows the pane shows: the data-parallel ones for a rank of a job only.
func (p *fixesPane) rows() []int {
	n := rowParallel
	if p.base.GPUs > 1 {
		n = numFixRows
	}
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// adapterRank is the rank of the LoRA and QLoRA choices, on allProjections, as oomdbg fixes chooses them.
const adapterRank = 16

// allProjections are the LoRA targets of the adapter choices: every linear layer of a decoder layer, as
// QLoRA's recipe adapts them (--lora-targets).
const allProjections = "q,k,v,o,gate,up,down"

// optimizerChoices are the optimizer row's choices: torch.optim's (AdamW in its three implementations)
// and bitsandbytes'.
var optimizerChoices = []string{string(knob.AdamW), string(knob.AdamW) + " " + string(knob.Fused),
	string(knob.AdamW) + " " + string(knob.ForLoop), string(knob.Adam), string(knob.Momentum), string(knob.SGD),
	string(knob.AdamW8bit), string(knob.PagedAdamW8bit), string(knob.PagedAdamW)}

// words names settings as their rows show them.
func words[T fmt.Stringer](vs ...T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.String()
	}
	return out
}

// choices lists a row's choices for the base configuration; the base's own is always one of them.
func (p *fixesPane) choices(row int) []string {
	opts := p.offered(row)
	if cur := p.current(row); indexOf(opts, cur) < 0 {
		opts = append([]string{cur}, opts...)
	}
	return opts
}

// offered lists the choices a row offers for the base's model.
func (p *fixesPane) offered(row int) []string {
	c, llama := p.base.Fixes, p.base.Llama
	switch row {
	case rowAMP:
		return words(knob.AMPOff, knob.AMPBF16, knob.AMPFP16)
	case rowWeights:
		if !llama {
			return nil
		}
		return []string{"f32", "bf16", "fp16"}
	case rowAdapter:
		if !llama {
			return nil
		}
		return []string{"none", fmt.Sprintf("lora %d", adapterRank), fmt.Sprintf("qlora %d", adapterRank)}
	case rowAttention:
		if !p.base.GPT && !llama {
			return nil
		}
		return words(knob.AttentionNaive, knob.AttentionFlash)
	case rowCheckpoint:
		switch {
		case p.base.GPT:
			return words(knob.CheckpointOff, knob.CheckpointAttention, knob.CheckpointEvery(2), knob.CheckpointAll)
		case llama:
			return words(knob.CheckpointOff, knob.CheckpointEvery(2), knob.CheckpointAll)
		}
		return nil
	case rowAccum:
		var out []string
		for k := 1; k <= 8 && c.Batch*c.Accum/k >= 1; k *= 2 {
			if (c.Batch*c.Accum)%k == 0 {
				out = append(out, fmt.Sprintf("%d x %d", c.Batch*c.Accum/k, k))
			}
		}
		return out
	case rowOptimizer:
		return optimizerChoices
	case rowZeroGrad:
		return words(knob.ZeroGradNone, knob.ZeroGradZero)
	case rowBug:
		if c.Bug == "" {
			return []string{"none"}
		}
		return []string{c.Bug, "fixed"}
	case rowParallel:
		return parallelChoices
	case rowOffload:
		return []string{"none", "optimizer", "optimizer+params"}
	}
	return nil
}

// newFixesPane is the pane for workload w (nil: none, the snapshot is not oomdbg's own), whose re-runs stop at
// the memory budget (0: DefaultMemoryBudget).
func newFixesPane(w *Workload, run Runner, budget int64) fixesPane {
	p := fixesPane{run: run, budget: cmp.Or(budget, DefaultMemoryBudget)}
	if w != nil && run != nil {
		c := *w
		p.base = &c
		p.reset()
	}
	return p
}

// current names the base's choice in a row.
func (p *fixesPane) current(row int) string { return valueOf(p.base.Fixes, row) }

// choose makes the choices those of f, where the rows offer them.
func (p *fixesPane) choose(f Fixes) {
	for r := range numFixRows {
		v := valueOf(f, r)
		if r == rowBug && p.base.Fixes.Bug != "" && f.Bug == "" {
			v = "fixed"
		}
		if i := indexOf(p.choices(r), v); i >= 0 {
			p.choice[r] = i
		}
	}
}

// valueOf names the choice of c in a row.
func valueOf(c Fixes, row int) string {
	switch row {
	case rowAMP:
		return c.AMP
	case rowWeights:
		return weightsOf(c)
	case rowAdapter:
		return adapterOf(c)
	case rowAttention:
		return c.Attention
	case rowCheckpoint:
		return c.Checkpoint
	case rowAccum:
		return fmt.Sprintf("%d x %d", c.Batch, c.Accum)
	case rowOptimizer:
		return optimizerOf(c)
	case rowZeroGrad:
		return c.ZeroGrad
	case rowBug:
		if c.Bug == "" {
			return "none"
		}
		return c.Bug
	case rowParallel:
		return c.Parallel
	case rowOffload:
		if c.Offload == "" {
			return "none"
		}
		return c.Offload
	}
	return ""
}

// reset makes the choices match the base configuration.
func (p *fixesPane) reset() {
	for r := range numFixRows {
		p.choice[r] = indexOf(p.choices(r), p.current(r))
	}
}

// weightsOf, adapterOf and optimizerOf name a workload's choice as its row does.
func weightsOf(c Fixes) string {
	if c.Weights == "" {
		return "f32"
	}
	return c.Weights
}

func adapterOf(c Fixes) string {
	switch {
	case c.QLoRA:
		return fmt.Sprintf("qlora %d", c.LoRA)
	case c.LoRA > 0:
		return fmt.Sprintf("lora %d", c.LoRA)
	}
	return "none"
}

func optimizerOf(c Fixes) string {
	if c.OptimizerImpl != "" && c.OptimizerImpl != "foreach" {
		return c.Optimizer + " " + c.OptimizerImpl
	}
	return c.Optimizer
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// setBaseline takes the loaded run as the "before" of the comparison.
func (p *fixesPane) setBaseline(ix *index) {
	if ix == nil {
		return
	}
	p.trace.snap = ix.snap
	if p.base == nil && p.run != nil && len(ix.snap.Meta.Workload) > 0 && ix.snap.Meta.Source == "oomdbg" {
		if w, err := p.run.Parse(ix.snap.Meta.Workload); err == nil {
			p.base = &w
			p.reset()
		}
	}
	if ix.len() > 0 {
		p.before = summarize(ix)
	}
}

// config returns the base workload with the chosen fixes, on the meta device.
func (p *fixesPane) config() Workload {
	w := *p.base
	c := &w.Fixes
	pick := func(r int) string { return p.choices(r)[p.choice[r]] }
	c.AMP, c.Attention, c.Checkpoint, c.ZeroGrad = pick(rowAMP), pick(rowAttention), pick(rowCheckpoint), pick(rowZeroGrad)
	if o := pick(rowOptimizer); o != optimizerOf(p.base.Fixes) {
		c.Optimizer, c.OptimizerImpl, _ = strings.Cut(o, " ")
	}
	if wt := pick(rowWeights); wt != weightsOf(p.base.Fixes) {
		c.Weights = wt
	}
	if a := pick(rowAdapter); a != adapterOf(p.base.Fixes) {
		kind, rank, _ := strings.Cut(a, " ")
		c.LoRA, c.QLoRA, c.LoRATargets = 0, false, ""
		if kind != "none" {
			fmt.Sscan(rank, &c.LoRA)
			c.QLoRA, c.LoRATargets = kind == "qlora", allProjections
		}
	}
	fmt.Sscanf(pick(rowAccum), "%d x %d", &c.Batch, &c.Accum)
	if pick(rowBug) == "fixed" {
		c.Bug = ""
	}
	if p.base.GPUs > 1 {
		c.Parallel, c.Offload = pick(rowParallel), pick(rowOffload)
	}
	w.Device = "meta"
	return w
}

func (p *fixesPane) onKey(msg tea.KeyPressMsg, m *Model) tea.Cmd {
	if p.base == nil {
		return p.trace.onKey(msg, m)
	}
	if cmd, ok := p.fitKey(msg, m); ok {
		return cmd
	}
	k := m.keys
	r := &p.rec
	switch {
	case p.focusRanked && key.Matches(msg, k.Up):
		r.selected = max(r.selected-1, 0)
	case p.focusRanked && key.Matches(msg, k.Down):
		if r.selected++; r.selected >= len(r.ranked) {
			r.selected, p.focusRanked = len(r.ranked)-1, false
		}
	case p.focusRanked && key.Matches(msg, k.Detail, k.Toggle):
		return p.apply(r.ranked[r.selected], m)
	case key.Matches(msg, k.Apply):
		if b := r.best(); b != nil {
			return p.apply(*b, m)
		}
		m.setStatus("no measured fix fits yet", false)
	case key.Matches(msg, k.Up):
		if p.selected == 0 && len(r.ranked) > 0 {
			p.focusRanked = true
		}
		p.selected = max(p.selected-1, 0)
	case key.Matches(msg, k.Down):
		p.selected = min(p.selected+1, len(p.rows())-1)
	case key.Matches(msg, k.Toggle, k.Detail):
		p.choice[p.selected] = (p.choice[p.selected] + 1) % len(p.choices(p.selected))
	case key.Matches(msg, k.Back):
		if p.running != nil {
			p.cancel()
			m.setStatus("re-run cancelled", false)
		}
	case key.Matches(msg, k.Rerun):
		if p.running != nil {
			p.cancel()
			m.setStatus("re-run cancelled", false)
			return nil
		}
		return p.start(m)
	}
	return nil
}

// apply chooses a measured fix's settings and re-runs with them.
func (p *fixesPane) apply(f Measured, m *Model) tea.Cmd {
	p.cancel()
	p.choose(f.Fixes)
	return p.start(m)
}

// start re-runs the workload with the chosen settings, and measures what it needs.
func (p *fixesPane) start(m *Model) tea.Cmd {
	ctx, cancel := context.WithCancel(m.ctx)
	p.running, p.err, p.after, p.afterIx = cancel, nil, nil, nil
	m.setStatus("re-running with "+p.describe()+" on the meta device…", false)
	p.progress = nil
	w := p.config()
	return tea.Batch(rerun(ctx, p.run, w), p.measureAfter(ctx, w))
}

func (p *fixesPane) cancel() {
	if p.running != nil {
		p.running()
		p.running, p.progress = nil, nil
	}
}

// describe names the chosen fixes that differ from the base.
func (p *fixesPane) describe() string {
	var parts []string
	c, b := p.config().Fixes, p.base.Fixes
	if c.AMP != b.AMP {
		parts = append(parts, "amp "+c.AMP)
	}
	if weightsOf(c) != weightsOf(b) {
		parts = append(parts, weightsOf(c)+" weights")
	}
	if adapterOf(c) != adapterOf(b) {
		parts = append(parts, adapterOf(c))
	}
	if c.Attention != b.Attention {
		parts = append(parts, c.Attention+" attention")
	}
	if c.Checkpoint != b.Checkpoint {
		parts = append(parts, "checkpoint "+c.Checkpoint)
	}
	if c.Batch != b.Batch {
		parts = append(parts, fmt.Sprintf("batch %d x %d", c.Batch, c.Accum))
	}
	if optimizerOf(c) != optimizerOf(b) {
		parts = append(parts, optimizerOf(c))
	}
	if c.ZeroGrad != b.ZeroGrad {
		parts = append(parts, "zero_grad "+c.ZeroGrad)
	}
	if c.Bug != b.Bug {
		parts = append(parts, "the leak fixed")
	}
	if c.Parallel != b.Parallel {
		parts = append(parts, c.Parallel)
	}
	if c.Offload != b.Offload && (c.Offload != "none" || b.Offload != "") {
		parts = append(parts, "offload "+c.Offload)
	}
	if len(parts) == 0 {
		return "no change"
	}
	return strings.Join(parts, ", ")
}

// fixResultMsg is a finished re-run.
type fixResultMsg struct {
	ix   *index
	leak *leaks.Result // the re-run's leak analysis
	err  error
}

// The re-run streams in like the main workload, so its progress shows; its messages are its own types.
type (
	fixStreamMsg streamMsg
	fixChunkMsg  chunkMsg
)

// rerun records w into a pipe and starts reading it.
func rerun(ctx context.Context, run Runner, w Workload) tea.Cmd {
	open := recordWorkload(ctx, run, w)
	return func() tea.Msg { return fixStreamMsg(open().(streamMsg)) }
}

// onStream starts reading the re-run, or ends it on an error.
func (p *fixesPane) onStream(msg fixStreamMsg) tea.Cmd {
	if msg.err != nil {
		return func() tea.Msg { return fixResultMsg{err: msg.err} }
	}
	p.stream, p.progress = msg.s, &snapshot.Snapshot{Meta: msg.meta}
	return p.readMore()
}

func (p *fixesPane) readMore() tea.Cmd {
	next := nextChunk(p.stream)
	return func() tea.Msg { return fixChunkMsg(next().(chunkMsg)) }
}

// onChunk adds what the re-run recorded; at its end the re-run is indexed (in a command: it is the heavy
// part) and compared.
func (p *fixesPane) onChunk(msg fixChunkMsg) tea.Cmd {
	if p.progress == nil { // cancelled meanwhile
		return nil
	}
	*p.progress = *msg.snap
	// The workload comes from the file, perhaps someone else's: a re-run is held whole to be compared, so
	// one that outgrows the view's memory budget is stopped.
	if n := int64(p.progress.Events.Len()); n*residentPerEvent > p.budget {
		p.cancel()
		return func() tea.Msg {
			return fixResultMsg{err: fmt.Errorf("stopped at %d events: held whole, the re-run would pass the %s memory budget "+
				"(fewer steps would fit; oomdbg view --max-memory raises it)", n, units.FormatSize(p.budget))}
		}
	}
	switch {
	case msg.err != nil:
		return func() tea.Msg { return fixResultMsg{err: msg.err} }
	case !msg.done:
		return p.readMore()
	}
	s := p.progress
	return func() tea.Msg {
		ix := newIndex(s)
		return fixResultMsg{ix: ix, leak: leaks.Analyze(ix.tl)}
	}
}

func (p *fixesPane) onResult(msg fixResultMsg) {
	p.running, p.progress = nil, nil
	if msg.err != nil {
		p.err = msg.err
		return
	}
	p.afterIx, p.after = msg.ix, summarize(msg.ix)
	p.after.leak = msg.leak
}

func (p *fixesPane) afterIndex() *index {
	if p.base == nil {
		return p.trace.shown
	}
	return p.afterIx
}

// runSummary is what the comparison shows of one run.
type runSummary struct {
	peakAlloc, peakRes int64
	capacity           int64
	oom                bool
	oomWhere           string
	atPeak             [snapshot.NumCategories]int64
	leak               *leaks.Result // nil until analysed
	recompute, forward int           // allocations in the recompute and forward phases
}

func summarize(ix *index) *runSummary {
	r := &runSummary{peakAlloc: ix.allocated(max(ix.peak, 0)), peakRes: ix.peakReserved(), capacity: ix.capacity, oom: ix.oom >= 0}
	if ix.ov != nil { // a paged run's, summed up page by page as it was read
		b := ix.ov.baseline
		r.peakAlloc, r.atPeak, r.forward, r.recompute = b.peakAlloc, b.atPeak, b.forward, b.recompute
	}
	if r.oom {
		sp := ix.spanAt(ix.oom)
		r.oomWhere = fmt.Sprintf("OOM in %s, iteration %d", sp.phase, sp.iteration)
	}
	if ix.ov != nil {
		return r
	}
	if ix.peak >= 0 {
		r.atPeak = byCategory(ix.liveAt(ix.peak))
	}
	r.forward, r.recompute = forwardAllocs(ix.snap.Events.Actions(), 0, ix.spans())
	return r
}

// forwardAllocs counts the allocations of the forward and the recompute phases among spans, whose events'
// actions are actions[span.Start-base : span.End-base]: what checkpointing recomputes against what the
// forward made.
func forwardAllocs(actions []snapshot.Action, base int, spans []timeline.PhaseSpan) (forward, recompute int) {
	for _, sp := range spans {
		if sp.Phase != snapshot.PhaseForward && sp.Phase != snapshot.PhaseRecompute {
			continue
		}
		n := 0
		for _, a := range actions[sp.Start-base : sp.End-base] {
			if a == snapshot.ActionAlloc {
				n++
			}
		}
		if sp.Phase == snapshot.PhaseForward {
			forward += n
		} else {
			recompute += n
		}
	}
	return forward, recompute
}

// verdict says in a few words how a run ended.
func (r *runSummary) verdict() string {
	if r.oom {
		return r.oomWhere + fmt.Sprintf(" at %s allocated", units.FormatSize(r.peakAlloc))
	}
	return fmt.Sprintf("fits, peak %s allocated", units.FormatSize(r.peakAlloc))
}

func (p *fixesPane) view(s Styles, w, h int) string {
	if p.base == nil {
		return p.trace.view(s, w, h)
	}
	if p.fit.open {
		lines := p.fitView(s, w)
		return strings.Join(lines[:min(len(lines), h)], "\n")
	}
	ranked := 3
	if h >= 24 {
		ranked = 8
	}
	lines := p.rankedView(s, w, ranked)
	lines = append(lines, p.comparison(s, w)...)
	settings := []string{s.Muted.Render(ansi.Truncate("↑↓ choose, space change, r re-run on the meta device (r or esc again cancels)"+p.fitHint(), w, "…"))}
	for _, r := range p.rows() {
		line := fmt.Sprintf("%-21s %s", fixRowNames[r], choiceCells(p.choices(r), p.choice[r], w-22))
		line = ansi.Truncate(line, w, "…")
		if r == p.selected && !p.focusRanked {
			line = s.Selected.Render(padRight(line, w))
		}
		settings = append(settings, line)
	}
	// The settings take the room left, scrolled so that the selected one shows.
	if room := h - len(lines); room < len(settings) {
		from := min(max(p.selected+2-room, 0), len(settings)-max(room, 1))
		settings = settings[from:]
	}
	lines = append(lines, settings...)
	if len(lines) > h {
		lines = lines[:h]
	}
	return strings.Join(lines, "\n")
}

// choiceCells renders a row's choices, the chosen one in brackets, in width: when they do not fit, from a
// choice late enough that the chosen one shows, with "…" for those left out.
func choiceCells(opts []string, chosen, width int) string {
	cell := func(i int) string {
		if i == chosen {
			return "[" + opts[i] + "]"
		}
		return " " + opts[i] + " "
	}
	from := 0
	for {
		var b strings.Builder
		if from > 0 {
			b.WriteString("…")
		}
		for i := from; i <= chosen; i++ {
			b.WriteString(cell(i))
		}
		if ansi.StringWidth(b.String()) <= width || from == chosen {
			for i := chosen + 1; i < len(opts); i++ {
				b.WriteString(cell(i))
			}
			return b.String()
		}
		from++
	}
}

// comparison is the before/after table.
func (p *fixesPane) comparison(s Styles, w int) []string {
	switch {
	case p.running != nil && p.progress != nil && p.progress.Events.Len() > 0:
		n := p.progress.Events.Len()
		phase, iteration := p.progress.Events.Phase(n - 1)
		return []string{s.Warn.Render(fmt.Sprintf("re-running… %d events, iteration %d, %s", n, iteration, phase))}
	case p.running != nil:
		return []string{s.Warn.Render("re-running…")}
	case p.err != nil:
		return []string{s.Error.Render(ansi.Truncate("re-run failed: "+p.err.Error(), w, "…"))}
	case (p.after == nil || p.before == nil) && p.rec.base != nil:
		return nil
	case p.after == nil || p.before == nil:
		return []string{s.Muted.Render("no re-run yet")}
	}
	b, a := p.before, p.after
	fits := func(r *runSummary) string {
		if r.oom {
			return r.oomWhere
		}
		return "fits"
	}
	row := func(name string, before, after int64) []string {
		return []string{name, units.FormatSize(before), units.FormatSize(after), units.FormatChange(after - before)}
	}
	// What each run needs (its peak with unlimited memory) compares fixes; the peaks on the device stop at
	// an OOM, and a run that ran out sooner shows a lower one.
	var rows [][]string
	if p.rec.base != nil && p.afterNeeds > 0 && p.base.Fixes.Bug == "" {
		rows = append(rows, row("needs", p.rec.base.Needs, p.afterNeeds))
	}
	if p.rec.base != nil && p.afterNeeds > 0 && p.base.Fixes.Bug != "" { // a leak's need grows with the run
		rows = append(rows, []string{"needs", "grows (leak)", units.FormatSize(p.afterNeeds), ""})
	}
	rows = append(rows, row("peak allocated", b.peakAlloc, a.peakAlloc), row("peak reserved", b.peakRes, a.peakRes))
	n := len(rows)
	for c := range snapshot.NumCategories {
		if a.atPeak[c] != b.atPeak[c] {
			rows = append(rows, row("  "+snapshot.Category(c).String(), b.atPeak[c], a.atPeak[c]))
		}
	}
	// The categories' rows follow the device's verdict, which is a sentence rather than a row of the table.
	head, cats := rows[:n], rows[n:]
	var out []string
	for _, line := range strings.Split(comparisonTable(s, head), "\n") {
		out = append(out, ansi.Truncate(line, w, ""))
	}
	verdict := s.Good
	if a.oom {
		verdict = s.Error
	}
	out = append(out, ansi.Truncate(fmt.Sprintf("%-18s before: %s; after: ", "device", fits(b)), w, "")+verdict.Render(fits(a)))
	if bl, al := p.beforeLeak, a.leak; bl != nil && al != nil && (bl.Verdict == leaks.Leak || al.Verdict == leaks.Leak) {
		st := s.Good
		if al.Verdict == leaks.Leak {
			st = s.Error
		}
		out = append(out, ansi.Truncate(fmt.Sprintf("%-18s before: %s; after: ", "leak", leakWords(bl)), w, "")+st.Render(ansi.Truncate(leakWords(al), w/2, "…")))
	}
	if len(cats) > 0 {
		lines := strings.Split(comparisonTable(s, cats), "\n")
		for _, line := range lines[1:] { // the columns are the table's above
			out = append(out, ansi.Truncate(line, w, ""))
		}
	}
	if a.recompute > 0 && a.forward > 0 {
		out = append(out, ansi.Truncate(fmt.Sprintf("cost: backward recomputes %d%% of the forward's allocations", 100*a.recompute/a.forward), w, "…"))
	}
	return out
}

// comparisonTable lays out rows of a name and three sizes (before, after, change) under the before/after
// header: the name left-aligned, the sizes right-aligned, no borders.
func comparisonTable(s Styles, rows [][]string) string {
	return table.New().Border(lipgloss.HiddenBorder()).
		BorderTop(false).BorderBottom(false).BorderLeft(false).BorderRight(false).BorderHeader(false).BorderColumn(false).
		Headers("", "before", "after", "change").
		Rows(rows...).
		StyleFunc(func(row, col int) lipgloss.Style {
			st := lipgloss.NewStyle().Width(19).PaddingRight(1)
			if col > 0 {
				st = lipgloss.NewStyle().Width(13).PaddingLeft(1).Align(lipgloss.Right)
			}
			if row == table.HeaderRow {
				st = st.Inherit(s.Header)
			}
			return st
		}).
		Render()
}
