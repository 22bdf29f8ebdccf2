package nn

import (
	"fmt"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// TestMLPSavesWhatPyTorchSaves compares the bytes autograd keeps for backward at the end of the forward pass
// (the loss included) with PyTorch's, counted by torch.autograd.graph.saved_tensors_hooks once per storage,
// parameters excluded, for several shapes: in float32 and under bfloat16 autocast. CPU autocast treats
// linear and relu as CUDA autocast does; cross_entropy, which CPU autocast lists as fp32 and CUDA does not
// list, is called as CUDA runs it (LossNLL.cpp cross_entropy_loss_symint): nll_loss(log_softmax(x, 1,
// x.dtype)), nll_loss being fp32 in both.
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
def saved(b, i, h, l, c, amp):
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
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        z = net(x)
        assert z.dtype == (torch.bfloat16 if amp else torch.float32), z.dtype
        loss = F.nll_loss(F.log_softmax(z, 1, dtype=z.dtype), y) if amp else F.cross_entropy(z, y)
    return sum(seen.values())
out = []
`)
	amps := []tensor.DType{tensor.F32, tensor.BF16}
	for _, amp := range amps {
		for i, s := range shapes {
			fmt.Fprintf(&script, "out.append(saved(%d, %d, %d, %d, %d, %v))\n", batches[i], s.In, s.Hidden, s.Layers, s.Classes,
				map[bool]string{true: "True", false: "False"}[amp != tensor.F32])
		}
	}
	script.WriteString("print(json.dumps(out))\n")
	var want []uint64
	torchtest.Run(t, script.String(), &want)

	for k, amp := range amps {
		for i, s := range shapes {
			want := want[k*len(shapes)+i]
			t.Run(fmt.Sprintf("%v batch %d %+v", amp, batches[i], s), func(t *testing.T) {
				rt := tensor.NewRuntime(device.NewSimulated(device.Meta, 0, 8<<30, 0, allocator.DefaultConfig()), nil, 1)
				m := NewMLP(rt, s)
				x := rt.Zeros(tensor.F32, []int{batches[i], s.In}, "x", snapshot.CategoryInput)
				y := rt.Zeros(tensor.I64, []int{batches[i]}, "y", snapshot.CategoryInput)
				loss := autocastLoss(rt, amp, func() *tensor.Tensor { return m.Loss(x, y) })
				var got uint64
				for _, st := range rt.SavedTensors() {
					got += st.Bytes
				}
				if got != want {
					for _, st := range rt.SavedTensors() {
						t.Logf("saved %s (%d bytes) by %v", st.Label, st.Bytes, st.Holders)
					}
					t.Errorf("saved %d bytes for backward, PyTorch %d", got, want)
				}
				loss.Release()
				x.Release()
				y.Release()
				ReleaseParameters(m)
			})
		}
	}
}
