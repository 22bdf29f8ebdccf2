package train

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist"
)

// What a data-parallel rank holds, checked against the ZeRO paper's formulas (Rajbhandari et al.,
// arXiv 1910.02054, section 5: with mixed-precision Adam, 16 bytes a parameter for DDP, 4 + 12/N for stage
// 1, 2 + 14/N for stage 2, 16/N for stage 3 and FSDP) and against each implementation's layout rules, with
// every expected byte count derived here from the parameter count and the rules, not from the runtime.

// distGPT is a small nanoGPT whose large matrices are past ZeRO-3's persistence threshold (1e5 elements).
func distGPT() Config {
	c := gpt(4, 4, 256, 32, 500, 2)
	c.Bias = true
	c.AMP, c.Attention, c.Optimizer, c.Steps = knob.AMPBF16, knob.AttentionFlash, "adamw", 2
	c.GPUMemory = 1 << 40
	return c
}

// gptParams are the parameter counts of distGPT, in registration order (nanoGPT's): wte, wpe, then per
// block ln_1 (weight, bias), c_attn, attn c_proj, ln_2, c_fc, mlp c_proj (weight, bias each), then ln_f.
func gptParams(c Config) []int64 {
	d, v, t := int64(c.DModel), int64(c.Vocab), int64(c.Seq)
	ps := []int64{v * d, t * d}
	for range c.Layers {
		ps = append(ps, d, d, 3*d*d, 3*d, d*d, d, d, d, 4*d*d, 4*d, 4*d*d, d)
	}
	return append(ps, d, d)
}

// gptParamRows are the first dimensions of distGPT's parameters, in gptParams' order (PyTorch's shapes:
// an nn.Linear weight is (out, in), so c_attn's is (3d, d) and the MLP's c_proj's (d, 4d)).
func gptParamRows(c Config) []int64 {
	d, v, t := int64(c.DModel), int64(c.Vocab), int64(c.Seq)
	rows := []int64{v, t}
	for range c.Layers {
		rows = append(rows, d, d, 3*d, 3*d, d, d, d, d, 4*d, 4*d, d, d)
	}
	return append(rows, d, d)
}

