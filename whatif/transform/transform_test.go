package transform_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/whatif/transform"
)

// craft builds a trace event by event.
type craft struct {
	s     *snapshot.Snapshot
	phase snapshot.Phase
	iter  int32
}

func newCraft() *craft {
	return &craft{s: &snapshot.Snapshot{Strings: []string{""}}, iter: -1}
}

func (c *craft) str(v string) snapshot.StringID {
	for i, s := range c.s.Strings {
		if s == v {
			return snapshot.StringID(i)
		}
	}
	c.s.Strings = append(c.s.Strings, v)
	return snapshot.StringID(len(c.s.Strings) - 1)
}

func (c *craft) add(e snapshot.Event) {
	e.Seq, e.Phase, e.Iteration = uint64(c.s.Events.Len()), c.phase, c.iter
	c.s.Events.Append(&e)
}

func (c *craft) begin(p snapshot.Phase, iter int32) {
	c.phase, c.iter = p, iter
	c.add(snapshot.Event{Action: snapshot.ActionPhase})
}

func (c *craft) alloc(addr uint64, size int64, cat snapshot.Category, scope string) {
	c.add(snapshot.Event{Action: snapshot.ActionAlloc, Addr: addr, Size: size, BlockSize: (size + 511) / 512 * 512,
		Category: cat, Scope: c.str(scope)})
}

func (c *craft) free(addr uint64, size int64) {
	bs := (size + 511) / 512 * 512
	c.add(snapshot.Event{Action: snapshot.ActionFreeRequested, Addr: addr, Size: size, BlockSize: bs})
	c.add(snapshot.Event{Action: snapshot.ActionFreeCompleted, Addr: addr, Size: size, BlockSize: bs})
}

func (c *craft) category(addr uint64, cat snapshot.Category) {
	c.add(snapshot.Event{Action: snapshot.ActionCategory, Addr: addr, Category: cat})
}

// step is one training iteration of a one-linear model: weight 4096 B, input 10000 B, an activation of
// 20000 B saved for backward, a weight gradient of 4096 B that becomes .grad, two Adam states at the first
// step and an optimizer temporary.
func step(c *craft, it int32) {
	base := uint64(it+1) << 20
	c.begin(snapshot.PhaseData, it)
	c.alloc(base+0x1000, 10000, snapshot.CategoryInput, "")
	c.begin(snapshot.PhaseForward, it)
	c.alloc(base+0x10000, 20000, snapshot.CategoryTemporary, "fc")
	c.category(base+0x10000, snapshot.CategoryActivation)
	c.begin(snapshot.PhaseBackward, it)
	c.alloc(base+0x20000, 20000, snapshot.CategoryAutogradDetail, "fc")
	c.alloc(base+0x30000, 4096, snapshot.CategoryAutogradDetail, "fc")
	c.category(base+0x30000, snapshot.CategoryGradient)
	c.free(base+0x20000, 20000)
	c.free(base+0x10000, 20000)
	c.free(base+0x1000, 10000)
	c.begin(snapshot.PhaseOptimizer, it)
	if it == 0 {
		c.alloc(0x900000, 4096, snapshot.CategoryOptimizerState, "optimizer")
		c.alloc(0x910000, 4096, snapshot.CategoryOptimizerState, "optimizer")
	}
	c.alloc(base+0x40000, 4096, snapshot.CategoryTemporary, "optimizer")
	c.free(base+0x40000, 4096)
	c.begin(snapshot.PhaseZeroGrad, it)
	c.free(base+0x30000, 4096)
}

func model(steps int) *snapshot.Snapshot {
	c := newCraft()
	c.begin(snapshot.PhaseSetup, -1)
	c.alloc(0x800000, 4096, snapshot.CategoryParameter, "fc")
	for it := range steps {
		step(c, int32(it))
	}
	return c.s
}

// sizes returns the requested size of every allocation, in order.
func sizes(s *snapshot.Snapshot) []int64 {
	var out []int64
	for _, e := range s.Events.All() {
		if e.Action == snapshot.ActionAlloc {
			out = append(out, e.Size)
		}
	}
	return out
}

// peak walks the block sizes of allocations and frees: the most allocated at once.
func peak(s *snapshot.Snapshot) int64 {
	var cur, p int64
	live := map[uint64]int64{}
	for _, e := range s.Events.All() {
		switch e.Action {
		case snapshot.ActionAlloc:
			if _, dup := live[e.Addr]; dup {
				panic("address allocated twice")
			}
			live[e.Addr] = e.BlockSize
			cur += e.BlockSize
			p = max(p, cur)
		case snapshot.ActionFreeRequested:
			if _, ok := live[e.Addr]; !ok {
				panic("free of a block not allocated")
			}
			cur -= live[e.Addr]
			delete(live, e.Addr)
		}
	}
	return p
}

