package knob

import (
	"fmt"
	"strings"
)

// Optimizer names an optimizer (--optimizer): torch.optim's and bitsandbytes'.
type Optimizer string

// The optimizers.
const (
	SGD      Optimizer = "sgd"      // torch.optim.SGD without momentum: no state
	Momentum Optimizer = "momentum" // torch.optim.SGD with momentum: one buffer per parameter
	Adam     Optimizer = "adam"     // torch.optim.Adam: exp_avg and exp_avg_sq per parameter
	AdamW    Optimizer = "adamw"    // torch.optim.AdamW: as Adam
	// AdamW8bit is bitsandbytes.optim.AdamW8bit (HF Trainer's adamw_bnb_8bit): both states in 8 bits,
	// quantized blockwise.
	AdamW8bit Optimizer = "adamw8bit"
	// PagedAdamW is bitsandbytes.optim.PagedAdamW (paged_adamw_32bit): float32 state in unified memory.
	PagedAdamW Optimizer = "paged-adamw"
	// PagedAdamW8bit is bitsandbytes.optim.PagedAdamW8bit (paged_adamw_8bit).
	PagedAdamW8bit Optimizer = "paged-adamw8bit"
)

// Optimizers lists every optimizer.
var Optimizers = []Optimizer{SGD, Momentum, Adam, AdamW, AdamW8bit, PagedAdamW, PagedAdamW8bit}

// ParseOptimizer returns the optimizer named s.
func ParseOptimizer(s string) (Optimizer, error) {
	for _, o := range Optimizers {
		if Optimizer(s) == o {
			return o, nil
		}
	}
	names := make([]string, len(Optimizers))
	for i, o := range Optimizers {
		names[i] = string(o)
	}
	return "", fmt.Errorf("unknown optimizer %q (want %s or %s)", s, strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
}

// MarshalText returns the optimizer's name.
func (o Optimizer) MarshalText() ([]byte, error) { return []byte(o), nil }

// UnmarshalText reads an optimizer's name (ParseOptimizer).
func (o *Optimizer) UnmarshalText(text []byte) error { return parseInto(o, ParseOptimizer, text) }

// States is how many state tensors the optimizer keeps per parameter.
func (o Optimizer) States() int {
	switch o {
	case Momentum:
		return 1
	case Adam, AdamW, AdamW8bit, PagedAdamW, PagedAdamW8bit:
		return 2
	}
	return 0
}

// Paged reports whether the optimizer keeps its state in CUDA unified memory, outside the caching allocator.
func (o Optimizer) Paged() bool { return o == PagedAdamW || o == PagedAdamW8bit }

// EightBit reports whether the optimizer keeps its state in 8 bits (bitsandbytes' blockwise quantization).
func (o Optimizer) EightBit() bool { return o == AdamW8bit || o == PagedAdamW8bit }

// OptimizerImpl is how torch.optim runs Adam and AdamW (--optimizer-impl).
type OptimizerImpl string

// The implementations.
const (
	// Foreach is _multi_tensor_adam, PyTorch's default on CUDA: each step's temporaries for all parameters at
	// once.
	Foreach OptimizerImpl = "foreach"
	// Fused is _fused_adam (fused=True): one kernel, no temporaries, a step counter on the device per
	// parameter.
	Fused OptimizerImpl = "fused"
	// ForLoop is _single_tensor_adam (foreach=False): one parameter's temporaries at a time.
	ForLoop OptimizerImpl = "for-loop"
)

// ParseOptimizerImpl returns the implementation named s ("" is Foreach).
func ParseOptimizerImpl(s string) (OptimizerImpl, error) {
	switch i := OptimizerImpl(s); i {
	case "":
		return Foreach, nil
	case Foreach, Fused, ForLoop:
		return i, nil
	}
	return "", fmt.Errorf("unknown optimizer implementation %q (want foreach, fused or for-loop)", s)
}

// MarshalText returns the implementation's name.
func (i OptimizerImpl) MarshalText() ([]byte, error) { return []byte(i), nil }

// UnmarshalText reads an implementation's name (ParseOptimizerImpl); "" stays the zero value, which is
// Foreach.
func (i *OptimizerImpl) UnmarshalText(text []byte) error {
	v, err := ParseOptimizerImpl(string(text))
	if err != nil {
		return err
	}
	if len(text) == 0 {
		v = ""
	}
	*i = v
	return nil
}