func sum(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

// liveBlock is a block alive in a replay of a snapshot's events.
type liveBlock struct {
	cat       snapshot.Category
	label     string
	requested int64
}

// replay walks s's events, keeping the live blocks of device 0 with their categories and labels, and calls
// at after each event.
func replay(s *snapshot.Snapshot, at func(seq int, e *snapshot.Event, live map[uint64]*liveBlock)) {
	live := map[uint64]*liveBlock{}
	for i, ep := range s.Events.All() {
		e := &ep
		if e.Device == 0 {
			switch e.Action {
			case snapshot.ActionAlloc:
				live[e.Addr] = &liveBlock{e.Category, s.String(e.Label), e.Size}
			case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
				delete(live, e.Addr)
			case snapshot.ActionCategory:
				if b := live[e.Addr]; b != nil {
					b.cat = e.Category
				}
			}
		}
		at(i, e, live)
	}
}

// modelStates sums the requested bytes of parameters, gradients and optimizer state, leaving out the
// communication buffers (DeepSpeed's reduce buckets), which the paper counts apart, as residual memory.
func modelStates(live map[uint64]*liveBlock) (total int64, by map[string]int64) {
	by = map[string]int64{}
	for _, b := range live {
		switch b.cat {
		case snapshot.CategoryParameter, snapshot.CategoryGradient, snapshot.CategoryOptimizerState:
			if strings.Contains(b.label, "ipg_bucket") {
				continue
			}
			total += b.requested
			by[b.cat.String()] += b.requested
		}
	}
	return total, by
}

// atStep returns the model states when the optimizer phase of iteration 1 begins: every gradient reduced,
// the optimizer's state made in iteration 0.
func atStep(t *testing.T, s *snapshot.Snapshot) (int64, map[string]int64) {
	t.Helper()
	var total int64
	var by map[string]int64
	found := false
	replay(s, func(_ int, e *snapshot.Event, live map[uint64]*liveBlock) {
		if !found && e.Action == snapshot.ActionPhase && e.Phase == snapshot.PhaseOptimizer && e.Iteration == 1 {
			total, by = modelStates(live)
			found = true
		}
	})
	if !found {
		t.Fatal("no optimizer phase in iteration 1")
	}
	return total, by
}

// zeroLayout is DeepSpeed stage 1/2's partition, derived here: the flat group padded to a multiple of
// 2N, N equal partitions, and rank 0's grads_in_partition holding every parameter that reaches into the
// first partition, whole.
func zeroLayout(ps []int64, n int) (aligned, part, gradsRank0 int64) {
	total := sum(ps)
	aligned = (total + int64(2*n) - 1) / int64(2*n) * int64(2*n)
	part = aligned / int64(n)
	var off int64
	for _, p := range ps {
		if off < part {
			gradsRank0 += p
		}
		off += p
	}
	return aligned, part, gradsRank0
}

func ceil(a, b int64) int64 { return (a + b - 1) / b }

func TestModelStatesPerRankFollowTheZeROFormulas(t *testing.T) {
	t.Parallel()
	base := distGPT()
	ps := gptParams(base)
	psi := sum(ps)
	if all, _, err := ModelParameters(base); err != nil || int64(all) != psi {
		t.Fatalf("the model has %d parameters, the formula says %d (%v)", all, psi, err)
	}
	// FSDP's units: each block, and the root (wte, wpe, ln_f).
	perBlock := sum(ps[2:14])
	root := ps[0] + ps[1] + ps[len(ps)-2] + ps[len(ps)-1]

	for _, n := range []int{2, 4, 8} {
		aligned, part, grads0 := zeroLayout(ps, n)
		var z3parts, persisted int64
		for _, p := range ps {
			z3parts += ceil(p, int64(n))
			if p <= dist.DefaultParamPersistenceThreshold {
				persisted += p // gathered once, kept whole: 2 bytes each
			}
		}
		fsdpShards := ceil(root, int64(n)) + int64(base.Layers)*ceil(perBlock, int64(n))
		var fsdp2Shards int64 // FSDP2: each parameter's rows padded to ceil(rows/N), its other dimensions whole
		for i, rows := range gptParamRows(base) {
			fsdp2Shards += ceil(rows, int64(n)) * (ps[i] / rows)
		}
		paper := map[dist.Strategy]float64{ // bytes per rank
			dist.DDP:      16 * float64(psi),
			dist.ZeRO1:    4*float64(psi) + 12*float64(psi)/float64(n),
			dist.ZeRO2:    2*float64(psi) + 14*float64(psi)/float64(n),
			dist.ZeRO3:    16 * float64(psi) / float64(n),
			dist.FSDPFull: 16 * float64(psi) / float64(n),
			dist.FSDP2:    16 * float64(psi) / float64(n),
		}
		cases := []struct {
			name string
			s    dist.Settings
			want int64 // at the step, from the implementation's layout
			// slack is how far the implementation's layout may be from the paper's formula, and why.
			slack int64
		}{
			// gradient_as_bucket_view: the gradients are the buckets, 4 + 4 + 8 bytes a parameter.
			{"ddp gradient_as_bucket_view", dist.Settings{GPUs: n, Strategy: dist.DDP, GradientAsBucketView: true}, 16 * psi, 0},
			// DDP's default copies gradients into the buckets: 4 more bytes a parameter than the paper's.
			{"ddp", dist.Settings{GPUs: n, Strategy: dist.DDP}, 20 * psi, 4 * psi},
			// At the step stage 1 has reduced its gradients to its partition, as stage 2 has all along;
			// what it holds during backward is checked below.
			{"zero1", dist.Settings{GPUs: n, Strategy: dist.ZeRO1}, 2*aligned + 2*grads0 + 12*part, 2*psi + 2*(grads0-part) + 14*(aligned-psi)},
			// Rank 0's gradient buffer holds whole the parameters reaching into its partition.
			{"zero2", dist.Settings{GPUs: n, Strategy: dist.ZeRO2}, 2*aligned + 2*grads0 + 12*part, 2*(grads0-part) + 14*(aligned-psi)},
			// Each partition padded to ceil(numel/N); parameters under the persistence threshold stay whole.
			{"zero3", dist.Settings{GPUs: n, Strategy: dist.ZeRO3}, 16*z3parts + 2*persisted, 16*(z3parts-ceil(psi, int64(n))) + 2*persisted},
			// Each unit's shard padded to ceil(numel/N).
			{"fsdp-full", dist.Settings{GPUs: n, Strategy: dist.FSDPFull}, 16 * fsdpShards, 16 * (fsdpShards - ceil(psi, int64(n)))},
			// Each parameter's shard padded on dim 0 (DTensor Shard(0)); nothing flattened.
			{"fsdp2", dist.Settings{GPUs: n, Strategy: dist.FSDP2}, 16 * fsdp2Shards, 16 * (fsdp2Shards - ceil(psi, int64(n)))},
		}
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/N=%d", c.name, n), func(t *testing.T) {
				t.Parallel()
				cfg := base
				cfg.Parallel = c.s
				_, s := record(t, cfg)
				got, by := atStep(t, s)
				if got != c.want {
					t.Errorf("model states at the step: %d bytes (%v), want %d", got, by, c.want)
				}
				formula := paper[c.s.Strategy]
				if d := float64(got) - formula; d < -float64(c.slack)-1 || d > float64(c.slack)+1 {
					t.Errorf("%d bytes is %+.0f from the paper's %.0f; the layout explains at most %d", got, d, formula, c.slack)
				}
			})
		}
		// Stage 2's step: the partition's gradients flattened (2 bytes), converted to fp32 (4 bytes), both
		// alive for a moment with the gradient buffer, the master copy and Adam's moments: 2 + 20/N, above
		// DeepSpeed's own estimate of 2 + 18/N (estimate_zero2_model_states_mem_needs), which leaves out the
		// flat 16-bit copy.
		t.Run(fmt.Sprintf("zero2 in the step/N=%d", n), func(t *testing.T) {
			t.Parallel()
			cfg := base
			cfg.Parallel = dist.Settings{GPUs: n, Strategy: dist.ZeRO2}
			_, s := record(t, cfg)
			var peak int64
			phase, iter := snapshot.PhaseNone, int32(-1)
			replay(s, func(_ int, e *snapshot.Event, live map[uint64]*liveBlock) {
				if e.Action == snapshot.ActionPhase {
					phase, iter = e.Phase, e.Iteration
				}
				if phase == snapshot.PhaseOptimizer && iter == 1 {
					total, _ := modelStates(live)
					peak = max(peak, total)
				}
			})
			if want := 2*aligned + 2*grads0 + 2*part + 4*part + 12*part; peak != want {
				t.Errorf("model states peak in the step at %d bytes, want %d", peak, want)
			}
			estimate := 2*float64(psi) + 18*float64(psi)/float64(n)
			if float64(peak) <= estimate {
				t.Errorf("the step's %d bytes are within DeepSpeed's estimate %.0f", peak, estimate)
			}
		})
		// Stage 1 keeps every 16-bit gradient until the backward ends: the paper's 4 + 12/N.
		t.Run(fmt.Sprintf("zero1 in backward/N=%d", n), func(t *testing.T) {
			t.Parallel()
			cfg := base
			cfg.Parallel = dist.Settings{GPUs: n, Strategy: dist.ZeRO1}
			_, s := record(t, cfg)
			var peak int64
			phase := snapshot.PhaseNone
			var iter int32
			replay(s, func(_ int, e *snapshot.Event, live map[uint64]*liveBlock) {
				if e.Action == snapshot.ActionPhase {
					phase, iter = e.Phase, e.Iteration
				}
				if phase == snapshot.PhaseBackward && iter == 1 {
					total, _ := modelStates(live)
					peak = max(peak, total)
				}
			})
			want := 2*aligned + 2*psi + 12*part // the flat half parameters, every gradient, the fp32 partition's 12 bytes
			if peak != want {
				t.Errorf("model states peak in backward at %d bytes, want %d", peak, want)
			}
			if d := float64(peak) - paper[dist.ZeRO1]; d < 0 || d > float64(14*(aligned-psi)) {
				t.Errorf("%d bytes is %+.0f from the paper's 4+12/N; the alignment padding explains %d", peak, d, 14*(aligned-psi))
			}
		})
	}
}