func TestBatchScaleScalesWhatDependsOnTheBatch(t *testing.T) {
	in := model(1)
	before := sizes(in)
	out, lines, err := transform.Apply(in, transform.BatchScale(0.5))
	if err != nil {
		t.Fatal(err)
	}
	// parameter, input, activation, activation gradient, weight gradient, two states, temporary.
	want := []int64{4096, 5000, 10000, 10000, 4096, 4096, 4096, 4096}
	if got := sizes(out); !reflect.DeepEqual(got, want) {
		t.Errorf("sizes %v, want %v", got, want)
	}
	for _, e := range out.Events.All() {
		if e.Action == snapshot.ActionAlloc && e.Size == 5000 && e.BlockSize != 5120 { // 5000 rounded up to 512
			t.Errorf("input block %d, want 5120", e.BlockSize)
		}
	}
	if !reflect.DeepEqual(sizes(in), before) {
		t.Error("Apply changed its input")
	}
	if len(lines) != 1 || lines[0] == "" {
		t.Errorf("assumption lines %q", lines)
	}
}

func TestAccumulateRepeatsMicroSteps(t *testing.T) {
	out, _, err := transform.Apply(model(2), transform.Accumulate(2))
	if err != nil {
		t.Fatal(err)
	}
	// Per iteration: two micro-steps of input 5000, activation 10000, activation gradient 10000; the
	// weight gradient made by the first (4096), made again by the second and released once added.
	var forwards, grads int
	for _, e := range out.Events.All() {
		if e.Action == snapshot.ActionPhase && e.Phase == snapshot.PhaseForward {
			forwards++
		}
		if e.Action == snapshot.ActionAlloc && e.Size == 4096 && e.Phase == snapshot.PhaseBackward {
			grads++
		}
	}
	if forwards != 4 || grads != 4 {
		t.Errorf("%d forwards and %d weight gradients made, want 4 and 4", forwards, grads)
	}
	// The peak: parameter 4096 + 2 states 8192 + gradient 4096 and the second micro-step's gradient being
	// added (4096) do not meet the backward's: 4096 + 5120 + 10240 + 10240 + 4096 = 33792 in the first
	// micro-step; in the second the gradient already exists and its new one is made: 4096 + 4096 + 5120 +
	// 10240 + 10240 + 4096 = 37888 (iteration 0); in iteration 1 the 8192 of state are there too.
	if got, want := peak(out), int64(37888+8192); got != want {
		t.Errorf("peak %d, want %d", got, want)
	}
}

func TestSwitchToSGDRemovesStateAndTemporaries(t *testing.T) {
	out, _, err := transform.Apply(model(2), transform.SwitchOptimizer(knob.SGD))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range out.Events.All() {
		if e.Action == snapshot.ActionAlloc && e.Phase == snapshot.PhaseOptimizer {
			t.Errorf("an optimizer allocation is left: %+v", e)
		}
	}
}

func TestZeroingKeepsGradients(t *testing.T) {
	out, _, err := transform.Apply(model(3), transform.ZeroGrad(knob.ZeroGradZero))
	if err != nil {
		t.Fatal(err)
	}
	var live int64
	for _, e := range out.Events.All() {
		switch e.Action {
		case snapshot.ActionAlloc:
			live += e.BlockSize
		case snapshot.ActionFreeRequested:
			live -= e.BlockSize
		}
	}
	// At the end: the parameter, two states and the one gradient kept since the first backward.
	if live != 4*4096 {
		t.Errorf("%d bytes live at the end, want %d", live, 4*4096)
	}
}

func TestMissingTagsAreRefused(t *testing.T) {
	c := newCraft()
	c.alloc(0x1000, 1000, snapshot.CategoryUnknown, "")
	c.free(0x1000, 1000)
	for _, tr := range []transform.Transform{transform.BatchScale(0.5), transform.Accumulate(2),
		transform.SwitchOptimizer(knob.SGD), transform.ZeroGrad(knob.ZeroGradZero),
		transform.Checkpoint(knob.CheckpointAll)} {
		_, _, err := transform.Apply(c.s, tr)
		var missing *transform.MissingTagsError
		if !errors.As(err, &missing) {
			t.Errorf("%s: error %v, want a MissingTagsError", tr.Name, err)
		}
	}
}

