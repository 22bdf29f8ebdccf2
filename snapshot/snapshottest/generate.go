// Package snapshottest generates deterministic, realistic training-loop traces for the tests and benchmarks of
// snapshot writers, readers and analyses.
//
// The trace is that of a GPT-like model (token and position embedding, N blocks of naive causal attention and
// MLP, final layer norm, tied LM head, cross-entropy) trained with AdamW: each iteration has data, forward,
// backward, optimizer and zero_grad phases, with allocs and frees of realistic sizes (activations of
// batch*seq*d_model*4 bytes, B*H*T*T attention scores, 1-byte dropout masks, rounded to 512-byte blocks),
// addresses reused the way a caching allocator reuses them, Go-like stacks of depth 13 to 20, module scopes,
// tensor labels, category changes when autograd saves a tensor, and a heap dump of retain events at every
// iteration end. It makes such traces at any size in moments without the workload runtime, so the snapshot
// layer's tests and benchmarks (a million events and more) do not depend on the runtime: the numbers they
// yield (bytes per event, events per second) are honest for this shape of trace. Recordings of the runtime
// itself are measured by workloads/train's BenchmarkRecordGPT.
package snapshottest

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Config sizes the traced model and run.
type Config struct {
	Iterations int // training steps after setup
	Layers     int
	DModel     int
	Heads      int
	Seq        int
	Batch      int
	Vocab      int
	Seed       uint64 // seeds the event timing; the same Config always yields the same trace
	// LeakLoss keeps every iteration's loss alive in a loss history, the classic retained-graph leak: one
	// 512-byte block per iteration, retained by "loss_history[i]".
	LeakLoss bool
}

// GPT2Small is GPT-2 small at batch 8, sequence 1024: about 3,050 events per iteration.
func GPT2Small() Config {
	return Config{Iterations: 20, Layers: 12, DModel: 768, Heads: 12, Seq: 1024, Batch: 8, Vocab: 50304, Seed: 1}
}

// Tiny is a two-layer model for unit tests: about 500 events per iteration.
func Tiny() Config {
	return Config{Iterations: 3, Layers: 2, DModel: 64, Heads: 2, Seq: 32, Batch: 2, Vocab: 256, Seed: 1}
}

// Sink receives a trace; *snapshot.Writer is one.
type Sink interface {
	InternString(s string) snapshot.StringID
	InternFrame(function, file string, line int) snapshot.FrameID
	InternStack(frames []snapshot.FrameID) snapshot.StackID
	Write(e *snapshot.Event) error
}

// Meta returns the metadata of a generated trace. It is fixed for a Config, so files are reproducible.
func Meta(cfg Config) snapshot.Meta {
	workload, _ := json.Marshal(cfg)
	return snapshot.Meta{
		Tool:        "oomdbg",
		ToolVersion: "snapshottest",
		Created:     time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC),
		Host:        "generator",
		Source:      "oomdbg",
		TimeUnit:    "ns",
		Devices: []snapshot.DeviceInfo{{
			Index: 0, Name: "meta", Kind: "meta", Capacity: 24 << 30, ContextReserve: contextReserve,
		}},
		Workload: workload,
	}
}

// contextReserve is the memory the device reports used before the allocator takes any.
const contextReserve = 512 << 20

// Encode writes a complete snapshot of the trace, footer included, to w.
func Encode(w io.Writer, cfg Config, opts ...snapshot.WriterOption) error {
	sw, err := snapshot.NewWriter(w, Meta(cfg), opts...)
	if err != nil {
		return err
	}
	footer, err := Generate(sw, cfg)
	if err != nil {
		return err
	}
	return sw.Close(footer)
}

// Trace returns the trace as a snapshot in memory, with tables interned independently of snapshot.Writer
// (IDs in first-use order, as the Writer assigns them): the truth a written and read-back file must equal.
func Trace(cfg Config) *snapshot.Snapshot {
	m := newMemSink()
	footer, err := Generate(m, cfg)
	if err != nil {
		panic(err) // the in-memory sink does not fail
	}
	return &snapshot.Snapshot{
		Meta: Meta(cfg), Events: m.events.View(), Strings: m.strings, Frames: m.frames, Stacks: m.stacks, Footer: footer,
	}
}

// Generate writes the trace to s and returns the footer that describes it.
func Generate(s Sink, cfg Config) (*snapshot.Footer, error) {
	g := &gen{
		s:     s,
		cfg:   cfg,
		rng:   rand.New(rand.NewPCG(cfg.Seed, 0x6f6f6d646267)),
		alloc: newAllocator(),
		st:    newStacks(s),
		live:  make(map[uint64]*tensor),
		grads: make(map[string]*tensor),
		state: make(map[string][2]*tensor),
		ids:   make(map[string]snapshot.StringID),
	}
	g.run()
	if g.err != nil {
		return nil, g.err
	}
	return g.footer(), nil
}