// FSDP's docs and its rate limiter (_limiter_utils.py: two all-gathers in flight) say memory holds the unit
// computing and the next one. With streams, the unit's padded buffer is allocated on the unshard stream and
// freed after record_stream on the default stream, whose work runs only as far as the host waits for it;
// before each all-gather the limiter waits for the oldest queued free event once two or more are queued,
// one per all-gather. Worked through by hand for the 4 blocks here: the first forward holds the unit in use
// and one freed whose memory is not yet reusable; backward reshards one unit more than it all-gathers (the
// root), so the queue enters iteration 1 with a backlog and its limiter waits one free later: one unit in
// use and two held in forward, two in use (BACKWARD_PRE prefetches the unit before) and one held in
// backward; three held at most in both. The root unit stays gathered from its forward to the end of
// backward. Without streams (OneStream) the second unit is gathered early instead: two in use, none held.
// SHARD_GRAD_OP keeps every unit gathered from its forward to its backward.
func TestFSDPHoldsTwoUnshardedUnits(t *testing.T) {
	t.Parallel()
	for _, oneStream := range []bool{false, true} {
		for _, ckpt := range []knob.Checkpoint{knob.CheckpointOff, knob.CheckpointAll} {
			for _, strategy := range []dist.Strategy{dist.FSDPFull, dist.FSDPGradOp} {
				t.Run(fmt.Sprintf("%s/checkpoint %s/one stream %v", strategy, ckpt, oneStream), func(t *testing.T) {
					t.Parallel()
					cfg := distGPT()
					cfg.Checkpoint = ckpt
					cfg.Parallel = dist.Settings{GPUs: 4, Strategy: strategy, OneStream: oneStream}
					_, s := record(t, cfg)
					checkFSDPUnits(t, cfg, s, oneStream)
				})
			}
		}
	}
}

