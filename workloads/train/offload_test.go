package train

import (
	"context"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/dist"
)

// TestOffloadWords checks --offload's list reads back as it was written, and what it refuses.
func TestOffloadWords(t *testing.T) {
	for s, want := range map[string]Offload{
		"none":                         {},
		"optimizer":                    {Parallel: dist.OffloadOptimizer},
		"optimizer+params":             {Parallel: dist.OffloadOptimizerParams},
		"activations":                  {Activations: ActivationOffloadStreams},
		"activations:sync":             {Activations: ActivationOffloadSync},
		"optimizer+activations":        {Parallel: dist.OffloadOptimizer, Activations: ActivationOffloadStreams},
		"optimizer+params+activations": {Parallel: dist.OffloadOptimizerParams, Activations: ActivationOffloadStreams},
	} {
		o, err := ParseOffload(s)
		if err != nil || o != want || o.String() != s {
			t.Errorf("%q: %+v (%q), %v; want %+v", s, o, o.String(), err, want)
		}
	}
	for s, want := range map[string]string{
		"activations+activations": "names the activations twice",
		"disk":                    "unknown offload \"disk\"",
		"params+activations":      "unknown offload",
	} {
		if _, err := ParseOffload(s); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", s, err, want)
		}
	}
}

// TestActivationOffloadInARun records a small Llama's run with its activations offloaded: with the copy
// stream, the tensors brought back in backward are allocated on stream 1 (torchtune's `with self.s1:
// gpu_tensor = maybe_gpu_tensor.to(device)`), never in the forward; without it, everything is on the default
// stream. Either way the forward ends holding less on the device than without offloading, and the host holds
// pinned memory.
func TestActivationOffloadInARun(t *testing.T) {
	base := smallLlama(t)
	base.Steps, base.Checkpoint, base.AMP = 2, knob.CheckpointOff, knob.AMPBF16
	forwardEnd := func(res *Result) int64 {
		for _, p := range res.Phases {
			if p.Iteration == 1 && p.Phase == snapshot.PhaseForward {
				return p.End
			}
		}
		t.Fatal("no forward in the second step")
		return 0
	}
	plain, _, err := Run(context.Background(), base, nil)
	if err != nil || plain.OOM != nil {
		t.Fatal(err, plain.OOM)
	}
	for _, mode := range []ActivationOffload{ActivationOffloadStreams, ActivationOffloadSync} {
		c := base
		c.ActivationOffload = mode
		res, s := record(t, c)
		if res.OOM != nil {
			t.Fatal(res.OOM.Message)
		}
		side := map[snapshot.Phase]int{}
		for _, e := range s.Events.Slice(0, s.Events.Len()) {
			if e.Action == snapshot.ActionAlloc && e.Stream != 0 {
				side[e.Phase]++
			}
		}
		if mode == ActivationOffloadStreams && (side[snapshot.PhaseBackward] == 0 || len(side) != 1) {
			t.Errorf("%s: allocations on the copy stream by phase %v; want some, in backward only", mode, side)
		}
		if mode == ActivationOffloadSync && len(side) != 0 {
			t.Errorf("%s: allocations on other streams %v", mode, side)
		}
		if got, was := forwardEnd(res), forwardEnd(plain); got >= was {
			t.Errorf("%s: the forward ends holding %d bytes, %d without offloading", mode, got, was)
		}
		if res.Host.PeakAllocated == 0 || res.Host.Pinned == 0 {
			t.Errorf("%s: host %+v", mode, res.Host)
		}
	}
	c := DefaultMLP()
	c.ActivationOffload = ActivationOffloadStreams
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "activation offloading applies to the gpt and llama models") {
		t.Errorf("mlp: %v", err)
	}
}
