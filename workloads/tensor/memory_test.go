package tensor

import (
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/versions"
)

// block is the size the caching allocator hands out for n bytes of a small tensor: rounded up to 512.
func block(n int) int64 { return int64((n + 511) / 512 * 512) }

// mlp is a two-layer perceptron built by hand: x (batch, in) -> Linear -> ReLU -> Linear -> MSE.
type mlp struct {
	rt                 *Runtime
	w1, b1, w2, b2     *Tensor
	x, target          *Tensor
	batch, in, hid, ou int
}

func newMLP(rt *Runtime) *mlp {
	m := &mlp{rt: rt, batch: 8, in: 16, hid: 32, ou: 4}
	param := func(name string, shape ...int) *Tensor {
		return rt.Randn(F32, shape, 0.1, name, snapshot.CategoryParameter).SetRequiresGrad(true).SetName(name)
	}
	m.w1, m.b1 = param("fc1.weight", m.hid, m.in), param("fc1.bias", m.hid)
	m.w2, m.b2 = param("fc2.weight", m.ou, m.hid), param("fc2.bias", m.ou)
	m.x = rt.Randn(F32, []int{m.batch, m.in}, 1, "x", snapshot.CategoryInput).SetName("x")
	m.target = rt.Randn(F32, []int{m.batch, m.ou}, 1, "y", snapshot.CategoryInput).SetName("y")
	return m
}

// forward returns the loss and, while the graph is alive, the ReLU output (for inspection).
func (m *mlp) forward() (loss, act *Tensor) {
	h := Linear(m.x, m.w1, m.b1)
	a := ReLU(h)
	h.Release() // h is not saved by anyone: ReLU saves its result, not its input
	y := Linear(a, m.w2, m.b2)
	loss = MSELoss(y, m.target)
	y.Release()
	return loss, a
}

func (m *mlp) paramBytes() int64 {
	return block(m.hid*m.in*4) + block(m.hid*4) + block(m.ou*m.hid*4) + block(m.ou*4)
}

// savedBytes is what autograd keeps between forward and backward: the ReLU output (saved by ReluBackward0 and
// AddmmBackward0) and the second layer's output (saved by MseLossBackward0).
func (m *mlp) savedBytes() int64 { return block(m.batch*m.hid*4) + block(m.batch*m.ou*4) }

func (m *mlp) inputBytes() int64 { return block(m.batch*m.in*4) + block(m.batch*m.ou*4) }

func TestAutogradFreesSavedTensorsDuringBackward(t *testing.T) {
	rt := newMeta(t, 1<<30)
	m := newMLP(rt)
	base := m.paramBytes() + m.inputBytes()
	if got := allocated(rt); got != base {
		t.Fatalf("after setup %d bytes allocated, want %d", got, base)
	}

	loss, act := m.forward()
	if act.Category() != snapshot.CategoryActivation {
		t.Errorf("ReLU output saved by autograd has category %v, want activation", act.Category())
	}
	act.Release() // the graph still holds it: saved by ReluBackward0 (result) and AddmmBackward0 (mat1)
	// Alive now: params, inputs, the saved ReLU output, the output y MseLossBackward0 saved, the loss.
	if got, want := allocated(rt), base+m.savedBytes()+block(4); got != want {
		t.Errorf("after forward %d bytes allocated, want %d (params, inputs, saved activations, loss)", got, want)
	}

	loss.Backward(false)
	if m.w1.Grad() == nil || m.b2.Grad() == nil {
		t.Fatal("backward left parameters without gradients")
	}
	if m.x.Grad() != nil {
		t.Error("an input that does not require grad got a gradient")
	}
	if m.w1.Grad().Category() != snapshot.CategoryGradient {
		t.Errorf("weight gradient has category %v", m.w1.Grad().Category())
	}
	// Saved activation freed; gradients the size of the parameters now live.
	if got, want := allocated(rt), base+m.paramBytes()+block(4); got != want {
		t.Errorf("after backward %d bytes allocated, want %d (params, grads, inputs, loss)", got, want)
	}

	// A second backward through a freed graph is PyTorch's error.
	if r := recovered(func() { loss.Backward(false) }); r != ErrBackwardTwice {
		t.Errorf("second backward panicked with %v, want ErrBackwardTwice", r)
	}
}

// recovered runs f and returns what it panicked with, or nil.
func recovered(f func()) (r any) {
	defer func() { r = recover() }()
	f()
	return nil
}