// checkFSDPUnits counts the block units unsharded (in use) and held (in use or freed with their memory
// not yet reusable) through iteration 1 of s.
func checkFSDPUnits(t *testing.T, cfg Config, s *snapshot.Snapshot, oneStream bool) {
	t.Helper()
	type peak struct {
		bytes             int64
		units             int
		root              bool
		maxUnits, maxHeld int
	}
	peaks := map[snapshot.Phase]*peak{snapshot.PhaseForward: {}, snapshot.PhaseBackward: {}}
	held := map[uint64]bool{} // unit buffers from their alloc to their free_completed
	var allocated int64
	phase, iter := snapshot.PhaseNone, int32(-1)
	replay(s, func(_ int, e *snapshot.Event, live map[uint64]*liveBlock) {
		switch e.Action {
		case snapshot.ActionPhase:
			phase, iter = e.Phase, e.Iteration
		case snapshot.ActionAlloc:
			if b := live[e.Addr]; b != nil && strings.Contains(b.label, "fsdp.unsharded[transformer.h.") {
				held[e.Addr] = true
			}
		case snapshot.ActionFreeCompleted:
			delete(held, e.Addr)
		}
		allocated = 0
		units, root := 0, false
		for _, b := range live {
			allocated += b.requested
			if strings.HasPrefix(b.label, "f32[") || strings.HasPrefix(b.label, "bf16[") {
				if strings.Contains(b.label, "fsdp.unsharded[transformer.h.") {
					units++
				}
				root = root || strings.Contains(b.label, "fsdp.unsharded[root]")
			}
		}
		if phase == snapshot.PhaseRecompute {
			phase = snapshot.PhaseBackward
		}
		p := peaks[phase]
		if p == nil || iter != 1 {
			return
		}
		p.maxUnits, p.maxHeld = max(p.maxUnits, units), max(p.maxHeld, len(held))
		if allocated > p.bytes {
			p.bytes, p.units, p.root = allocated, units, root
		}
	})
	for ph, p := range peaks {
		if cfg.Parallel.Strategy == dist.FSDPGradOp {
			if ph == snapshot.PhaseBackward && p.maxUnits != cfg.Layers {
				t.Errorf("%s: SHARD_GRAD_OP held at most %d units, want all %d", ph, p.maxUnits, cfg.Layers)
			}
			continue
		}
		inUse, heldMax := 2, 2
		if !oneStream {
			heldMax = 3
			if ph == snapshot.PhaseForward {
				inUse = 1
			}
		}
		if p.units != inUse || p.maxUnits != inUse || !p.root || p.maxHeld != heldMax {
			t.Errorf("%s: %d block units unsharded at the peak (root: %v), at most %d in use and %d held anywhere; want %d, %d, the root and %d",
				ph, p.units, p.root, p.maxUnits, p.maxHeld, inUse, inUse, heldMax)
		}
	}
}

