package train

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// probe is a Tracer that measures a run through the allocator's counters: the bytes requested in each
// phase and module scope, the labels allocated in each phase, and each phase's peak of requested bytes.
type probe struct {
	dev    *device.Device
	phase  snapshot.Phase
	scopes []string
	marks  []int64 // requested bytes allocated so far, when each open scope was entered

	scopeBytes map[string]int64 // "phase scope" -> bytes requested inside the scope
	labels     map[snapshot.Phase][]string
	peaks      []phasePeak
}

type phasePeak struct {
	phase snapshot.Phase
	peak  int64 // the highest requested bytes during the phase
}

func newProbe() *probe {
	return &probe{scopeBytes: map[string]int64{}, labels: map[snapshot.Phase][]string{}}
}

func (p *probe) requested() (total, current, peak int64) {
	st := p.dev.Allocator().Stats().RequestedBytes.All()
	return st.Allocated, st.Current, st.Peak
}

// SetPhase is called before the run resets the peak statistics for the new phase: the peak is the old one's.
func (p *probe) SetPhase(ph snapshot.Phase) {
	_, _, peak := p.requested()
	p.peaks = append(p.peaks, phasePeak{p.phase, peak})
	p.phase = ph
}
func (p *probe) TagNextAlloc(_ snapshot.Category, label string) {
	p.labels[p.phase] = append(p.labels[p.phase], label)
}
func (p *probe) SetCategory(int, uint64, snapshot.Category, string) {}
func (p *probe) PushScope(path string) {
	total, _, _ := p.requested()
	p.scopes, p.marks = append(p.scopes, path), append(p.marks, total)
}
func (p *probe) PopScope() {
	total, _, _ := p.requested()
	n := len(p.scopes) - 1
	p.scopeBytes[fmt.Sprintf("%s %s", p.phase, p.scopes[n])] += total - p.marks[n]
	p.scopes, p.marks = p.scopes[:n], p.marks[:n]
}

// probedRun sets up a run of cfg whose runtime reports to a probe, with its model and optimizer built.
func probedRun(t *testing.T, cfg Config) (*run, *probe) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := newRun(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := newProbe()
	p.dev = r.dev
	r.rt = tensor.NewRuntime(r.dev, p, cfg.Seed)
	if err := r.rt.Catch(r.setup); err != nil {
		t.Fatal(err)
	}
	return r, p
}

// smallGPT is a small nanoGPT on the meta device.
func smallGPT(vocab int) Config {
	c := gpt(2, 4, 64, 32, vocab, 4)
	c.Steps = 1
	return c
}

// TestSavedBytesPerLogit derives from two vocabulary sizes, all else equal, what the forward pass leaves
// saved for backward per logit (batch x seq x vocab): the loss's log-probabilities in the logits' dtype and
// the float32 copy nll_loss saves, 2 + 4 = 6 bytes under --amp bf16 and fp16 (cross_entropy_loss_symint in
// aten/src/ATen/native/LossNLL.cpp; CUDA autocast does not list cross_entropy), and the one float32
// log_softmax both save, 4 bytes, without autocast. The only other tensor that grows with the vocabulary is
// the LM head's cached 16-bit cast of the tied embedding (amp_cache), 2 x d_model bytes per token of the
// vocabulary, which the matmul saves.
func TestSavedBytesPerLogit(t *testing.T) {
	const v1, v2 = 1000, 1512
	for amp, want := range map[string]struct{ perLogit, castPerToken uint64 }{
		"off":  {4, 0},
		"bf16": {6, 2 * 64},
		"fp16": {6, 2 * 64},
	} {
		t.Run(amp, func(t *testing.T) {
			saved := func(vocab int) (activations, casts uint64, logits int) {
				cfg := smallGPT(vocab)
				a, err := knob.ParseAMP(amp)
				if err != nil {
					t.Fatal(err)
				}
				cfg.AMP = a
				r, _ := probedRun(t, cfg)
				err = r.rt.Catch(func() {
					x, y := r.data.batch(r.rt, r.lengths.next(cfg.Batch), "batch")
					loss := r.forward(x, y)
					for _, st := range r.rt.SavedTensors() {
						switch st.Category {
						case snapshot.CategoryActivation.String():
							activations += st.Bytes
						case snapshot.CategoryAMPCache.String():
							casts += st.Bytes
						}
					}
					logits = cfg.Batch * cfg.Seq * vocab
					loss.Release()
					x.Release()
					y.Release()
				})
				if err != nil {
					t.Fatal(err)
				}
				return activations, casts, logits
			}
			a1, c1, n1 := saved(v1)
			a2, c2, n2 := saved(v2)
			if got := (a2 - a1) / uint64(n2-n1); got != want.perLogit || (a2-a1)%uint64(n2-n1) != 0 {
				t.Errorf("%d bytes saved for backward per logit (%d more for %d more logits), want %d", got, a2-a1, n2-n1, want.perLogit)
			}
			if got := (c2 - c1) / (v2 - v1); got != want.castPerToken {
				t.Errorf("cached casts saved grow by %d bytes per vocabulary entry, want %d", got, want.castPerToken)
			}
		})
	}
}

