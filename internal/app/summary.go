package app

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// WriteRunSummary writes what a run did: the snapshot it wrote (path, of size bytes), the model, the peak,
// each phase of the first and last iterations, and the OOM.
func WriteRunSummary(w io.Writer, cfg train.Config, res *train.Result, path string, size int64) {
	fmt.Fprintf(w, "snapshot   %s (%s)\n", path, units.FormatSize(size))
	params := humanCount(res.Parameters)
	if res.Trainable != res.Parameters {
		params = fmt.Sprintf("%s (%s trainable, %.2f%%)", params, humanCount(res.Trainable), 100*float64(res.Trainable)/float64(max(res.Parameters, 1)))
	}
	fmt.Fprintf(w, "model      %s, %s parameters, batch %d, %s, device %s with %s (%s CUDA context)\n",
		cfg.ModelName(), params, cfg.Batch, cfg.Optimizer, cfg.Device,
		units.FormatSize(int64(cfg.GPUMemory)), units.FormatSize(int64(cfg.ContextReserve)))
	fmt.Fprintf(w, "steps      %d of %d", res.Steps, cfg.Steps)
	if n := len(res.Losses); n > 0 && cfg.Device == device.CPU {
		fmt.Fprintf(w, ", loss %.4f -> %.4f", res.Losses[0], res.Losses[n-1])
	}
	if res.Interrupted {
		fmt.Fprint(w, " (interrupted)")
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "peak       %s allocated, %s reserved\n", units.FormatSize(res.PeakAllocated), units.FormatSize(res.PeakReserved))
	if res.Paged > 0 {
		fmt.Fprintf(w, "paged      %s of optimizer state in unified memory, outside the allocator; %s of it evicted to host over the run\n",
			units.FormatSize(int64(res.Paged)), units.FormatSize(int64(res.PagedEvicted)))
	}
	if h := res.Host; h.PeakReserved > 0 {
		fmt.Fprintf(w, "host       %s allocated at the peak, %s reserved, %s of it pinned (offload %s)\n",
			units.FormatSize(int64(h.PeakAllocated)), units.FormatSize(int64(h.PeakReserved)), units.FormatSize(int64(h.Pinned)),
			cfg.Offload())
	}
	if l := res.ExpertLoad; l.Routed > 0 {
		fmt.Fprintf(w, "experts    routing %s: the busiest expert took %d of %d routed tokens (layer %d), %.2fx an even share of %d\n",
			cfg.Routing, l.Tokens, l.Routed, l.Layer, l.Share(), l.Routed/l.Experts)
	}
	if !cfg.SeqDist.Fixed() || cfg.EmptyCache != train.EmptyCacheNever {
		writeSteps(w, cfg, res)
	}
	fmt.Fprintln(w)

	last := -1
	for _, p := range res.Phases {
		last = max(last, p.Iteration)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "iteration\tphase\tpeak\tat end\t")
	for _, p := range res.Phases {
		if p.Iteration > 0 && p.Iteration != last {
			continue
		}
		it := fmt.Sprint(p.Iteration)
		if p.Iteration < 0 {
			it = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", it, p.Phase, units.FormatSize(p.Peak), units.FormatSize(p.End))
	}
	tw.Flush()
	if res.OOM != nil {
		fmt.Fprintf(w, "\nOOM in iteration %d, %s, allocating %s:\n%s\n", res.OOM.Iteration, res.OOM.Phase, res.OOM.Tensor, res.OOM.Message)
	}
}

// humanCount prints a parameter count: 1.3B, 355M, 12.5K.
func humanCount(n int) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

// writeSteps says what each step's batch was (variable lengths) and what each step asked of the device: the
// first steps' padded lengths and cudaMalloc calls, and the cost after the first step.
func writeSteps(w io.Writer, cfg train.Config, res *train.Result) {
	const shown = 8
	var lens, mallocs []string
	var tokens, padded int64
	for i, st := range res.StepStats {
		tokens, padded = tokens+st.Tokens, padded+st.PaddedTokens
		if i < shown {
			for _, t := range st.SeqLens {
				lens = append(lens, fmt.Sprint(t))
			}
			mallocs = append(mallocs, fmt.Sprint(st.DeviceAllocs))
		}
	}
	more := ""
	if len(res.StepStats) > shown {
		more = ", …"
	}
	if !cfg.SeqDist.Fixed() && padded > 0 {
		fmt.Fprintf(w, "lengths    %s, padding %s: batches of %s%s tokens; %.0f%% of the tokens on the device are padding\n",
			cfg.SeqDist, cfg.Padding, strings.Join(lens, ", "), more, 100*float64(padded-tokens)/float64(padded))
	}
	fmt.Fprintf(w, "cudaMalloc %s%s per step", strings.Join(mallocs, ", "), more)
	if c := res.SteadyCost(); c.Steps > 0 {
		fmt.Fprintf(w, "; after the first, %s cudaMalloc and %s cudaFree calls per step", triage.PerStep(c.Mallocs), triage.PerStep(c.Frees))
		if cfg.EmptyCache != train.EmptyCacheNever {
			fmt.Fprintf(w, ", empty_cache returning %s", units.FormatSize(int64(c.EmptyCacheReleased)))
		}
	}
	fmt.Fprintln(w)
}