func TestRetainGraphKeepsSavedTensors(t *testing.T) {
	rt := newMeta(t, 1<<30)
	m := newMLP(rt)
	loss, act := m.forward()
	act.Release()
	before := allocated(rt)
	loss.Backward(true)
	grads := m.paramBytes()
	if got := allocated(rt); got != before+grads {
		t.Errorf("after backward(retain_graph) %d bytes, want %d: saved activation kept, grads added", got, before+grads)
	}
	loss.Backward(false) // allowed once more; accumulates into the same gradient storage
	if got, want := allocated(rt), before+grads-m.savedBytes(); got != want {
		t.Errorf("after the final backward %d bytes, want %d", got, want)
	}
	loss.Release()
}

func TestNoGradSavesNothing(t *testing.T) {
	rt := newMeta(t, 1<<30)
	m := newMLP(rt)
	base := allocated(rt)
	rt.NoGrad(func() {
		loss, act := m.forward()
		if act.GradFn() != nil || act.Category() != snapshot.CategoryTemporary {
			t.Errorf("no_grad output has grad_fn %v and category %v", act.GradFn(), act.Category())
		}
		act.Release()
		if got := allocated(rt); got != base+block(4) {
			t.Errorf("under no_grad %d bytes allocated after forward, want %d (only the loss)", got, base+block(4))
		}
		loss.Release()
	})
}

func TestGradientAccumulationIsInPlace(t *testing.T) {
	rt := newMeta(t, 1<<30)
	m := newMLP(rt)
	for step := range 3 {
		loss, act := m.forward()
		act.Release()
		loss.Backward(false)
		loss.Release()
		if step == 0 {
			continue
		}
		if got, want := allocated(rt), m.paramBytes()*2+m.inputBytes(); got != want {
			t.Errorf("micro-batch %d: %d bytes allocated, want %d (gradients accumulated in place)", step, got, want)
		}
	}
}

func TestViewsAndCopies(t *testing.T) {
	rt := newMeta(t, 1<<30)
	x := rt.Empty(F32, []int{4, 6, 8}, "x")
	base := allocated(rt)
	tests := map[string]struct {
		f      func() *Tensor
		copies bool
	}{
		"view":                      {func() *Tensor { return x.View(24, 8) }, false},
		"reshape contiguous":        {func() *Tensor { return x.Reshape(4, 48) }, false},
		"transpose":                 {func() *Tensor { return x.Transpose(0, 1) }, false},
		"split":                     {func() *Tensor { return x.Split(4, 2)[0] }, false},
		"dropout p=0":               {func() *Tensor { return Dropout(x, 0, true) }, false},
		"dropout eval":              {func() *Tensor { return Dropout(x, 0.1, false) }, false},
		"contiguous of contiguous":  {func() *Tensor { return x.Contiguous() }, false},
		"reshape of transpose":      {func() *Tensor { tr := x.Transpose(1, 2); defer tr.Release(); return tr.Reshape(4, 48) }, true},
		"contiguous of transpose":   {func() *Tensor { tr := x.Transpose(1, 2); defer tr.Release(); return tr.Contiguous() }, true},
		"merge of split dimensions": {func() *Tensor { v := x.View(4, 6, 2, 4); defer v.Release(); return v.Reshape(24, 8) }, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			y := tc.f()
			grew := allocated(rt) != base
			if grew != tc.copies {
				t.Errorf("allocated %d bytes more; copies=%v, want %v", allocated(rt)-base, grew, tc.copies)
			}
			if !tc.copies && !y.SharesStorage(x) {
				t.Error("a view does not share its base's storage")
			}
			y.Release()
			if allocated(rt) != base {
				t.Errorf("releasing the result left %d bytes", allocated(rt)-base)
			}
		})
	}
	x.Release()
}

func TestOOMUnwindsWithTheAllocatorMessage(t *testing.T) {
	rt := newMeta(t, 48<<20)
	var hooked *OOMError
	rt.OnOOM(func(e *OOMError) { hooked = e })
	keep := rt.Empty(F32, []int{8 << 20}, "big") // 32 MiB
	err := rt.Catch(func() {
		rt.Empty(F32, []int{8 << 20}, "too much") // another 32 MiB does not fit in 48 MiB with the first
	})
	if !IsOOM(err) || hooked == nil || hooked.Label != "f32[8388608] too much" {
		t.Fatalf("got %v (hooked %v), want an OOM of the second tensor", err, hooked)
	}
	if want := "CUDA out of memory. Tried to allocate 32.00 MiB."; len(err.Error()) < len(want) || err.Error()[:len(want)] != want {
		t.Errorf("message %q does not start with %q", err.Error(), want)
	}
	keep.Release()
}