// tensor is a live block the generator tracks.
type tensor struct {
	addr     uint64
	size     int64 // requested bytes
	block    int64
	scope    snapshot.StringID
	label    snapshot.StringID
	stack    snapshot.StackID
	category snapshot.Category
	role     string
}

type gen struct {
	s     Sink
	cfg   Config
	rng   *rand.Rand
	alloc *allocator
	st    *stacks
	err   error

	now   int64
	phase snapshot.Phase
	iter  int32

	live   map[uint64]*tensor
	params []*tensor
	pdefs  []param
	grads  map[string]*tensor    // parameter name -> gradient
	state  map[string][2]*tensor // parameter name -> AdamW exp_avg, exp_avg_sq
	losses []*tensor             // the leaked loss history
	ids    map[string]snapshot.StringID

	byAction     [snapshot.NumActions]uint64
	events       uint64
	peak         int64
	peakSeq      uint64
	peakReserved int64
}

func (g *gen) run() {
	g.setup()
	for i := range g.cfg.Iterations {
		g.iteration(int32(i))
		if g.err != nil {
			return
		}
	}
}

// str interns s, caching the ID so that building a label costs one map lookup.
func (g *gen) str(s string) snapshot.StringID {
	if id, ok := g.ids[s]; ok {
		return id
	}
	id := g.s.InternString(s)
	g.ids[s] = id
	return id
}

// tick advances the clock by the microsecond-scale gap between two allocator events: log-uniform between
// 300 ns and 20 µs.
func (g *gen) tick() {
	g.now += int64(300 * math.Exp(g.rng.Float64()*math.Log(20000.0/300)))
}

// wait advances the clock by a longer gap (data loading, a synchronizing kernel): log-uniform in [lo, hi) µs.
func (g *gen) wait(lo, hi float64) {
	g.now += int64(1000 * lo * math.Exp(g.rng.Float64()*math.Log(hi/lo)))
}

func (g *gen) emit(e *snapshot.Event) {
	if g.err != nil {
		return
	}
	g.tick()
	e.Time = g.now
	e.Phase = g.phase
	e.Iteration = g.iter
	if err := g.s.Write(e); err != nil {
		g.err = err
		return
	}
	g.byAction[e.Action]++
	g.events++
	if e.Action == snapshot.ActionAlloc && g.alloc.allocated > g.peak {
		g.peak, g.peakSeq = g.alloc.allocated, e.Seq
	}
	g.peakReserved = max(g.peakReserved, g.alloc.reserved)
}

func (g *gen) marker(a snapshot.Action, p snapshot.Phase, iter int32) {
	g.phase, g.iter = p, iter
	g.emit(&snapshot.Event{Action: a})
}

// label formats a tensor label such as "f32[8,1024,768] qkv.out".
func (g *gen) label(dtype string, shape []int, role string) snapshot.StringID {
	b := make([]byte, 0, 48)
	b = append(b, dtype...)
	b = append(b, '[')
	for i, d := range shape {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(d), 10)
	}
	b = append(b, "] "...)
	b = append(b, role...)
	return g.str(string(b))
}

func bytesOf(dtype string, shape []int) int64 {
	n := int64(4)
	switch dtype {
	case "u8":
		n = 1
	case "i64":
		n = 8
	}
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}

// malloc allocates a tensor, with a segment_alloc first when the allocator needs a new segment.
func (g *gen) malloc(module, opKind, scope, dtype string, shape []int, role string, cat snapshot.Category) *tensor {
	size := bytesOf(dtype, shape)
	addr, block, seg := g.alloc.malloc(size)
	stack := g.st.get(g.phase, module, opKind)
	if seg != nil {
		g.emit(&snapshot.Event{Action: snapshot.ActionSegmentAlloc, Addr: seg.addr, Size: seg.size, Stack: stack})
	}
	t := &tensor{addr: addr, size: size, block: block, scope: g.str(scope), label: g.label(dtype, shape, role),
		stack: stack, category: cat, role: role}
	g.live[addr] = t
	g.emit(&snapshot.Event{Action: snapshot.ActionAlloc, Addr: addr, Size: size, BlockSize: block,
		Category: cat, Scope: t.scope, Label: t.label, Stack: stack})
	return t
}