// TestRecomputeRunsUnderAutocast runs one training micro-step of a small GPT with --amp bf16 --checkpoint
// all --attention flash on the cpu device, and the same without checkpointing. torch/utils/checkpoint.py
// recomputes each block under the autocast state of its forward, in an autocast region of its own: so every
// linear output of the recompute phase is bfloat16, each recompute allocates exactly the bytes the block's
// bf16 forward allocates in the unchecked run (its weight casts included: the region's cache is new), and
// every gradient is the unchecked run's, bit for bit.
func TestRecomputeRunsUnderAutocast(t *testing.T) {
	base, err := PresetConfig("tiny")
	if err != nil {
		t.Fatal(err)
	}
	base.Device, base.AMP, base.Attention, base.Dropout, base.Steps = "cpu", knob.AMPBF16, knob.AttentionFlash, 0.1, 1
	step := func(checkpoint knob.Checkpoint) (*probe, map[string][]float32) {
		cfg := base
		cfg.Checkpoint = checkpoint
		r, p := probedRun(t, cfg)
		if err := r.rt.Catch(func() { r.microStep(true) }); err != nil {
			t.Fatal(err)
		}
		grads := map[string][]float32{}
		for _, prm := range r.model.Parameters() {
			grads[prm.Name] = prm.Tensor.Grad().Values()
		}
		return p, grads
	}
	plain, plainGrads := step(knob.CheckpointOff)
	ckpt, ckptGrads := step(knob.CheckpointAll)

	var linears int
	for _, l := range ckpt.labels[snapshot.PhaseRecompute] {
		if strings.HasSuffix(l, " linear.out") {
			linears++
			if !strings.HasPrefix(l, "bf16[") {
				t.Errorf("the recompute allocated %s, want bfloat16 linear outputs", l)
			}
		}
	}
	if want := 4 * base.Layers; linears != want {
		t.Errorf("%d linear outputs in the recompute phases, want %d (four per block)", linears, want)
	}
	for i := range base.Layers {
		block := fmt.Sprintf("transformer.h.%d", i)
		forward := plain.scopeBytes[fmt.Sprintf("%s %s", snapshot.PhaseForward, block)]
		recompute := ckpt.scopeBytes[fmt.Sprintf("%s %s", snapshot.PhaseRecompute, block)]
		if forward == 0 || recompute != forward {
			t.Errorf("%s: the recompute allocated %d bytes, the unchecked bf16 forward %d", block, recompute, forward)
		}
	}
	for name, g := range plainGrads {
		if !slices.Equal(g, ckptGrads[name]) {
			t.Errorf("gradient of %s differs with checkpointing", name)
		}
	}
}

// TestLogitsKept checks the two training loops. nanoGPT's train.py (logits, loss = model(X, Y)) keeps the
// logits through backward, the optimizer step and the next forward, until that forward returns and the
// name is rebound: every phase of the second step peaks higher by exactly the logits' bytes (bf16: 2 per
// logit) than with a loop that drops them before backward (HF Trainer's compute_loss returns the loss only).
func TestLogitsKept(t *testing.T) {
	peaks := func(logits string) []phasePeak {
		cfg := smallGPT(1000)
		cfg.AMP, cfg.Logits, cfg.Steps = knob.AMPBF16, logits, 2
		r, p := probedRun(t, cfg)
		if err := r.rt.Catch(func() {
			r.iterate(0, false)
			p.peaks = nil
			r.iterate(1, false)
		}); err != nil {
			t.Fatal(err)
		}
		if (r.logits != nil) != (logits == LogitsKeep) {
			t.Errorf("%s: the loop holds logits %v", logits, r.logits)
		}
		r.setPhase(snapshot.PhaseSetup) // closes the last phase's peak
		return p.peaks[1:]              // the phases of the second step, from its data phase on
	}
	keep, drop := peaks(LogitsKeep), peaks(LogitsDrop)
	logits := int64(4 * 32 * 1000 * 2)
	if len(keep) != len(drop) || len(keep) < 5 {
		t.Fatalf("phases %v and %v", keep, drop)
	}
	for i := range keep {
		if keep[i].phase != drop[i].phase || keep[i].peak-drop[i].peak != logits {
			t.Errorf("%s peaks at %d bytes keeping the logits, %d dropping them: want %d more", keep[i].phase, keep[i].peak, drop[i].peak, logits)
		}
	}
}