// fully_shard's FSDPParamGroup (_fsdp_param_group.py), worked through by hand: a group's pre-forward
// allocates its all-gather output on the copy-in stream while the previous group's is still kept
// (AllGatherState), then frees that one and copies out into its own unsharded parameters; its post-forward
// frees them. So forward holds one block group unsharded and at most two all-gather outputs. In backward
// each group's output is freed right after its copy-out and the group before it is prefetched: one group
// unsharded, one output. With reshard_after_forward false every block group stays unsharded from its
// forward through backward until its post-backward, and the only output in backward is the last forward
// group's, kept until the root's post-forward (which the runtime sees when backward first reaches a group).
func TestFSDP2GathersOneGroupAtATime(t *testing.T) {
	t.Parallel()
	for _, reshard := range []dist.Reshard{dist.ReshardTrue, dist.ReshardFalse} {
		t.Run("reshard_after_forward "+reshard.String(), func(t *testing.T) {
			t.Parallel()
			cfg := distGPT()
			cfg.Checkpoint = knob.CheckpointAll
			cfg.Parallel = dist.Settings{GPUs: 4, Strategy: dist.FSDP2, ReshardAfterForward: reshard}
			_, s := record(t, cfg)
			type most struct{ groups, outputs int }
			seen := map[snapshot.Phase]*most{snapshot.PhaseForward: {}, snapshot.PhaseBackward: {}}
			phase, iter := snapshot.PhaseNone, int32(-1)
			replay(s, func(_ int, e *snapshot.Event, live map[uint64]*liveBlock) {
				if e.Action == snapshot.ActionPhase {
					phase, iter = e.Phase, e.Iteration
				}
				groups, outputs := map[string]bool{}, 0
				for _, b := range live {
					if _, rest, ok := strings.Cut(b.label, "fsdp2.unsharded_param[transformer.h."); ok {
						groups[rest[:strings.IndexByte(rest, '.')]] = true
					}
					if strings.Contains(b.label, "fsdp2.all_gather_output[transformer.h.") {
						outputs++
					}
				}
				ph := phase
				if ph == snapshot.PhaseRecompute {
					ph = snapshot.PhaseBackward
				}
				if m := seen[ph]; m != nil && iter == 1 {
					m.groups, m.outputs = max(m.groups, len(groups)), max(m.outputs, outputs)
				}
			})
			want := map[snapshot.Phase]most{snapshot.PhaseForward: {1, 2}, snapshot.PhaseBackward: {1, 1}}
			if reshard == dist.ReshardFalse {
				want = map[snapshot.Phase]most{snapshot.PhaseForward: {cfg.Layers, 2}, snapshot.PhaseBackward: {cfg.Layers, 1}}
			}
			for ph, w := range want {
				if got := *seen[ph]; got != w {
					t.Errorf("%s: at most %d block groups unsharded and %d all-gather outputs alive; want %d and %d",
						ph, got.groups, got.outputs, w.groups, w.outputs)
				}
			}
		})
	}
}