func TestCheckpointRecomputesBeforeBackward(t *testing.T) {
	c := newCraft()
	c.begin(snapshot.PhaseSetup, -1)
	c.begin(snapshot.PhaseForward, 0)
	c.alloc(0x100, 1000, snapshot.CategoryInput, "")
	for i, blk := range []string{"h.0", "h.1"} {
		a := uint64(0x1000 * (i + 1))
		c.alloc(a, 8000, snapshot.CategoryTemporary, blk+".fc") // saved for backward
		c.category(a, snapshot.CategoryActivation)
		c.alloc(a+0x100, 2000, snapshot.CategoryTemporary, blk) // the block's output
	}
	c.begin(snapshot.PhaseBackward, 0)
	for i, blk := range []string{"h.1", "h.0"} {
		a := uint64(0x1000 * (2 - i))
		c.alloc(a+0x200, 2000, snapshot.CategoryAutogradDetail, blk+".fc")
		c.free(a, 8000)
		c.free(a+0x100, 2000)
		c.free(a+0x200, 2000)
	}
	out, _, err := transform.Apply(c.s, transform.Checkpoint(knob.CheckpointAll))
	if err != nil {
		t.Fatal(err)
	}
	// Without checkpointing: 1000 + 2*(8192+2048) + 2048 = 23528 at h.1's backward. With it, the forward
	// keeps the input and the outputs (1024 + 2048 + 2048); h.1's recompute adds 8192 + 2048 and its
	// backward 2048: 17408.
	if got, want := peak(c.s), int64(1024+2*(8192+2048)+2048); got != want {
		t.Fatalf("the crafted trace peaks at %d, want %d", got, want)
	}
	if got, want := peak(out), int64(1024+2048+2048+8192+2048+2048); got != want {
		t.Errorf("peak %d, want %d", got, want)
	}
	var recompute int
	for _, e := range out.Events.All() {
		if e.Action == snapshot.ActionAlloc && e.Phase == snapshot.PhaseRecompute {
			recompute++
		}
	}
	if recompute != 4 {
		t.Errorf("%d allocations recomputed, want 4", recompute)
	}
}

// TestSetToNoneUndoesZeroing: moving the crafted set_to_none trace to zeroing and back must give the
// original's live bytes at every phase: the gradient released at each zero_grad and the next backward's
// incoming gradient kept as .grad.
func TestSetToNoneUndoesZeroing(t *testing.T) {
	in := model(3)
	zeroed, _, err := transform.Apply(in, transform.ZeroGrad(knob.ZeroGradZero))
	if err != nil {
		t.Fatal(err)
	}
	back, lines, err := transform.Apply(zeroed, transform.ZeroGrad(knob.ZeroGradNone))
	if err != nil {
		t.Fatal(err)
	}
	t.Log(lines[0])
	if got, want := livePerPhase(back), livePerPhase(in); !reflect.DeepEqual(got, want) {
		t.Errorf("live bytes at each phase marker %v, want the original's %v", got, want)
	}
	if got, want := peak(back), peak(in); got != want {
		t.Errorf("peak %d, want the original's %d", got, want)
	}
	if reflect.DeepEqual(livePerPhase(zeroed), livePerPhase(in)) {
		t.Fatal("zeroing changed nothing: the round trip proves nothing")
	}
}

// livePerPhase returns the bytes live at each phase marker and at the end.
func livePerPhase(s *snapshot.Snapshot) []int64 {
	var out []int64
	var live int64
	for _, e := range s.Events.All() {
		switch e.Action {
		case snapshot.ActionAlloc:
			live += e.BlockSize
		case snapshot.ActionFreeRequested:
			live -= e.BlockSize
		case snapshot.ActionPhase:
			out = append(out, live)
		}
	}
	return append(out, live)
}

// adamModel is one iteration of a model with a parameter of 1 MiB (262,144 float32 elements) and one of
// 4 KiB (1,024), its Adam state made at the first step and foreach's square roots, one per parameter, alive
// together.
func adamModel(steps int) *snapshot.Snapshot {
	c := newCraft()
	c.begin(snapshot.PhaseSetup, -1)
	c.alloc(0x100000, 1<<20, snapshot.CategoryParameter, "big")
	c.alloc(0x200000, 4096, snapshot.CategoryParameter, "small")
	for it := range int32(steps) {
		base := uint64(it+1) << 24
		c.begin(snapshot.PhaseBackward, it)
		c.alloc(base+0x200000, 4096, snapshot.CategoryGradient, "small")
		c.alloc(base+0x100000, 1<<20, snapshot.CategoryGradient, "big")
		c.begin(snapshot.PhaseOptimizer, it)
		if it == 0 {
			c.alloc(0x70000000, 1<<20, snapshot.CategoryOptimizerState, "optimizer")
			c.alloc(0x71000000, 1<<20, snapshot.CategoryOptimizerState, "optimizer")
			c.alloc(0x72000000, 4096, snapshot.CategoryOptimizerState, "optimizer")
			c.alloc(0x73000000, 4096, snapshot.CategoryOptimizerState, "optimizer")
		}
		c.alloc(base+0x300000, 1<<20, snapshot.CategoryTemporary, "optimizer")
		c.alloc(base+0x400000, 4096, snapshot.CategoryTemporary, "optimizer")
		c.free(base+0x300000, 1<<20)
		c.free(base+0x400000, 4096)
		c.begin(snapshot.PhaseZeroGrad, it)
		c.free(base+0x200000, 4096)
		c.free(base+0x100000, 1<<20)
	}
	return c.s
}