// free releases a tensor: free_requested with the stack of the release site, then free_completed.
func (g *gen) free(t *tensor) {
	e := snapshot.Event{Action: snapshot.ActionFreeRequested, Addr: t.addr, Size: t.size, BlockSize: t.block,
		Category: t.category, Scope: t.scope, Label: t.label, Stack: g.st.get(g.phase, "", "release")}
	g.emit(&e)
	g.alloc.free(t.addr, t.block)
	delete(g.live, t.addr)
	e.Action = snapshot.ActionFreeCompleted
	g.emit(&e)
}

// save marks a tensor as saved for backward.
func (g *gen) save(t *tensor) {
	t.category = snapshot.CategoryActivation
	g.emit(&snapshot.Event{Action: snapshot.ActionCategory, Addr: t.addr, Size: t.size, BlockSize: t.block,
		Category: t.category, Scope: t.scope, Label: t.label, Stack: t.stack})
}

func (g *gen) setup() {
	g.marker(snapshot.ActionPhase, snapshot.PhaseSetup, -1)
	g.pdefs = g.cfg.params()
	for _, p := range g.pdefs {
		g.params = append(g.params, g.malloc("gpt", "param", p.scope, "f32", p.shape, p.role, snapshot.CategoryParameter))
	}
}

// pass is the state of one forward pass: the tensors each op made, by role, for frees and backward.
type pass struct {
	saved [][]*tensor // per op, in forward order: what backward frees
	ops   []op
	scope []string // per op: the scope prefix
	named map[string]*tensor
	later []*tensor // savedLater outputs of the previous op, saved when the next op runs
}

func (g *gen) iteration(i int32) {
	g.marker(snapshot.ActionIteration, g.phase, i)
	g.wait(500, 5000) // the data loader
	g.marker(snapshot.ActionPhase, snapshot.PhaseData, i)
	ids := g.malloc("gpt", "input", "input", "i64", []int{g.cfg.Batch, g.cfg.Seq}, "idx", snapshot.CategoryInput)
	targets := g.malloc("gpt", "input", "input", "i64", []int{g.cfg.Batch, g.cfg.Seq}, "targets", snapshot.CategoryInput)

	g.marker(snapshot.ActionPhase, snapshot.PhaseForward, i)
	p := &pass{named: make(map[string]*tensor)}
	g.forward(p, embeddingOps, "")
	for l := range g.cfg.Layers {
		g.forward(p, blockOps, blockScope(l))
	}
	g.forward(p, headOps, "")
	g.saveLater(p)
	loss := p.named["loss"]

	g.marker(snapshot.ActionPhase, snapshot.PhaseBackward, i)
	g.backward(p, loss)
	g.free(ids)
	g.free(targets)

	g.marker(snapshot.ActionPhase, snapshot.PhaseOptimizer, i)
	g.optimizer()

	g.marker(snapshot.ActionPhase, snapshot.PhaseZeroGrad, i)
	for _, pd := range g.pdefs {
		if t := g.grads[pd.name]; t != nil {
			g.free(t)
			delete(g.grads, pd.name)
		}
	}
	if g.cfg.LeakLoss {
		g.losses = append(g.losses, loss)
	} else {
		g.free(loss)
	}
	g.heapDump()
	g.emit(&snapshot.Event{Action: snapshot.ActionSample, Size: g.alloc.reserved + contextReserve, Text: g.str("nvml.used")})
	if i%10 == 9 {
		loss := 10.8 * math.Exp(-float64(i)/40)
		g.emit(&snapshot.Event{Action: snapshot.ActionAnnotation, Text: g.str(fmt.Sprintf("step %d: train loss %.4f", i+1, loss))})
	}
}

func blockScope(l int) string { return "blocks." + strconv.Itoa(l) }

func join(prefix, s string) string {
	switch {
	case prefix == "":
		return s
	case s == "":
		return prefix
	}
	return prefix + "." + s
}

// forward runs ops under the scope prefix.
func (g *gen) forward(p *pass, ops []op, prefix string) {
	for _, o := range ops {
		g.saveLater(p)
		scope := join(prefix, o.scope)
		var keep []*tensor
		for _, out := range o.outs {
			cat := snapshot.CategoryTemporary
			if out.fate == saved {
				cat = snapshot.CategoryActivation
			}
			t := g.malloc(o.module, o.kind, scope, out.dtype, g.cfg.shape(out.shape), out.role, cat)
			p.named[out.role] = t
			switch out.fate {
			case saved:
				keep = append(keep, t)
			case savedLater:
				keep = append(keep, t)
				p.later = append(p.later, t)
			}
		}
		for _, role := range o.frees {
			g.free(p.named[role])
			delete(p.named, role)
		}
		p.saved = append(p.saved, keep)
		p.ops = append(p.ops, o)
		p.scope = append(p.scope, prefix)
	}
}