// DDP's buckets are what the reducer's compute_bucket_assignment_by_size makes of the gradients in the order
// autograd made them in the first iteration: the rule is applied here to that order, read from the
// snapshot (a gradient is a block whose category became gradient), and compared with the buckets the
// second iteration allocates.
func TestDDPBucketsFollowBucketCapMB(t *testing.T) {
	t.Parallel()
	for _, capMB := range []float64{0, 0.5, 2} {
		t.Run(fmt.Sprintf("bucket_cap_mb %g", capMB), func(t *testing.T) {
			t.Parallel()
			cfg := distGPT()
			cfg.Parallel = dist.Settings{GPUs: 2, Strategy: dist.DDP, BucketCapMB: capMB}
			_, s := record(t, cfg)
			var ready []int64 // gradient bytes in the order they became gradients, iteration 0
			var buckets [2][]int64
			sizes := map[uint64]int64{}
			for _, e := range s.Events.All() {
				switch {
				case e.Action == snapshot.ActionAlloc:
					sizes[e.Addr] = e.Size
					if e.Category == snapshot.CategoryGradient && e.Iteration == 0 && e.Phase == snapshot.PhaseBackward {
						ready = append(ready, e.Size)
					}
					if strings.Contains(s.String(e.Label), "ddp.bucket[") {
						it := max(e.Iteration, 0)
						buckets[it] = append(buckets[it], e.Size)
					}
				case e.Action == snapshot.ActionCategory && e.Category == snapshot.CategoryGradient && e.Iteration == 0:
					ready = append(ready, sizes[e.Addr])
				}
			}
			total := 4 * sum(gptParams(cfg))
			if len(ready) != len(gptParams(cfg))-0 || sum(ready) != total {
				t.Fatalf("%d gradients of %d bytes in iteration 0, want %d of %d", len(ready), sum(ready), len(gptParams(cfg)), total)
			}
			if len(buckets[0]) != 1 || buckets[0][0] != total {
				t.Errorf("first iteration's buckets %v, want one of %d bytes (find_unused_parameters=False)", buckets[0], total)
			}
			limits := []int64{1 << 20, 25 << 20}
			if capMB != 0 {
				limits = []int64{int64(capMB * (1 << 20))}
			}
			var want []int64
			var open int64
			for _, g := range ready {
				open += g
				if open >= limits[0] {
					want = append(want, open)
					open = 0
					if len(limits) > 1 {
						limits = limits[1:]
					}
				}
			}
			if open > 0 {
				want = append(want, open)
			}
			if fmt.Sprint(buckets[1]) != fmt.Sprint(want) {
				t.Errorf("rebuilt buckets %v, want %v", buckets[1], want)
			}
		})
	}
}

// A rank runs the same micro-batch through the same model: its activations are the single-GPU run's, byte for
// byte, whatever it does to parameters, gradients and optimizer state, when the single GPU computes in the
// same precision. DDP runs fp32 weights under bf16 autocast; FSDP's MixedPrecision gathers bf16 weights and
// autocast runs over them; ZeRO's model is bf16 itself, without autocast. A Llama, whose weights a single GPU
// can hold in either dtype.
func TestActivationsPerRankAreTheSingleGPUs(t *testing.T) {
	t.Parallel()
	base, err := PresetConfig("smollm2-135m")
	if err != nil {
		t.Fatal(err)
	}
	base.Layers, base.Seq, base.Batch, base.Steps, base.GPUMemory = 4, 256, 2, 2, 1<<40
	base.Optimizer, base.Checkpoint = "adamw", knob.CheckpointOff
	activations := func(cfg Config) (atBackward int64) {
		_, s := record(t, cfg)
		found := false
		replay(s, func(_ int, e *snapshot.Event, live map[uint64]*liveBlock) {
			if found || e.Action != snapshot.ActionPhase || e.Phase != snapshot.PhaseBackward || e.Iteration != 1 {
				return
			}
			found = true
			for _, b := range live {
				if b.cat == snapshot.CategoryActivation {
					atBackward += b.requested
				}
			}
		})
		if !found || atBackward == 0 {
			t.Fatalf("no activations at iteration 1's backward")
		}
		return atBackward
	}
	autocast := base
	autocast.Weights, autocast.AMP = WeightsF32, knob.AMPBF16
	half := base
	half.Weights, half.AMP = WeightsBF16, knob.AMPOff
	halfAutocast := base
	halfAutocast.Weights, halfAutocast.AMP = WeightsBF16, knob.AMPBF16
	single := map[string]int64{"fp32 weights, autocast": activations(autocast), "bf16 weights": activations(half),
		"bf16 weights, autocast": activations(halfAutocast)}
	for _, c := range []struct {
		s    dist.Strategy
		like string
	}{{dist.DDP, "fp32 weights, autocast"}, {dist.FSDPFull, "bf16 weights, autocast"}, {dist.FSDPGradOp, "bf16 weights, autocast"},
		{dist.HSDP, "bf16 weights, autocast"}, {dist.FSDP2, "bf16 weights, autocast"}, {dist.ZeRO1, "bf16 weights"}, {dist.ZeRO2, "bf16 weights"}, {dist.ZeRO3, "bf16 weights"}} {
		t.Run(c.s.String(), func(t *testing.T) {
			t.Parallel()
			cfg := autocast
			cfg.Parallel = dist.Settings{GPUs: 8, Nodes: 2, Strategy: c.s}
			if got := activations(cfg); got != single[c.like] {
				t.Errorf("%d bytes of activations at the backward, a single GPU's with %s %d", got, c.like, single[c.like])
			}
		})
	}
}