// TestAdamW8bitState holds the 8-bit state to bitsandbytes' layout (Optimizer2State.init_state, blocksize
// 256 since bitsandbytes 0.44, min_8bit_size 4096): the 262,144-element parameter keeps two uint8 states
// and two float32 absmax of 262144/256 = 1024 blocks, plus the two 256-entry float32 maps; the
// 1,024-element one keeps float32 state.
func TestAdamW8bitState(t *testing.T) {
	out, lines, err := transform.Apply(adamModel(2), transform.SwitchOptimizer(knob.AdamW8bit))
	if err != nil {
		t.Fatal(err)
	}
	t.Log(lines[0])
	var state []int64
	for _, e := range out.Events.All() {
		if e.Action == snapshot.ActionAlloc && e.Category == snapshot.CategoryOptimizerState {
			state = append(state, e.Size)
		}
		if e.Action == snapshot.ActionAlloc && e.Category == snapshot.CategoryTemporary {
			t.Errorf("a step temporary is left: the 8-bit update is in place: %+v", e)
		}
	}
	// Parameter order: big first (backward made it last).
	want := []int64{256 * 4, 256 * 4, 262144, 262144, 1024 * 4, 1024 * 4, 4096, 4096}
	if !reflect.DeepEqual(state, want) {
		t.Errorf("state blocks %v, want %v", state, want)
	}
}

// TestForLoopAdam: the for-loop step holds at most the previous parameter's denominator, the current
// root and the current denominator, where foreach held every parameter's root at once.
func TestForLoopAdam(t *testing.T) {
	in := adamModel(2)
	out, lines, err := transform.Apply(in, transform.OptimizerImpl(knob.ForLoop))
	if err != nil {
		t.Fatal(err)
	}
	t.Log(lines[0])
	// Live before the step: parameters, gradients and two states, 4 x (1 MiB + 4 KiB). foreach adds both roots;
	// the loop, the big one's root and denominator (2 MiB), then the small one's two with the big
	// denominator still alive (1 MiB + 8 KiB).
	base := int64(4 * (1<<20 + 4096))
	if got, want := peak(in), base+1<<20+4096; got != want {
		t.Fatalf("the crafted trace peaks at %d, want %d", got, want)
	}
	if got, want := peak(out), base+2<<20; got != want {
		t.Errorf("peak %d, want %d", got, want)
	}
	// The step's temporaries are now at most three alive at once: the trace reads as for-loop already.
	_, lines, err = transform.Apply(out, transform.OptimizerImpl(knob.ForLoop))
	if err != nil || !strings.Contains(lines[0], "nothing changes") {
		t.Errorf("applied twice: %v %q", err, lines)
	}
}

// blocksTrace is one iteration of three identical blocks, each allocation from a stack of its own (the same
// in every block): scoped names the blocks h.0, h.1, h.2 as module scopes do; else nothing names them, as
// in a PyTorch trace without module annotations.
func blocksTrace(scoped bool) *snapshot.Snapshot {
	c := newCraft()
	scope := func(s string) string {
		if scoped {
			return s
		}
		return ""
	}
	add := func(addr uint64, size int64, stack snapshot.StackID, sc string) {
		c.add(snapshot.Event{Action: snapshot.ActionAlloc, Addr: addr, Size: size, BlockSize: (size + 511) / 512 * 512,
			Category: snapshot.CategoryTemporary, Scope: c.str(scope(sc)), Stack: stack})
	}
	c.begin(snapshot.PhaseSetup, -1)
	c.begin(snapshot.PhaseForward, 0)
	add(0x100, 1000, 1, "")
	for i := range 3 {
		a, blk := uint64(0x1000*(i+1)), "h."+string(rune('0'+i))
		add(a, 8000, 2, blk+".fc") // saved for backward
		add(a+0x100, 2000, 3, blk) // the block's output
	}
	add(0x200, 500, 4, "") // the loss
	c.begin(snapshot.PhaseBackward, 0)
	for i := range 3 {
		a, blk := uint64(0x1000*(3-i)), "h."+string(rune('0'+2-i))
		add(a+0x200, 2000, 5, blk+".fc")
		add(a+0x300, 600, 6, blk+".fc")
		c.free(a+0x300, 600)
		c.free(a, 8000)
		c.free(a+0x100, 2000)
		c.free(a+0x200, 2000)
	}
	c.free(0x200, 500)
	c.free(0x100, 1000)
	return c.s
}