// saveLater emits the category changes of tensors the op that just ran saved as its input.
func (g *gen) saveLater(p *pass) {
	for _, t := range p.later {
		g.save(t)
	}
	p.later = p.later[:0]
}

// backward walks the ops in reverse: each makes the gradient of its output (freeing the one before), the
// gradients of its parameters on first touch, and lets go of what it saved.
func (g *gen) backward(p *pass, loss *tensor) {
	var grad *tensor
	for k := len(p.ops) - 1; k >= 0; k-- {
		o := p.ops[k]
		scope := join(p.scope[k], o.scope)
		out := o.outs[0]
		shape := g.cfg.shape(out.shape)
		next := g.malloc(o.module, o.kind, scope, out.dtype, shape, out.role+".grad", snapshot.CategoryAutogradDetail)
		if grad != nil {
			g.free(grad)
		}
		grad = next
		for _, name := range o.params {
			full := join(p.scope[k], name)
			if g.grads[full] != nil {
				continue
			}
			pi := slices.IndexFunc(g.pdefs, func(pd param) bool { return pd.name == full })
			pd := g.pdefs[pi]
			g.grads[full] = g.malloc(o.module, "accumulate", pd.scope, "f32", pd.shape, pd.role+".grad", snapshot.CategoryGradient)
		}
		for j := len(p.saved[k]) - 1; j >= 0; j-- {
			if t := p.saved[k][j]; t != loss {
				g.free(t)
			}
		}
	}
	if grad != nil {
		g.free(grad)
	}
}

// optimizer is AdamW's foreach step: state on the first step, then a temporary per parameter.
func (g *gen) optimizer() {
	for _, pd := range g.pdefs {
		if _, ok := g.state[pd.name]; ok {
			continue
		}
		var st [2]*tensor
		st[0] = g.malloc("gpt", "adam_state", pd.scope, "f32", pd.shape, pd.role+".exp_avg", snapshot.CategoryOptimizerState)
		st[1] = g.malloc("gpt", "adam_state", pd.scope, "f32", pd.shape, pd.role+".exp_avg_sq", snapshot.CategoryOptimizerState)
		g.state[pd.name] = st
	}
	tmp := make([]*tensor, len(g.pdefs))
	for i, pd := range g.pdefs {
		tmp[i] = g.malloc("gpt", "foreach", pd.scope, "f32", pd.shape, pd.role+".denom", snapshot.CategoryTemporary)
	}
	for _, t := range tmp {
		g.free(t)
	}
}

// heapDump emits who holds every live tensor: parameters, optimizer state, the leaked losses.
func (g *gen) heapDump() {
	g.emit(&snapshot.Event{Action: snapshot.ActionHeapDump, Text: g.str("iteration end")})
	holder := uint64(0)
	retain := func(addr uint64, parent uint64, text string) uint64 {
		holder++
		e := snapshot.Event{Action: snapshot.ActionRetain, Addr: addr, Holder: holder, Parent: parent, Text: g.str(text)}
		if t := g.live[addr]; t != nil {
			e.Size, e.BlockSize, e.Category, e.Scope, e.Label, e.Stack = t.size, t.block, t.category, t.scope, t.label, t.stack
		}
		g.emit(&e)
		return holder
	}
	for i, pd := range g.pdefs {
		retain(g.params[i].addr, 0, "parameter "+pd.name)
	}
	opt := retain(0, 0, "optimizer AdamW")
	for _, pd := range g.pdefs {
		st := g.state[pd.name]
		retain(st[0].addr, opt, "AdamW.state["+pd.name+"].exp_avg")
		retain(st[1].addr, opt, "AdamW.state["+pd.name+"].exp_avg_sq")
	}
	for i, t := range g.losses {
		retain(t.addr, 0, "loss_history["+strconv.Itoa(i)+"]")
	}
}

func (g *gen) footer() *snapshot.Footer {
	by := make(map[string]uint64)
	for a, n := range g.byAction {
		if n > 0 {
			by[snapshot.Action(a).String()] = n
		}
	}
	live := make([]*tensor, 0, len(g.live))
	for _, t := range g.live {
		live = append(live, t)
	}
	slices.SortFunc(live, func(x, y *tensor) int {
		switch {
		case x.addr < y.addr:
			return -1
		case x.addr > y.addr:
			return 1
		}
		return 0
	})
	return &snapshot.Footer{
		Summary: snapshot.Summary{
			Events: g.events, ByAction: by, PeakAllocated: g.peak, PeakAllocatedSeq: g.peakSeq,
			PeakReserved: g.peakReserved, EndTime: g.now,
		},
		Segments: g.alloc.state(live),
	}
}
