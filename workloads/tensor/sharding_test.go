package tensor

import (
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
)

// FSDP frees a unit's gathered parameters after forward while autograd holds them, and allocates them again
// before backward: the saved references must see the memory come and go, and the gradients must be those of
// a run that never freed anything.
func TestFreeStorageKeepsSavedReferencesValid(t *testing.T) {
	t.Parallel()
	grads := func(free bool) []float32 {
		rt := newCPU(t)
		m := newMLP(rt)
		loss, act := m.forward()
		act.Release()
		if free {
			before := allocated(rt)
			m.w2.FreeStorage()
			m.w2.FreeStorage() // twice does nothing
			if got, want := allocated(rt), before-block(m.ou*m.hid*4); got != want {
				t.Fatalf("after FreeStorage %d bytes allocated, want %d", got, want)
			}
			if !m.w2.StorageFreed() || m.w2.Addr() != 0 {
				t.Fatal("the storage does not say it is freed")
			}
			m.w2.AllocStorage()
			if got := allocated(rt); got != before {
				t.Fatalf("after AllocStorage %d bytes allocated, want %d", got, before)
			}
		}
		loss.Backward(false)
		loss.Release()
		return slices.Concat(m.w1.Grad().Values(), m.w2.Grad().Values())
	}
	if want, got := grads(false), grads(true); !slices.Equal(want, got) {
		t.Fatal("gradients differ after the weight's memory was freed and allocated again")
	}

	// Releasing the last reference to a freed storage frees nothing twice.
	rt := newMeta(t, 1<<30)
	x := rt.Zeros(F32, []int{256}, "x", snapshot.CategoryParameter)
	x.FreeStorage()
	x.Release()
	if allocated(rt) != 0 {
		t.Fatalf("%d bytes left", allocated(rt))
	}
}

// DDP's reducer and DeepSpeed's flattening make each parameter a view of one flat buffer (param.data =
// view); training through the views must give the same gradients, and the parameters' own memory goes.
func TestSetDataRebindsEveryReference(t *testing.T) {
	t.Parallel()
	rt := newCPU(t)
	m := newMLP(rt)
	want := m.w1.Values()
	saved := m.w1.Ref() // another reference to the same object, as autograd would hold
	n := m.w1.Numel() + m.b1.Numel()
	flat := rt.Zeros(F32, []int{n + 3}, "flat", snapshot.CategoryParameter) // padded, as flat buffers are
	before := allocated(rt)
	view := flat.Narrow(0, 0, m.w1.Numel())
	shaped := view.View(m.hid, m.in)
	view.Release()
	Copy_(shaped, m.w1)
	m.w1.SetData(shaped)
	shaped.Release()
	if got, freed := allocated(rt), before-block(m.hid*m.in*4); got != freed {
		t.Fatalf("after SetData %d bytes allocated, want %d (the weight's own block freed)", got, freed)
	}
	if !saved.SharesStorage(flat) || !slices.Equal(saved.Values(), want) || !slices.Equal(m.w1.Shape(), []int{m.hid, m.in}) {
		t.Fatal("a reference made before SetData does not see the flat buffer's values")
	}
	saved.Release()
	loss, act := m.forward()
	act.Release()
	loss.Backward(false)
	loss.Release()
	if m.w1.Grad() == nil || m.w1.Grad().SharesStorage(flat) {
		t.Fatal("the gradient of a view parameter is not a gradient of its own")
	}
	flat.Release()
}

// OnGradAccumulated runs once per backward for each leaf, after its gradient is in .grad, even for a
// parameter used twice (tied weights), and may replace the gradient.
func TestOnGradAccumulated(t *testing.T) {
	t.Parallel()
	rt := newCPU(t)
	w := rt.Randn(F32, []int{4, 4}, 1, "w", snapshot.CategoryParameter).SetRequiresGrad(true).SetName("w")
	x := rt.Randn(F32, []int{2, 4}, 1, "x", snapshot.CategoryInput)
	var seen []*Tensor
	bucket := rt.Zeros(F32, []int{16}, "bucket", snapshot.CategoryGradient)
	w.OnGradAccumulated(func() {
		seen = append(seen, w.Grad())
		v := bucket.View(4, 4)
		Copy_(v, w.Grad())
		w.SetGrad(v) // gradient_as_bucket_view: the gradient becomes the bucket's view
	})
	h := Linear(x, w, nil)
	y := Linear(h, w, nil) // w used twice
	h.Release()
	loss := MSELoss(y, rt.Zeros(F32, []int{2, 4}, "zero", snapshot.CategoryInput))
	y.Release()
	loss.Backward(false)
	if len(seen) != 1 {
		t.Fatalf("the hook ran %d times, want once", len(seen))
	}
	if !w.Grad().SharesStorage(bucket) || !slices.Equal(w.Grad().Values(), bucket.Values()) {
		t.Fatal("the gradient is not the bucket view the hook set")
	}
	loss.Release()
}

// The scope hook sees every module's forward and, in backward, every op's module.
func TestScopeHook(t *testing.T) {
	t.Parallel()
	rt := newMeta(t, 1<<30)
	var log []string
	rt.SetScopeHook(func(path string, enter bool) {
		if enter {
			log = append(log, "+"+path+":"+rt.Phase().String())
		} else {
			log = append(log, "-"+path)
		}
	})
	w := rt.Randn(F32, []int{4, 4}, 1, "w", snapshot.CategoryParameter).SetRequiresGrad(true).SetName("w")
	x := rt.Randn(F32, []int{2, 4}, 1, "x", snapshot.CategoryInput)
	rt.SetPhase(snapshot.PhaseForward)
	leave := rt.Scope("fc")
	y := Linear(x, w, nil)
	leave()
	loss := MSELoss(y, x)
	rt.SetPhase(snapshot.PhaseBackward)
	loss.Backward(false)
	// Forward enters and leaves fc once; backward runs the loss's node outside any module and fc's nodes
	// (the matmul and the weight's transpose) inside it, each entered and left.
	if len(log) < 4 || log[0] != "+fc:forward" || log[1] != "-fc" || !slices.Contains(log, "+fc:backward") {
		t.Fatalf("scopes seen: %q", log)
	}
	var open []string
	for _, e := range log {
		path, _, _ := strings.Cut(e[1:], ":")
		if e[0] == '+' {
			open = append(open, path)
			continue
		}
		if len(open) == 0 || open[len(open)-1] != path {
			t.Fatalf("%q leaves a scope it did not enter: %q", e, log)
		}
		open = open[:len(open)-1]
	}
	if len(open) != 0 {
		t.Fatalf("scopes left open: %q", open)
	}
}

// Pinned host memory goes through the caching host allocator's power-of-two blocks; pageable memory does not.
func TestPinnedHostTensors(t *testing.T) {
	t.Parallel()
	h := allocator.NewHostAllocator()
	rt := NewRuntime(device.NewHost(device.Meta, h), nil, 1)
	a := rt.Zeros(F32, []int{1000}, "pageable", snapshot.CategoryOptimizerState)
	var b *Tensor
	rt.Pinned(func() { b = rt.Zeros(F32, []int{1000}, "pinned", snapshot.CategoryGradient) })
	if got := h.Stats().Allocated; got != 4000+4096 {
		t.Fatalf("host allocated %d, want 4000 pageable + 4096 pinned", got)
	}
	a.Release()
	b.Release()
	if st := h.Stats(); st.Allocated != 0 || st.Reserved != 4096 {
		t.Fatalf("after release: %+v, want the pinned block cached", st)
	}
}