// TestCheckpointFindsRepeatedBlocks: where no scope names the blocks, the repetition of the forward's
// allocations finds them, and checkpointing gives what it gives on the same trace with module scopes.
func TestCheckpointFindsRepeatedBlocks(t *testing.T) {
	for _, every := range []int{1, 2} {
		cp := transform.Checkpoint(knob.CheckpointEvery(every))
		scoped, _, err := transform.Apply(blocksTrace(true), cp)
		if err != nil {
			t.Fatal(err)
		}
		in := blocksTrace(false)
		inferred, lines, err := transform.Apply(in, cp)
		if err != nil {
			t.Fatal(err)
		}
		t.Log(lines[0])
		if peak(inferred) >= peak(in) {
			t.Errorf("every %d: peak %d, not below the recorded %d", every, peak(inferred), peak(in))
		}
		if got, want := livePerPhase(inferred), livePerPhase(scoped); !reflect.DeepEqual(got, want) || peak(inferred) != peak(scoped) {
			t.Errorf("every %d: live at each phase %v, peak %d; with scopes %v, %d", every, got, peak(inferred), want, peak(scoped))
		}
	}
	// No repetition: refused, naming what is missing.
	c := newCraft()
	c.begin(snapshot.PhaseForward, 0)
	c.alloc(0x100, 1000, snapshot.CategoryTemporary, "")
	c.alloc(0x200, 2000, snapshot.CategoryTemporary, "")
	c.begin(snapshot.PhaseBackward, 0)
	c.free(0x100, 1000)
	c.free(0x200, 2000)
	var missing *transform.MissingTagsError
	if _, _, err := transform.Apply(c.s, transform.Checkpoint(knob.CheckpointAll)); !errors.As(err, &missing) {
		t.Errorf("a forward without repeated blocks: error %v, want a MissingTagsError", err)
	}
}

// lateReleaseTrace is one iteration of three identical blocks that nothing names, each saving S (8000 B) for
// backward and returning O (2000 B), where each block's S is released at the end of the backward before its
// own (the block after it in the forward; the last block's at the start of backward): every S is released
// before its block's backward begins, and each block's backward ends with the release of the next one's S.
func lateReleaseTrace() *snapshot.Snapshot {
	c := newCraft()
	add := func(addr uint64, size int64, stack snapshot.StackID) {
		c.add(snapshot.Event{Action: snapshot.ActionAlloc, Addr: addr, Size: size, BlockSize: (size + 511) / 512 * 512,
			Category: snapshot.CategoryTemporary, Stack: stack})
	}
	c.begin(snapshot.PhaseSetup, -1)
	c.begin(snapshot.PhaseForward, 0)
	add(0x100, 1000, 1) // the input
	for i := range 3 {
		a := uint64(0x1000 * (i + 1))
		add(a, 8000, 2)       // S
		add(a+0x100, 2000, 3) // O
	}
	add(0x200, 500, 4) // the loss
	c.begin(snapshot.PhaseBackward, 0)
	c.free(0x3000, 8000) // the last block's S
	for i := 2; i >= 0; i-- {
		a := uint64(0x1000 * (i + 1))
		add(a+0x200, 2000, 5) // the gradient
		c.free(a+0x100, 2000)
		c.free(a+0x200, 2000)
		add(a+0x300, 600, 6) // a temporary
		c.free(a+0x300, 600)
		if i > 0 {
			c.free(a-0x1000, 8000) // the S of the block before
		}
	}
	c.free(0x200, 500)
	c.free(0x100, 1000)
	return c.s
}