// The data-parallel settings are part of the configuration a snapshot stores: they read back as written, and
// a snapshot written before they existed reads as one GPU.
func TestParallelSettingsRoundTrip(t *testing.T) {
	t.Parallel()
	cfg := distGPT()
	cfg.Parallel = dist.Settings{GPUs: 8, Nodes: 2, Strategy: dist.ZeRO3, Offload: dist.OffloadOptimizerParams, PrefetchBucketSize: 1e7}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, cfg) {
		t.Fatalf("round trip: %v\n%+v\n%+v", err, back.Parallel, cfg.Parallel)
	}
	old := DefaultMLP()
	b, _ = json.Marshal(old)
	if strings.Contains(string(b), "parallel") {
		t.Errorf("a one-GPU configuration writes %s", b)
	}
	var fresh Config
	if err := json.Unmarshal(b, &fresh); err != nil || fresh.Parallel.Parallel() || fresh.Validate() != nil {
		t.Errorf("a configuration without parallel settings: %+v, %v", fresh.Parallel, err)
	}
	bad := strings.Replace(string(mustJSON(t, cfg)), `"zero3"`, `"zero5"`, 1)
	if err := json.Unmarshal([]byte(bad), &back); err == nil {
		t.Error("an unknown strategy in a snapshot's configuration read back")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The runtime's host device and the recording's name the same index.
func TestHostDeviceIndex(t *testing.T) {
	if device.HostIndex != snapshot.HostDeviceIndex {
		t.Fatalf("device.HostIndex %d, snapshot.HostDeviceIndex %d", device.HostIndex, snapshot.HostDeviceIndex)
	}
}

// A sweep of a job tries every strategy and offload; what each rank's peak is made of adds up to the
// allocator's own peak.
func TestSweepOfAJob(t *testing.T) {
	t.Parallel()
	cfg := distGPT()
	cfg.Parallel = dist.Settings{GPUs: 4, Nodes: 2, Strategy: dist.DDP}
	rows, err := Sweep(context.Background(), cfg, FixesFor(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(DistFixes) {
		t.Fatalf("%d rows for %d strategies", len(rows), len(DistFixes))
	}
	for _, r := range rows {
		var sum int64
		for _, b := range r.Composition {
			sum += b
		}
		peak := r.PeakAllocated
		if r.OOM != nil {
			peak = r.NeedsAllocated
		}
		if sum != peak {
			t.Errorf("%s: the peak's parts add up to %d, the allocator's peak is %d", r.Fix, sum, peak)
		}
		if r.Traffic.Sent == 0 {
			t.Errorf("%s: nothing sent per step", r.Fix)
		}
		if off := r.Config.Parallel.Offload != dist.OffloadNone; off != (r.Host.PeakAllocated > 0) {
			t.Errorf("%s: host memory %d", r.Fix, r.Host.PeakAllocated)
		}
	}
}

// DDP averages gradients that every rank computed from the same micro-batch, so a rank trains exactly as one
// GPU does: the same losses, step for step, on the cpu device where the math runs, whether its gradients are
// copied into the buckets or are the buckets' views.
func TestDDPTrainsAsOneGPU(t *testing.T) {
	t.Parallel()
	cfg, err := PresetConfig("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Device, cfg.Steps, cfg.Batch, cfg.Optimizer = "cpu", 12, 4, "adamw"
	single, _, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if mean(single.Losses[9:]) > mean(single.Losses[:3])*0.95 {
		t.Fatalf("one GPU does not learn: %v", single.Losses)
	}
	for _, view := range []bool{false, true} {
		c := cfg
		c.Parallel = dist.Settings{GPUs: 4, Strategy: dist.DDP, GradientAsBucketView: view}
		ddp, _, err := Run(context.Background(), c, nil)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(ddp.Losses) != fmt.Sprint(single.Losses) {
			t.Errorf("gradient_as_bucket_view %v: losses %v, one GPU's %v", view, ddp.Losses, single.Losses)
		}
	}
}

// What a rank sends per step (its second, when every buffer is set up), derived from Ψ and each
// implementation's layout, and held to the ZeRO paper's volumes (section 7: 2Ψ elements for DDP and stages 1
// and 2, 3Ψ for stage 3), with (n-1)/n of each collective's data on the wire under ring algorithms.
func TestTrafficPerStep(t *testing.T) {
	t.Parallel()
	base := distGPT()
	ps := gptParams(base)
	psi := sum(ps)
	const n = 4
	wire := func(bytes int64) int64 { return bytes * (n - 1) / n }
	aligned, _, _ := zeroLayout(ps, n)
	var gathered int64 // ZeRO-3: every parameter past the persistence threshold, padded to N
	for _, p := range ps {
		if p > dist.DefaultParamPersistenceThreshold {
			gathered += ceil(p, n) * n
		}
	}
	perBlock := sum(ps[2:14])
	root := ps[0] + ps[1] + ps[len(ps)-2] + ps[len(ps)-1]
	blocks := int64(base.Layers) * ceil(perBlock, n) * n
	var blocks2, root2 int64 // FSDP2: each parameter's rows padded to a multiple of N
	for i, rows := range gptParamRows(base) {
		padded := ceil(rows, n) * n * (ps[i] / rows)
		if i < 2 || i >= len(ps)-2 {
			root2 += padded
		} else {
			blocks2 += padded
		}
	}
	cases := []struct {
		s     dist.Settings
		sent  int64 // bytes on the wire, from the layout
		paper int64 // elements, the paper's
		bytes int64 // bytes an element takes on the wire
	}{
		// fp32 gradients all-reduced: 2(n-1)/n of 4Ψ bytes.
		{dist.Settings{GPUs: n, Strategy: dist.DDP}, 2 * wire(4*psi), 2 * psi, 4},
		// bf16 gradients reduce-scattered, the padded bf16 flat buffer all-gathered.
		{dist.Settings{GPUs: n, Strategy: dist.ZeRO1}, wire(2*psi) + wire(2*aligned), 2 * psi, 2},
		{dist.Settings{GPUs: n, Strategy: dist.ZeRO2}, wire(2*psi) + wire(2*aligned), 2 * psi, 2},
		// Gathered in forward and again in backward (a reuse distance of one element keeps only what the very
		// next module uses), the persisted parameters in the first step only; gradients reduce-scattered. The
		// tied embedding is gathered for each module that uses it: the embedding's forward, the LM head's
		// (kept to the LM head's backward, the next module), the embedding's backward: once more.
		{dist.Settings{GPUs: n, Strategy: dist.ZeRO3, MaxReuseDistance: 1}, 2*wire(2*gathered) + wire(2*ceil(ps[0], n)*n) + wire(2*psi), 3 * psi, 2},
		// Each block unit gathered in forward and in backward, the root once; every unit reduce-scattered.
		{dist.Settings{GPUs: n, Strategy: dist.FSDPFull}, 2*wire(2*blocks) + wire(2*ceil(root, n)*n) + wire(2*(blocks+ceil(root, n)*n)), 3 * psi, 2},
		// The same for fully_shard's groups, each parameter padded on its own.
		{dist.Settings{GPUs: n, Strategy: dist.FSDP2}, 2*wire(2*blocks2) + wire(2*root2) + wire(2*(blocks2+root2)), 3 * psi, 2},
	}
	for _, c := range cases {
		t.Run(c.s.Strategy.String(), func(t *testing.T) {
			t.Parallel()
			cfg := base
			cfg.Parallel = c.s
			res, _, err := Run(context.Background(), cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			step := res.Traffic[1]
			if step.Sent != c.sent {
				t.Errorf("sent %d bytes in the second step (%s), want %d", step.Sent, step, c.sent)
			}
			// The paper's volume, in bytes per rank on the wire, and what the layout adds to it.
			paper := wire(c.paper * c.bytes)
			if d := step.Sent - paper; d < -paper/10 || d > paper/10 {
				t.Errorf("sent %d bytes, the paper's %d elements are %d bytes: %+.1f%%", step.Sent, c.paper, paper, 100*float64(d)/float64(paper))
			}
		})
	}
}
