package fit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// preset returns a preset's configuration on a card of gib GiB, changed by edit.
func preset(t testing.TB, name string, gib uint64, edit func(*train.Config)) train.Config {
	t.Helper()
	cfg, err := train.PresetConfig(name)
	if err != nil {
		t.Fatal(err)
	}
	cfg.GPUMemory = gib << 30
	if edit != nil {
		edit(&cfg)
	}
	return cfg
}

func loraBF16(c *train.Config) {
	c.Weights, c.AMP, c.LoRA, c.LoRAAlpha, c.LoRATargets = train.WeightsBF16, knob.AMPOff, 16, 32, train.AllLoRATargets
}

// fitsByRun records cfg with batch b for two steps with train.Run, as `oomdbg run --steps 2` would, and holds
// it to the rule docs/fit.md states: no OOM, and peak reserved within 95% of what the CUDA context leaves.
func fitsByRun(t *testing.T, cfg train.Config, b int) bool {
	t.Helper()
	cfg.Batch, cfg.Steps, cfg.Device = b, 2, device.Meta
	res, _, err := train.Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("batch %d: %v", b, err)
	}
	budget := float64(cfg.GPUMemory-cfg.ContextReserve) * 0.95
	return res.OOM == nil && float64(res.PeakReserved) <= budget
}

func TestMaxBatchHoldsAgainstRuns(t *testing.T) {
	cases := map[string]struct {
		cfg  train.Config
		none bool // nothing fits
	}{
		"gpt2-medium on 24 GiB":              {cfg: preset(t, "gpt2-medium", 24, nil)},
		"gpt2-small bf16 flash on 16 GiB":    {cfg: preset(t, "gpt2-small", 16, func(c *train.Config) { c.AMP, c.Attention = knob.AMPBF16, knob.AttentionFlash })},
		"llama-3.2-1b LoRA on 24 GiB":        {cfg: preset(t, "llama-3.2-1b", 24, loraBF16)},
		"llama-3.2-1b QLoRA ckpt on 8 GiB":   {cfg: preset(t, "llama-3.2-1b", 8, func(c *train.Config) { loraBF16(c); c.QLoRA, c.Checkpoint = true, knob.CheckpointAll })},
		"gpt2-medium on 4 GiB: nothing fits": {cfg: preset(t, "gpt2-medium", 4, nil), none: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s, err := fit.MaxBatch(context.Background(), tc.cfg, fit.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s", s)
			if tc.none {
				if s.MaxBatch != 0 {
					t.Fatalf("max batch %d, want none on this card", s.MaxBatch)
				}
				if fitsByRun(t, tc.cfg, 1) {
					t.Fatal("a run of batch 1 fits, but the search found nothing")
				}
				return
			}
			if s.MaxBatch < 1 || s.Capped {
				t.Fatalf("max batch %d (capped %v): want a batch found below the cap", s.MaxBatch, s.Capped)
			}
			if !fitsByRun(t, tc.cfg, s.MaxBatch) {
				t.Errorf("batch %d does not fit when run", s.MaxBatch)
			}
			if fitsByRun(t, tc.cfg, s.MaxBatch+1) {
				t.Errorf("batch %d fits when run: %d is not the largest", s.MaxBatch+1, s.MaxBatch)
			}
			steps := 0
			for _, tr := range s.Trials {
				steps += tr.Steps
				if tr.Steps < 1 || tr.Steps > 2 {
					t.Errorf("trial of batch %d simulated %d steps, want 1 (an OOM) or 2", tr.Config.Batch, tr.Steps)
				}
			}
			if steps != s.Steps {
				t.Errorf("steps %d, the trials' sum is %d", s.Steps, steps)
			}
		})
	}
}

// TestMaxBatchInterrupted: a search whose context ends returns what it found, without an error.
func TestMaxBatchInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cfg := preset(t, "gpt2-small", 80, func(c *train.Config) { c.Batch = 1 })
	trials := 0
	s, err := fit.MaxBatch(ctx, cfg, fit.Options{Progress: func(tr fit.Trial) {
		if trials++; trials == 2 {
			cancel()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Interrupted || s.MaxBatch < 2 {
		t.Fatalf("interrupted %v with max batch %d: want the batch of 2 found before the cancel", s.Interrupted, s.MaxBatch)
	}
}

// cancelAt simulates on the meta device, and cancels the search's context as its n-th trial (from 1)
// starts, as Ctrl-C during that trial would.
type cancelAt struct {
	n, calls int
	cancel   context.CancelFunc
}

func (c *cancelAt) Simulate(ctx context.Context, cfg train.Config, limit int64) (*train.Result, error) {
	c.calls++
	if c.calls == c.n {
		c.cancel()
	}
	return fit.Meta{}.Simulate(ctx, cfg, limit)
}

// TestInterruptedBatchSearchSaysWhatItKnows interrupts the search for gpt2-medium's largest batch on 24 GiB
// (16, then 8, then 4, ...) during each of its first trials: it reports the batches it found to fit and not
// to, each held against a run, and never that nothing fits when the smaller batches were never tried.
func TestInterruptedBatchSearchSaysWhatItKnows(t *testing.T) {
	cfg := preset(t, "gpt2-medium", 24, nil)
	for n := 1; n <= 4; n++ {
		t.Run(fmt.Sprintf("during trial %d", n), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := fit.MaxBatch(ctx, cfg, fit.Options{Sim: &cancelAt{n: n, cancel: cancel}})
			if err != nil || !s.Interrupted {
				t.Fatalf("err %v, interrupted %v", err, s.Interrupted)
			}
			if len(s.Trials) != n-1 {
				t.Errorf("%d trials kept, want the %d that ended", len(s.Trials), n-1)
			}
			if s.MaxBatch > 0 && !fitsByRun(t, cfg, s.MaxBatch) {
				t.Errorf("it says batch %d fits; a run of it does not", s.MaxBatch)
			}
			if s.NoFit > 0 && fitsByRun(t, cfg, s.NoFit) {
				t.Errorf("it says batch %d does not fit; a run of it does", s.NoFit)
			}
			line := s.String()
			t.Log(line)
			if !strings.HasPrefix(line, "interrupted") || strings.Contains(line, "not even 1") {
				t.Errorf("%q: want what an interrupted search knows", line)
			}
			var text, js bytes.Buffer
			rep := &fit.Report{Config: cfg, Req: fit.Request{GPU: fit.GPUs[0]}, Batch: s, Plans: &fit.Plans{Interrupted: true}}
			rep.WriteText(&text)
			rep.WriteJSON(&js)
			if !strings.Contains(text.String(), "\nI"+line[1:]+".\n") || strings.Contains(text.String(), "No micro-batch fits") {
				t.Errorf("the report does not say what the search knows:\n%s", text.String())
			}
			var doc struct {
				MaxBatch    int  `json:"max_batch"`
				NoFit       int  `json:"smallest_not_fitting"`
				Interrupted bool `json:"interrupted"`
			}
			if json.Unmarshal(js.Bytes(), &doc) != nil || doc.MaxBatch != s.MaxBatch || doc.NoFit != s.NoFit || !doc.Interrupted {
				t.Errorf("JSON %s", js.String())
			}
		})
	}
}