// TestCheckpointReleasesWhatItRecomputes: a block's recomputed S and O are released at the end of its
// backward even where that end is a release the checkpoint drops (the next block's S, released in the
// forward now): nothing the recompute makes outlives the pass, and the peak is the first block's backward.
func TestCheckpointReleasesWhatItRecomputes(t *testing.T) {
	in := lateReleaseTrace()
	out, lines, err := transform.Apply(in, transform.Checkpoint(knob.CheckpointAll))
	if err != nil {
		t.Fatal(err)
	}
	// Recorded: the input, three S and O and the loss, 1024 + 3*(8192+2048) + 512. Checkpointed, each S is
	// released in the forward once O is made, which leaves the input, the three O and the loss (7680);
	// the last block's backward makes S and O again and its gradient (8192 + 2048 + 2048): 19968. After it
	// only the input, two O and the loss are left, and each block's backward peaks lower than the one before.
	if got, want := peak(in), int64(1024+3*(8192+2048)+512); got != want {
		t.Fatalf("the crafted trace peaks at %d, want %d", got, want)
	}
	live := livePerPhase(out)
	if got, want := peak(out), int64(1024+3*2048+512+8192+2048+2048); got != want {
		t.Errorf("peak %d, want %d\n%s", got, want, lines[0])
	}
	if end := live[len(live)-1]; end != 0 {
		t.Errorf("%d bytes alive at the end, want 0: a recomputed block outlives its backward", end)
	}
}

// frozenFirstBlockTrace is one iteration of three identical blocks, each saving A (8000 B) and B (4000 B)
// for backward and returning O (2000 B). A block's backward makes a gradient G (2000 B) and releases B,
// then a gradient H (3000 B) and releases A; the first block's input needs no gradient (a frozen model's
// embeddings), so its backward makes G and, instead of H, a gradient of its own (1000 B). Its backward
// repeats the start of the others', so the latest stretch of repeating allocations begins at the last
// block's H. scoped names the blocks h.0 to h.2; else nothing names them.
func frozenFirstBlockTrace(scoped bool) *snapshot.Snapshot {
	c := newCraft()
	add := func(addr uint64, size int64, stack snapshot.StackID, sc string) {
		if !scoped {
			sc = ""
		}
		c.add(snapshot.Event{Action: snapshot.ActionAlloc, Addr: addr, Size: size, BlockSize: (size + 511) / 512 * 512,
			Category: snapshot.CategoryTemporary, Scope: c.str(sc), Stack: stack})
	}
	blk := func(i int) string { return "h." + string(rune('0'+i)) }
	c.begin(snapshot.PhaseSetup, -1)
	c.begin(snapshot.PhaseForward, 0)
	add(0x100, 1000, 1, "") // the input
	for i := range 3 {
		a := uint64(0x1000 * (i + 1))
		add(a, 8000, 2, blk(i)+".attn")      // A
		add(a+0x100, 4000, 3, blk(i)+".mlp") // B
		add(a+0x200, 2000, 4, blk(i))        // O
	}
	add(0x200, 500, 5, "") // the loss
	c.begin(snapshot.PhaseBackward, 0)
	for i := 2; i >= 0; i-- {
		a := uint64(0x1000 * (i + 1))
		add(a+0x300, 2000, 6, blk(i)+".mlp") // G
		c.free(a+0x100, 4000)
		c.free(a+0x300, 2000)
		size, stack := int64(3000), snapshot.StackID(7) // H
		if i == 0 {
			size, stack = 1000, 8
		}
		add(a+0x400, size, stack, blk(i)+".attn")
		c.free(a, 8000)
		c.free(a+0x200, 2000)
		c.free(a+0x400, size)
	}
	c.free(0x200, 500)
	c.free(0x100, 1000)
	return c.s
}

// TestCheckpointAlignsBackwardBlocks: where nothing names the blocks and the first block's backward repeats
// the start of the others', each block's backward is still found where it releases what its forward saved,
// and checkpointing gives what it gives on the same trace with module scopes: each block's recompute comes
// before its backward makes G and releases B, not after.
func TestCheckpointAlignsBackwardBlocks(t *testing.T) {
	cp := transform.Checkpoint(knob.CheckpointAll)
	scoped, _, err := transform.Apply(frozenFirstBlockTrace(true), cp)
	if err != nil {
		t.Fatal(err)
	}
	inferred, lines, err := transform.Apply(frozenFirstBlockTrace(false), cp)
	if err != nil {
		t.Fatal(err)
	}
	// The last block's backward with its recompute: the input, the three O and the loss (1024 + 3*2048 +
	// 512), A, B and O again (8192 + 4096 + 2048) and G (2048).
	if got, want := peak(scoped), int64(1024+3*2048+512+8192+4096+2048+2048); got != want {
		t.Fatalf("with scopes: peak %d, want %d", got, want)
	}
	if got, want := livePerPhase(inferred), livePerPhase(scoped); !reflect.DeepEqual(got, want) || peak(inferred) != peak(scoped) {
		t.Errorf("live at each phase %v, peak %d; with scopes %v, %d\n%s", got, peak(inferred), want, peak(scoped), lines[0])
	}
	recomputedBefore := func(s *snapshot.Snapshot) (n int) { // recomputed allocations before the first G
		for _, e := range s.Events.All() {
			if e.Action == snapshot.ActionAlloc && e.Phase == snapshot.PhaseBackward && e.Size == 2000 {
				return n
			}
			if e.Action == snapshot.ActionAlloc && e.Phase == snapshot.PhaseRecompute {
				n++
			}
		}
		return n
	}
	if got := recomputedBefore(inferred); got != 3 {
		t.Errorf("%d allocations recomputed before the last block's backward makes G, want its 3", got)
	}
}