func TestRetainersNameWhoKeepsALeakedGraph(t *testing.T) {
	rt := newMeta(t, 1<<30)
	m := newMLP(rt)
	loss, act := m.forward()
	loss.Backward(true)             // retain_graph=True ...
	loss.SetName("loss_history[7]") // ... while the loss is kept in a list
	actAddr := act.Addr()
	act.Release()

	edges := rt.Retainers()
	byID := map[uint64]Retainer{}
	for _, e := range edges {
		if _, dup := byID[e.Holder]; dup {
			t.Fatalf("holder %d listed twice", e.Holder)
		}
		byID[e.Holder] = e
	}
	// Every live block is held by someone.
	held := map[uint64]bool{}
	for _, e := range edges {
		held[e.Addr] = true
	}
	for h := rt.handles; h != nil; h = h.next {
		if !held[h.Addr()] {
			t.Errorf("live block %s has no retainer", h.describe())
		}
	}
	// The saved ReLU output's shortest path leads, through the second layer that saved it, to the loss in the
	// history list.
	path := retainerPath(edges, actAddr)
	want := []string{"AddmmBackward0 saved mat1", "AddmmBackward0", "MseLossBackward0", "loss_history[7]"}
	if len(path) != len(want) {
		t.Fatalf("retainer path %q, want %q", path, want)
	}
	for i := range want {
		if path[i] != want[i] {
			t.Fatalf("retainer path %q, want %q", path, want)
		}
	}
	// Gradients hang off their parameters.
	found := false
	for _, e := range edges {
		if e.Description == "fc1.weight.grad" && byID[e.Parent].Description == "fc1.weight" {
			found = true
		}
	}
	if !found {
		t.Error("no retainer fc1.weight.grad held by fc1.weight")
	}
}

func TestGraphIsFreedWhenItsOutputIsDropped(t *testing.T) {
	rt := newMeta(t, 1<<30)
	m := newMLP(rt)
	base := allocated(rt)
	// An evaluation with grad on whose output nobody keeps: PyTorch frees the graph, and what it saved,
	// with the last reference to the output.
	loss, act := m.forward()
	act.Release()
	if allocated(rt) == base+block(4) {
		t.Fatal("forward saved nothing; the test needs a graph")
	}
	loss.Release()
	if got := allocated(rt); got != base {
		t.Errorf("%d bytes left after dropping the loss of a forward without backward", got-base)
	}
	if n := len(rt.SavedTensors()); n != 0 {
		t.Errorf("%d saved tensors survive their graph", n)
	}
}

// TestRetainersNameACtxAttribute follows a ctx attribute: bitsandbytes 0.41.1's MatMul4Bit keeps its input
// in ctx.tensors, which outlives the backward for as long as the graph does; an output held by the loop's
// logits holds the graph, and so the input, whose path leads to it.
func TestRetainersNameACtxAttribute(t *testing.T) {
	rt := newMeta(t, 1<<30)
	old, err := versions.Parse("bitsandbytes=0.41.1")
	if err != nil {
		t.Fatal(err)
	}
	rt.SetVersions(old)
	w := rt.Zeros(BF16, []int{64, 32}, "w", snapshot.CategoryParameter)
	q := Quantize4Bit(w, snapshot.CategoryParameter)
	w.Release()
	x0 := rt.Zeros(BF16, []int{4, 32}, "x0", snapshot.CategoryInput).SetRequiresGrad(true)
	x := Scale(x0, 2) // a non-leaf input, as a layer's is
	y := MatMul4Bit(x, q, nil)
	s := Sum(y)
	s.Backward(false)
	s.Release()
	y.SetName("logits")
	xAddr := x.Addr()
	x.Release()

	want := []string{"MatMul4BitBackward holds ctx.tensors", "MatMul4BitBackward", "logits"}
	if path := retainerPath(rt.Retainers(), xAddr); !slices.Equal(path, want) {
		t.Errorf("retainer path of the kept input %q, want %q", path, want)
	}
	y.Release()
	x0.Release()
	q.Release()
}

// retainerPath is the path from the first non-root holder of the block at addr up to its root, each holder
// described.
func retainerPath(edges []Retainer, addr uint64) []string {
	byID := map[uint64]Retainer{}
	for _, e := range edges {
		byID[e.Holder] = e
	}
	for _, e := range edges {
		if e.Addr != addr || e.Parent == 0 {
			continue
		}
		var path []string
		for cur := e; ; cur = byID[cur.Parent] {
			path = append(path, cur.Description)
			if cur.Parent == 0 {
				return path
			}
		}
	}
	return nil
}
