package train

import (
	"fmt"
	"strings"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// ActivationOffload is whether a run moves the activations its model's forward saves to pinned host memory,
// as torchtune's OffloadActivations does (enable_activation_offloading): off, with a copy stream and its
// stashes (streams, torchtune's default), or on the compute stream (sync: activation_offloading_use_streams
// false).
type ActivationOffload uint8

// The activation offloads.
const (
	ActivationOffloadOff ActivationOffload = iota
	ActivationOffloadStreams
	ActivationOffloadSync
)

var activationOffloadNames = []string{"off", "streams", "sync"}

// ParseActivationOffload reads an activation offload: off, streams or sync ("" is off).
func ParseActivationOffload(s string) (ActivationOffload, error) {
	i, err := parseWord(activationOffloadNames, "activation offload", s)
	return ActivationOffload(i), err
}

func (a ActivationOffload) String() string {
	return nameOf(activationOffloadNames, int(a), "activation offload")
}
func (a ActivationOffload) MarshalText() ([]byte, error) { return []byte(a.String()), nil }
func (a *ActivationOffload) UnmarshalText(text []byte) error {
	return parseInto(a, ParseActivationOffload, text)
}

// Offload is everything a run keeps in host memory (--offload): the data-parallel strategy's optimizer state
// and parameters (dist.Offload: DeepSpeed's offload_optimizer and offload_param, FSDP's CPUOffload) and the
// activations. It is written as its parts joined by '+': none, optimizer, optimizer+params, activations,
// activations:sync, optimizer+activations, optimizer+params+activations, ...
type Offload struct {
	Parallel    dist.Offload
	Activations ActivationOffload
}

// The words of the activations in an --offload list.
const (
	offloadActivations     = "activations"
	offloadActivationsSync = "activations:sync"
)

// ParseOffload reads an --offload list ("" and none are nothing).
func ParseOffload(s string) (Offload, error) {
	var o Offload
	var rest []string
	for _, part := range strings.Split(s, "+") {
		switch part {
		case offloadActivations, offloadActivationsSync:
			if o.Activations != ActivationOffloadOff {
				return Offload{}, fmt.Errorf("offload %q names the activations twice", s)
			}
			o.Activations = ActivationOffloadStreams
			if part == offloadActivationsSync {
				o.Activations = ActivationOffloadSync
			}
		default:
			rest = append(rest, part)
		}
	}
	if len(rest) > 0 {
		p, err := dist.ParseOffload(strings.Join(rest, "+"))
		if err != nil {
			return Offload{}, fmt.Errorf("unknown offload %q (want none, optimizer, optimizer+params, activations or activations:sync, joined by +)", s)
		}
		o.Parallel = p
	}
	return o, nil
}

func (o Offload) String() string {
	var parts []string
	if o.Parallel != dist.OffloadNone {
		parts = append(parts, o.Parallel.String())
	}
	switch o.Activations {
	case ActivationOffloadStreams:
		parts = append(parts, offloadActivations)
	case ActivationOffloadSync:
		parts = append(parts, offloadActivationsSync)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "+")
}

// Offload returns what the configuration keeps in host memory.
func (c *Config) Offload() Offload {
	return Offload{Parallel: c.Parallel.Offload, Activations: c.ActivationOffload}
}

// SetOffload sets what the configuration keeps in host memory.
func (c *Config) SetOffload(o Offload) {
	c.Parallel.Offload, c.ActivationOffload = o.Parallel, o.Activations
}

// torchtune's OffloadActivations defaults (min_offload_size, max_fwd_stash_size).
const (
	offloadMinBytes = 1024
	offloadMaxStash = 5
)

// validateActivationOffload checks the models activation offloading applies to: those with an output head
// it can leave out, as torchtune's recipes leave model.output.
func (c *Config) validateActivationOffload() error {
	if c.ActivationOffload > ActivationOffloadSync {
		return fmt.Errorf("invalid activation offload %d", c.ActivationOffload)
	}
	if c.ActivationOffload != ActivationOffloadOff && c.Model != "gpt" && c.Model != "llama" {
		return fmt.Errorf("activation offloading applies to the gpt and llama models (their output head, lm_head, runs without it)")
	}
	return nil
}

// hostRuntime returns the run's host memory, made the first time it is asked for: where a rank offloads
// its optimizer and where activations go.
func (r *run) hostRuntime() *tensor.Runtime {
	if r.host == nil {
		h := allocator.NewHostAllocator()
		var tr tensor.Tracer
		if r.rec != nil {
			ht := newHostTracker(r.rec)
			h.SetObserver(ht.observe)
			tr = ht
		}
		r.host = tensor.NewRuntime(device.NewHost(r.cfg.Device, h), tr, r.cfg.Seed)
	}
	return r.host
}

// setActivationOffload installs the saved-tensor hooks of --offload activations.
func (r *run) setActivationOffload() {
	if r.cfg.ActivationOffload == ActivationOffloadOff {
		return
	}
	r.rt.SetActivationOffload(&tensor.ActivationOffload{Host: r.hostRuntime(),
		Streams: r.cfg.ActivationOffload == ActivationOffloadStreams, MinBytes: offloadMinBytes,
		MaxStash: offloadMaxStash, Head: "lm_head"})
}
