package nn

import (
	"fmt"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/alloc"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// TestMLPSavesWhatPyTorchSaves compares the bytes autograd keeps for backward at the end of the forward pass
// (the loss included) with PyTorch's, counted by torch.autograd.graph.saved_tensors_hooks once per storage,
// parameters excluded, for several shapes.
func TestMLPSavesWhatPyTorchSaves(t *testing.T) {
	shapes := []MLPConfig{
		{In: 16, Hidden: 32, Layers: 1, Classes: 4},
		{In: 784, Hidden: 512, Layers: 3, Classes: 10},
		{In: 7, Hidden: 129, Layers: 2, Classes: 3},
	}
	batches := []int{8, 64, 5}
	var script strings.Builder
	script.WriteString(`
import json, torch, torch.nn as nn, torch.nn.functional as F
def saved(b, i, h, l, c):
    layers = [nn.Linear(i, h), nn.ReLU()]
    for _ in range(l - 1):
        layers += [nn.Linear(h, h), nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(h, c))
    params = {p.storage().data_ptr() for p in net.parameters()}
    seen = {}
    def pack(t):
        st = t.storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t
    x, y = torch.randn(b, i), torch.randint(0, c, (b,))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(net(x), y)
    return sum(seen.values())
out = []
`)
	for i, s := range shapes {
		fmt.Fprintf(&script, "out.append(saved(%d, %d, %d, %d, %d))\n", batches[i], s.In, s.Hidden, s.Layers, s.Classes)
	}
	script.WriteString("print(json.dumps(out))\n")
	var want []uint64
	torchtest.Run(t, script.String(), &want)

	for i, s := range shapes {
		t.Run(fmt.Sprintf("batch %d %+v", batches[i], s), func(t *testing.T) {
			rt := tensor.NewRuntime(device.NewSimulated(device.Meta, 0, 8<<30, 0, alloc.DefaultConfig()), nil, 1)
			m := NewMLP(rt, s)
			x := rt.Zeros(tensor.F32, []int{batches[i], s.In}, "x", snapshot.CategoryInput)
			y := rt.Zeros(tensor.I64, []int{batches[i]}, "y", snapshot.CategoryInput)
			loss := m.Loss(x, y)
			var got uint64
			for _, st := range rt.SavedTensors() {
				got += st.Bytes
			}
			if got != want[i] {
				for _, st := range rt.SavedTensors() {
					t.Logf("saved %s (%d bytes) by %v", st.Label, st.Bytes, st.Holders)
				}
				t.Errorf("saved %d bytes for backward, PyTorch %d", got, want[i])
			}
			loss.Release()
			x.Release()
			y.Release()
			ReleaseParameters(m)
		})
	}
}
