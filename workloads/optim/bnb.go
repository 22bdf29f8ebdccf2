package optim

import (
	"github.com/oomdbg/oomdbg/internal/optimrules"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// bitsandbytes' AdamW (bitsandbytes/optim/optimizer.py Optimizer2State, adamw.py AdamW8bit, PagedAdamW,
// PagedAdamW8bit), as its memory goes:
//   - state is made lazily, parameter by parameter, when step() first reaches it (init_state);
//   - 8-bit state: state1 and state2 one byte per element (uint8, blockwise quantized with the signed and
//     unsigned dynamic maps), a float32 absmax per block for each, and the two maps once per optimizer
//     (fill_qmap, moved to the device); a small parameter keeps float32 state (optimrules.Blockwise8bit);
//   - paged: state1 and state2 of parameters of at least 1e5 elements come from get_paged, CUDA unified
//     memory outside PyTorch's allocator, and are prefetched to the device before each update; the driver
//     evicts them to host when the device needs the room (allocator.ManagedMemory);
//   - the update is one kernel per parameter (optimizer_update_8bit_blockwise / optimizer_update_32bit),
//     in place: no temporaries.

type bnb struct {
	base
	cfg   Config
	bits8 bool
	paged bool
	state map[*nn.Parameter]*bnbState
	qmaps []*tensor.Tensor // name2qmap["dynamic"], ["udynamic"] on the device
}

type bnbState struct {
	step             int
	state1, state2   *tensor.Tensor
	absmax1, absmax2 *tensor.Tensor // 8-bit state only
}

func newBNB(rt *tensor.Runtime, params []*nn.Parameter, cfg Config) *bnb {
	return &bnb{base: base{rt: rt, params: params}, cfg: cfg, bits8: cfg.Kind != knob.PagedAdamW, paged: cfg.Kind != knob.AdamW8bit,
		state: map[*nn.Parameter]*bnbState{}}
}

func (o *bnb) Step() {
	o.noGrad(func() {
		for _, p := range o.params {
			g := p.Tensor.Grad()
			if g == nil {
				continue
			}
			st := o.state[p]
			if st == nil {
				st = o.initState(p)
				o.state[p] = st
			}
			st.state1.Prefetch() // prefetch_state: F.prefetch_tensor of paged state
			st.state2.Prefetch()
			st.step++
			o.update(p, g, st)
		}
	})
}

// initState is Optimizer2State.init_state.
func (o *bnb) initState(p *nn.Parameter) *bnbState {
	prev := o.rt.SetCategory(snapshot.CategoryOptimizerState)
	defer o.rt.SetCategory(prev)
	st := &bnbState{}
	n := p.Tensor.Numel()
	eight, blocks := optimrules.Blockwise8bit(n)
	dtype := tensor.U8
	if !o.bits8 || !eight {
		dtype = tensor.F32
	}
	if dtype == tensor.U8 && o.qmaps == nil { // fill_qmap, then .to(p.device)
		o.qmaps = []*tensor.Tensor{
			o.newState(o.rt.Zeros(tensor.F32, []int{optimrules.QMapEntries}, "qmap.dynamic", snapshot.CategoryOptimizerState), p, "qmap1"),
			o.newState(o.rt.Zeros(tensor.F32, []int{optimrules.QMapEntries}, "qmap.udynamic", snapshot.CategoryOptimizerState), p, "qmap2"),
		}
	}
	buffer := func(role string) *tensor.Tensor { // get_state_buffer
		if o.paged && n >= optimrules.PagedMin {
			return o.rt.EmptyManaged(dtype, p.Tensor.Shape(), role, snapshot.CategoryOptimizerState)
		}
		return o.rt.Zeros(dtype, p.Tensor.Shape(), role, snapshot.CategoryOptimizerState)
	}
	st.state1 = o.newState(buffer("state1"), p, "state1")
	st.state2 = o.newState(buffer("state2"), p, "state2")
	if dtype == tensor.U8 {
		st.absmax1 = o.newState(o.rt.Zeros(tensor.F32, []int{blocks}, "absmax1", snapshot.CategoryOptimizerState), p, "absmax1")
		st.absmax2 = o.newState(o.rt.Zeros(tensor.F32, []int{blocks}, "absmax2", snapshot.CategoryOptimizerState), p, "absmax2")
	}
	return st
}

// update is AdamW's update in one kernel, decoupled weight decay first; 8-bit state is requantized
// blockwise afterwards (the kernel dequantizes, updates and quantizes each block).
func (o *bnb) update(p *nn.Parameter, g *tensor.Tensor, st *bnbState) {
	c := o.cfg
	if c.WeightDecay != 0 {
		tensor.Scale_(p.Tensor, 1-c.LR*c.WeightDecay)
	}
	tensor.AddFused_(st.state1, st.state2, g, nil, 0, c.Beta1, c.Beta2)
	bc1, bc2 := 1-pow(c.Beta1, st.step), 1-pow(c.Beta2, st.step)
	tensor.AdamUpdate_(p.Tensor, st.state1, st.state2, -c.LR/bc1, sqrt32(bc2), c.Eps)
	if st.absmax1 != nil {
		tensor.Requantize8_(st.state1, st.absmax1, true, optimrules.Blocksize)
		tensor.Requantize8_(st.state2, st.absmax2, false, optimrules.Blocksize)
	}
}

// Paged returns the optimizer's bytes in unified memory.
func (o *bnb) Paged() uint64 {
	var n uint64
	for _, s := range o.state {
		for _, t := range []*tensor.Tensor{s.state1, s.state2} {
			if t.Managed() {
				n += t.Bytes()
			}
		}
	}
	return n
}
