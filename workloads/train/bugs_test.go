package train

import (
	"context"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// The PyTorch twins of the MLP's loop under the no-zero-grad and module-attribute bugs: DefaultMLP's
// shape (32 in, 128 hidden, 2 hidden layers, 8 classes, batch 64) and Adam.
const bugsScript = `
import json, torch, torch.nn as nn, torch.nn.functional as F, weakref
torch.manual_seed(0)
def mlp():
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 8))
out = {}

# No zero_grad: .grad is the same tensor on the same storage after every backward, holding the sum of every
# step's gradients.
net = mlp()
params = list(net.parameters())
opt = torch.optim.Adam(params, lr=1e-2)
x, y = torch.randn(64, 32), torch.randint(0, 8, (64,))
ptrs, ids, sums = [], [], []
expect = [torch.zeros_like(p) for p in params]
for step in range(3):
    g = torch.autograd.grad(F.cross_entropy(net(x), y), params)
    expect = [e + gi for e, gi in zip(expect, g)]
    F.cross_entropy(net(x), y).backward()
    ptrs.append([p.grad.data_ptr() for p in params])
    ids.append([id(p.grad) for p in params])
    sums.append(all(torch.allclose(p.grad, e, atol=1e-6) for p, e in zip(params, expect)))
    opt.step()
out["grads_same_storage"] = all(p == ptrs[0] for p in ptrs)
out["grads_same_tensor"] = all(i == ids[0] for i in ids)
out["grads_are_sums"] = all(sums)
out["grad_bytes"] = sum(p.grad.storage().nbytes() for p in params)
out["grad_count"] = len(params)

# self.intermediate = the output, on every Linear: after backward the graph's saved tensors are gone and
# the output tensor stays, one per module.
net = mlp()
linears = [m for m in net if isinstance(m, nn.Linear)]
for m in linears:
    m.register_forward_hook(lambda m, i, o: setattr(m, "intermediate", o))
opt = torch.optim.Adam(net.parameters(), lr=1e-2)
pptrs = {p.storage().data_ptr() for p in net.parameters()}
class Slot:
    def __init__(s, t): s.t = t
slots = []
def pack(t):
    if t.storage().data_ptr() in pptrs:
        return t
    s = Slot(t)
    slots.append(weakref.ref(s))
    return s
def unpack(s): return s.t if isinstance(s, Slot) else s
def alive(): return [r() for r in slots if r() is not None]
held, after = [], []
for step in range(3):
    x, y = torch.randn(64, 32), torch.randint(0, 8, (64,))
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = F.cross_entropy(net(x), y)
    del x, y
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True); del loss
    held.append(sum(m.intermediate.storage().nbytes() for m in linears))
    after.append(len(alive()))
    slots.clear()
out["attribute_held"] = held
out["attribute_saved_after_step"] = after
# A forward with no backward after it: the attributes keep its graph and what the graph saved.
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    net(torch.randn(64, 32))
kept = alive()
out["attribute_saved_slots_without_backward"] = len(kept)
out["attribute_saved_bytes_without_backward"] = sum({s.t.storage().data_ptr(): s.t.storage().nbytes() for s in kept}.values())
print(json.dumps(out))
`

type bugsTruth struct {
	GradsSameStorage bool    `json:"grads_same_storage"`
	GradsSameTensor  bool    `json:"grads_same_tensor"`
	GradsAreSums     bool    `json:"grads_are_sums"`
	GradBytes        int64   `json:"grad_bytes"`
	GradCount        int     `json:"grad_count"`
	AttributeHeld    []int64 `json:"attribute_held"`
	AttributeAfter   []int   `json:"attribute_saved_after_step"`
	SavedSlots       int     `json:"attribute_saved_slots_without_backward"`
	SavedBytes       uint64  `json:"attribute_saved_bytes_without_backward"`
}

func pytorchBugs(t *testing.T) bugsTruth {
	t.Helper()
	var truth bugsTruth
	torchtest.Run(t, bugsScript, &truth)
	return truth
}

// TestNoZeroGradAccumulatesInPlace: without zero_grad, PyTorch keeps each .grad on one storage and adds
// every step's gradient into it. The recording must show the same: one gradient block per parameter,
// allocated by the first backward and never freed, as many bytes as PyTorch's gradients, no new gradient
// block in a later step and no zero_grad phase; the fixed loop allocates them every step and frees them in
// zero_grad.
func TestNoZeroGradAccumulatesInPlace(t *testing.T) {
	truth := pytorchBugs(t)
	if !truth.GradsSameStorage || !truth.GradsSameTensor || !truth.GradsAreSums {
		t.Fatalf("PyTorch does not accumulate in place as this test assumes: %+v", truth)
	}
	const steps = 4
	for _, bug := range []string{BugNoZeroGrad, ""} {
		cfg := DefaultMLP()
		cfg.Steps, cfg.Bug = steps, bug
		_, s := record(t, cfg)
		tl := timeline.New(s)
		var count int
		var bytes int64
		for id := range tl.NumAllocations() {
			b := tl.Allocation(id, tl.Len()-1)
			if b.Category != snapshot.CategoryGradient {
				continue
			}
			count++
			bytes += b.Requested
			if bug == "" {
				if b.Free < 0 || s.Events.At(b.Free).Phase != snapshot.PhaseZeroGrad {
					t.Errorf("fixed loop: a gradient of iteration %d is not freed by zero_grad", b.Iteration)
				}
				continue
			}
			if b.Iteration != 0 || b.Phase != snapshot.PhaseBackward || b.Free >= 0 {
				t.Errorf("no-zero-grad: a gradient block allocated in iteration %d, %s, freed at %d; want the first backward's, never freed",
					b.Iteration, b.Phase, b.Free)
			}
		}
		want := truth.GradCount
		if bug == "" {
			want *= steps
		}
		if count != want {
			t.Errorf("bug %q: %d gradient blocks, want %d (%d parameters)", bug, count, want, truth.GradCount)
		}
		if bug != "" && bytes != truth.GradBytes {
			t.Errorf("no-zero-grad: %d bytes of gradients held, PyTorch's .grad hold %d", bytes, truth.GradBytes)
		}
		zeroGrads := 0
		for _, p := range tl.Phases() {
			if p.Phase == snapshot.PhaseZeroGrad {
				zeroGrads++
			}
		}
		if bug != "" && zeroGrads != 0 || bug == "" && zeroGrads != steps {
			t.Errorf("bug %q: %d zero_grad phases in %d steps", bug, zeroGrads, steps)
		}
	}
}

// TestModuleAttributeHoldsWhatPyTorchHolds: a module that keeps its output on self holds, after each step,
// that tensor alone (backward freed what its graph saved) and as many bytes as PyTorch's modules do; a
// forward with no backward after it leaves the graph's saved tensors held too, as in PyTorch.
func TestModuleAttributeHoldsWhatPyTorchHolds(t *testing.T) {
	truth := pytorchBugs(t)
	cfg := DefaultMLP()
	cfg.Steps, cfg.Bug = 3, BugModuleAttribute
	_, s := record(t, cfg)
	tl := timeline.New(s)
	dumps := 0
	for _, d := range tl.HeapDumps() {
		if d.Reason != "iteration end" {
			continue
		}
		var held int64
		for _, b := range tl.LiveAt(d.Seq, nil) {
			p, ok := tl.RetainerPath(b, d.Seq)
			if ok && strings.HasSuffix(p.Root(), ".intermediate") {
				held += b.Requested
				if len(p.Holders) != 1 {
					t.Errorf("iteration %d: %s is held through %d holders; after backward only the attribute holds it", d.Iteration, p.Root(), len(p.Holders))
				}
			}
		}
		for _, e := range s.Events.Slice(d.Seq+1, d.Seq+1+d.Edges) {
			if strings.Contains(s.String(e.Text), " saved ") {
				t.Errorf("iteration %d: %q is alive after the step; PyTorch holds %v saved tensors then", d.Iteration, s.String(e.Text), truth.AttributeAfter)
			}
		}
		if held != truth.AttributeHeld[d.Iteration] {
			t.Errorf("iteration %d: the attributes hold %d bytes, PyTorch's %d", d.Iteration, held, truth.AttributeHeld[d.Iteration])
		}
		dumps++
	}
	if dumps != cfg.Steps {
		t.Fatalf("%d iteration-end heap dumps, want %d", dumps, cfg.Steps)
	}

	// A forward alone: what the attributes' graphs saved stays.
	r, err := newRun(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = r.rt.Catch(func() {
		r.setup()
		x, y := r.data.batch(r.rt, r.nextBatch(), "batch")
		r.setPhase(snapshot.PhaseForward)
		r.mlp.Forward(x).Release()
		x.Release()
		y.Release()
	})
	if err != nil {
		t.Fatal(err)
	}
	var slots int
	var bytes uint64
	for _, st := range r.rt.SavedTensors() {
		slots += len(st.Holders)
		bytes += st.Bytes
	}
	if slots != truth.SavedSlots || bytes != truth.SavedBytes {
		t.Errorf("a forward without backward leaves %d saved slots of %d bytes held; PyTorch %d of %d", slots, bytes, truth.SavedSlots, truth.SavedBytes)
	}
}

// TestModuleAttributeOnTheGPT: each attention block keeps its qkv projection, B x T x 3D float32 values,
// under the name of its module; nothing else is held for it.
func TestModuleAttributeOnTheGPT(t *testing.T) {
	cfg, err := PresetConfig("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Device, cfg.Steps, cfg.Bug = "meta", 3, BugModuleAttribute
	_, s := record(t, cfg)
	tl := timeline.New(s)
	dumps := tl.HeapDumps()
	last := dumps[len(dumps)-1]
	want := int64(cfg.Batch * cfg.Seq * 3 * cfg.DModel * tensor.F32.Size())
	held := map[string]int64{}
	for _, b := range tl.LiveAt(last.Seq, nil) {
		if p, ok := tl.RetainerPath(b, last.Seq); ok && strings.HasSuffix(p.Root(), ".intermediate") {
			held[p.Root()] += b.Requested
		}
	}
	if len(held) != cfg.Layers {
		t.Fatalf("held by %v, want one attribute per block (%d)", held, cfg.Layers)
	}
	for root, n := range held {
		if !strings.HasPrefix(root, "transformer.h.") || !strings.HasSuffix(root, ".attn.intermediate") || n != want {
			t.Errorf("%s holds %d bytes, want an attention's qkv of %d", root, n, want)
		}
	}
}

// TestModuleAttributeOnTheLlama: each decoder layer keeps its output, batch x seq x d_model in the weights'
// dtype, under the name of its module.
func TestModuleAttributeOnTheLlama(t *testing.T) {
	cfg, err := PresetConfig("smollm2-135m")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Device, cfg.Steps, cfg.Batch, cfg.Seq, cfg.Layers, cfg.Bug = "meta", 3, 1, 64, 2, BugModuleAttribute
	_, s := record(t, cfg)
	tl := timeline.New(s)
	dumps := tl.HeapDumps()
	last := dumps[len(dumps)-1]
	want := int64(cfg.Batch * cfg.Seq * cfg.DModel * cfg.Weights.dtype().Size())
	held := map[string]int64{}
	for _, b := range tl.LiveAt(last.Seq, nil) {
		if p, ok := tl.RetainerPath(b, last.Seq); ok && strings.HasSuffix(p.Root(), ".intermediate") {
			held[p.Root()] += b.Requested
		}
	}
	if len(held) != cfg.Layers {
		t.Fatalf("held by %v, want one attribute per decoder layer (%d)", held, cfg.Layers)
	}
	for root, n := range held {
		if !strings.HasPrefix(root, "model.layers.") || n != want {
			t.Errorf("%s holds %d bytes, want a layer's output of %d", root, n, want)
		}
	}
}