// TestCheckpointRefusesAnInferenceTrace: a trace that ran to its end with forward passes no backward follows
// (inference, as a model's generate loop records it) has nothing checkpointing could free, with module
// scopes or without: the fix is refused, saying so, rather than reported as a fix that saves nothing. A
// forward cut short by an OOM is not refused.
func TestCheckpointRefusesAnInferenceTrace(t *testing.T) {
	for _, scoped := range []bool{true, false} {
		c := newCraft()
		c.begin(snapshot.PhaseSetup, -1)
		for it := range int32(2) {
			c.begin(snapshot.PhaseForward, it)
			for pass := range 2 { // the blocks repeat, so that they are found without scopes too
				for i := range 3 {
					a, blk := uint64(0x10000*(int(it)+1)+0x1000*(3*pass+i+1)), "h."+string(rune('0'+i))
					if !scoped {
						blk = ""
					}
					c.add(snapshot.Event{Action: snapshot.ActionAlloc, Addr: a, Size: 8000, BlockSize: 8192,
						Category: snapshot.CategoryTemporary, Scope: c.str(blk + ".fc"), Stack: 2})
					c.add(snapshot.Event{Action: snapshot.ActionAlloc, Addr: a + 0x100, Size: 2000, BlockSize: 2048,
						Category: snapshot.CategoryTemporary, Scope: c.str(blk), Stack: 3})
					c.free(a, 8000)
				}
			}
		}
		_, _, err := transform.Apply(c.s, transform.Checkpoint(knob.CheckpointAll))
		var nothing *transform.NothingToCheckpointError
		if !errors.As(err, &nothing) {
			t.Fatalf("scoped %v: error %v, want a NothingToCheckpointError", scoped, err)
		}
		if nothing.Passes != 2 || !strings.Contains(err.Error(), "no backward pass follows the trace's 2 forward passes") {
			t.Errorf("scoped %v: %v", scoped, err)
		}
		// The same forward cut short by an OOM is a training run that never reached its backward: what it
		// saved for it is what checkpointing frees.
		c.add(snapshot.Event{Action: snapshot.ActionOOM, Size: 8000, BlockSize: 8192})
		if _, _, err := transform.Apply(c.s, transform.Checkpoint(knob.CheckpointAll)); err != nil {
			t.Errorf("scoped %v, ending in an OOM: %v", scoped, err)
		}
	}
}

// heldTrace is one iteration of two blocks h.0 and h.1 whose attention makes a tensor A (8000 B), saved
// for backward, that two of its ops read: B on the next line, which autograd saved A for, and C on the
// line after; the block's output D is made after the attention returns. The stacks are a Go program's:
// the op's frame innermost, then the line of the function that called it.
func heldTrace() *snapshot.Snapshot {
	c := newCraft()
	frame := func(fn, file string, line int) snapshot.FrameID {
		c.s.Frames = append(c.s.Frames, snapshot.Frame{Function: c.str(fn), File: c.str(file), Line: int32(line)})
		return snapshot.FrameID(len(c.s.Frames) - 1)
	}
	frame("", "", 0) // frame 0: none
	op, model := frame("tensor.Mul", "ops.go", 5), frame("Model.forward", "model.go", 1)
	attn := []snapshot.FrameID{frame("Attn.forward", "attn.go", 20), frame("Attn.forward", "attn.go", 21),
		frame("Attn.forward", "attn.go", 22)}
	inBlock, afterAttn := frame("Block.forward", "block.go", 10), frame("Block.forward", "block.go", 11)
	c.s.Stacks = [][]snapshot.FrameID{nil,
		{op, attn[0], inBlock, model}, {op, attn[1], inBlock, model}, {op, attn[2], inBlock, model},
		{op, afterAttn, model}}
	add := func(addr uint64, size int64, stack snapshot.StackID, scope string) {
		c.add(snapshot.Event{Action: snapshot.ActionAlloc, Addr: addr, Size: size, BlockSize: (size + 511) / 512 * 512,
			Category: snapshot.CategoryTemporary, Scope: c.str(scope), Stack: stack})
	}
	c.begin(snapshot.PhaseForward, 0)
	for i := range 2 {
		base, blk := uint64(0x10000*(i+1)), "h."+string(rune('0'+i))
		add(base, 8000, 1, blk+".attn")        // A
		add(base+0x1000, 3000, 2, blk+".attn") // B reads A ...
		c.category(base, snapshot.CategoryActivation)
		add(base+0x2000, 3000, 3, blk+".attn") // ... and so does C
		c.free(base+0x1000, 3000)
		c.free(base+0x2000, 3000)
		add(base+0x3000, 2000, 4, blk) // D, the output
	}
	c.begin(snapshot.PhaseBackward, 0)
	for i := range 2 {
		base, blk := uint64(0x10000*(2-i)), "h."+string(rune('0'+1-i))
		add(base+0x4000, 2000, 4, blk)
		c.free(base, 8000)
		c.free(base+0x3000, 2000)
		c.free(base+0x4000, 2000)
	}
	return c.s
}

