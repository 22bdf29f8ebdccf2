package nn

import "github.com/oomdbg/oomdbg/workloads/tensor"

// MLPConfig shapes a multilayer perceptron classifier.
type MLPConfig struct {
	In      int // input features
	Hidden  int // hidden width
	Layers  int // hidden layers (>= 1)
	Classes int // output classes
	DType   tensor.DType
}

// MLP is Linear(in, hidden), ReLU, then Layers-1 times Linear(hidden, hidden), ReLU, then Linear(hidden,
// classes), trained with cross-entropy: nn.Sequential in PyTorch, so its layers are named "net.0", "net.1", ...
type MLP struct {
	base
	Config MLPConfig
	Net    *Sequential
}

// NewMLP allocates an MLP's parameters on rt's device.
func NewMLP(rt *tensor.Runtime, cfg MLPConfig) *MLP {
	m := &MLP{base: base{rt, ""}, Config: cfg, Net: NewSequential(rt, "net")}
	in := cfg.In
	for range max(cfg.Layers, 1) {
		m.Net.Add(NewLinear(rt, m.Net.Child(), in, cfg.Hidden, true, cfg.DType))
		m.Net.Add(NewReLU(rt, m.Net.Child()))
		in = cfg.Hidden
	}
	m.Net.Add(NewLinear(rt, m.Net.Child(), in, cfg.Classes, true, cfg.DType))
	return m
}

// Parameters returns every parameter in PyTorch's order.
func (m *MLP) Parameters() []*Parameter { return m.Net.Parameters() }

// Forward returns the logits for a batch x of shape (batch, in).
func (m *MLP) Forward(x *tensor.Tensor) *tensor.Tensor { return m.Net.Forward(x) }

// Loss returns the mean cross-entropy of the logits of x against the class indices y; the logits are freed
// as soon as it is computed.
func (m *MLP) Loss(x, y *tensor.Tensor) *tensor.Tensor {
	logits, loss := m.ForwardLoss(x, y)
	logits.Release()
	return loss
}

// ForwardLoss returns the logits of x and their mean cross-entropy against the class indices y; the caller
// owns both.
func (m *MLP) ForwardLoss(x, y *tensor.Tensor) (logits, loss *tensor.Tensor) {
	logits = m.Forward(x)
	return logits, tensor.CrossEntropy(logits, y)
}