// TestCheckpointReleaseEnds: checkpointed, A is released once B, its first reader, returns, before C is
// made; at the late end it lives until the attention that made it returns, after C and before D. The early
// end is what Apply gives, and a fix that places no release has no late end.
func TestCheckpointReleaseEnds(t *testing.T) {
	cp := transform.Checkpoint(knob.CheckpointAll)
	forward := func(s *snapshot.Snapshot, n int) []int64 { // the first n allocations (+) and completed frees (-) of forward, by size
		var got []int64
		for _, e := range s.Events.All() {
			if e.Phase != snapshot.PhaseForward || len(got) == n {
				continue
			}
			switch e.Action {
			case snapshot.ActionAlloc:
				got = append(got, e.Size)
			case snapshot.ActionFreeCompleted:
				got = append(got, -e.Size)
			}
		}
		return got
	}
	early, held, lines, err := transform.ApplyEnds(heldTrace(), cp)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := forward(early, 7), []int64{8000, 3000, -8000, 3000, -3000, -3000, 2000}; !reflect.DeepEqual(got, want) {
		t.Errorf("early: the first block's forward %v, want %v\n%s", got, want, lines[0])
	}
	if held == nil {
		t.Fatal("checkpointing has no late end")
	}
	if got, want := forward(held, 7), []int64{8000, 3000, 3000, -3000, -3000, -8000, 2000}; !reflect.DeepEqual(got, want) {
		t.Errorf("held: the first block's forward %v, want %v", got, want)
	}
	applied, _, err := transform.Apply(heldTrace(), cp)
	if err != nil {
		t.Fatal(err)
	}
	events := func(s *snapshot.Snapshot) []snapshot.Event {
		var out []snapshot.Event
		for _, e := range s.Events.All() {
			out = append(out, e)
		}
		return out
	}
	if got, want := events(early), events(applied); !reflect.DeepEqual(got, want) {
		t.Errorf("the early end differs from Apply's trace:\n%v\n%v", got, want)
	}
	if _, held, _, err := transform.ApplyEnds(heldTrace(), transform.BatchScale(0.5)); err != nil || held != nil {
		t.Errorf("batch scale: late end %v, error %v; want none", held != nil, err)
	}
}

// TestApplyIsDeterministic: a transformation gives the same trace every time, event for event and address
// for address, so that a what-if replays the same way every time it is asked.
func TestApplyIsDeterministic(t *testing.T) {
	traces := map[string]*snapshot.Snapshot{"tiny": snapshottest.Trace(snapshottest.Tiny()), "adam": adamModel(3),
		"blocks": blocksTrace(true), "held": heldTrace()}
	for name, s := range traces {
		for _, tr := range []transform.Transform{transform.BatchScale(0.5), transform.Accumulate(3),
			transform.SwitchOptimizer(knob.SGD), transform.SwitchOptimizer(knob.AdamW8bit),
			transform.ZeroGrad(knob.ZeroGradZero), transform.ZeroGrad(knob.ZeroGradNone),
			transform.OptimizerImpl(knob.ForLoop), transform.Checkpoint(knob.CheckpointAll),
			transform.Checkpoint(knob.CheckpointEvery(2))} {
			var first []snapshot.Event
			for run := range 8 {
				out, _, err := transform.Apply(s, tr)
				if err != nil {
					break
				}
				var got []snapshot.Event
				for _, e := range out.Events.All() {
					got = append(got, e)
				}
				if run == 0 {
					first = got
				} else if !reflect.DeepEqual(got, first) {
					t.Errorf("%s, %s: run %d gives another trace than the first", name, tr.Name, run)
					break
				}
			}
		}
	}
}
