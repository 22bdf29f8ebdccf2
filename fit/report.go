package fit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/internal/table"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// Request is what oomdbg fit searches for beyond the workload.
type Request struct {
	GPU   GPU   // the card whose published peaks the step times use
	Allow Allow // the changes beyond the loop's settings a plan may make
	// FreeBatch lets plans shrink the micro-batch without accumulating (PlanOptions.FreeBatch).
	FreeBatch bool
	Top       int     // how many fitting plans to find
	Margin    float64 // the share of the allocator's memory a plan must leave unreserved (0: none)
	// Base is the run flags of the workload as given: each plan prints them, then its own.
	Base []string
	// Explain compares with other batch finders and measures what the common fixes save.
	Explain bool
	// Progress, when set, is a terminal that hears how the search goes, on one line rewritten.
	Progress io.Writer
}

// Report is what oomdbg fit found: the largest batch, the plans that fit, and with Explain the comparisons.
type Report struct {
	Config train.Config
	Req    Request
	Batch  *BatchSearch
	Plans  *Plans
	Why    *Explanation // with Request.Explain
}

// Search searches cfg for the largest batch, then for the plans that fit. When ctx ends it returns what it
// found so far, marked interrupted.
func Search(ctx context.Context, cfg train.Config, req Request) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts := Options{Margin: req.Margin}
	if req.Margin == 0 {
		opts.Margin = -1 // Options: none
	}
	if p := req.Progress; p != nil {
		n := 0
		opts.Progress = func(t Trial) {
			n++
			verdict := "does not fit"
			if t.Fits {
				verdict = "fits"
			}
			fmt.Fprintf(p, "\r\x1b[Kfit: trial %d, micro-batch %d x %d: %s", n, t.Config.Batch, t.Config.Accum, verdict)
		}
		defer fmt.Fprint(p, "\r\x1b[K")
	}
	rep := &Report{Config: cfg, Req: req}
	var err error
	if rep.Batch, err = MaxBatch(ctx, cfg, opts); err != nil {
		return nil, err
	}
	if rep.Batch.Interrupted {
		rep.Plans = &Plans{Interrupted: true}
		return rep, nil
	}
	rep.Plans, err = FindPlans(ctx, cfg, PlanOptions{Options: opts, GPU: req.GPU, Allow: req.Allow, FreeBatch: req.FreeBatch, Top: req.Top})
	if err != nil || !req.Explain || rep.Plans.Interrupted {
		return rep, err
	}
	opts.Progress = nil
	if rep.Why, err = Explain(ctx, cfg, opts); err != nil && ctx.Err() != nil {
		return rep, nil // interrupted: the rest stands
	}
	return rep, err
}

// Interrupted reports whether the search was stopped before it was done.
func (r *Report) Interrupted() bool { return r.Batch.Interrupted || r.Plans.Interrupted }

// flags returns the run flags that reproduce plan p.
func (r *Report) flags(p *Plan) string {
	return JoinFlags(append(slices.Clip(r.Req.Base), Flags(p.Config)...))
}

// ReportJSON is fit --json's document (docs/fit.md).
type ReportJSON struct {
	MaxBatch       int          `json:"max_batch"`
	Capped         bool         `json:"max_batch_capped,omitempty"`
	NoFit          int          `json:"smallest_not_fitting"`
	SimulatedSteps int          `json:"simulated_steps"`
	Trials         int          `json:"trials"`
	GPU            string       `json:"gpu"`
	GPUMemory      uint64       `json:"gpu_memory"`
	Limit          int64        `json:"limit"`
	Margin         float64      `json:"margin"`
	Considered     int          `json:"plans_considered"`
	Pruned         int          `json:"plans_pruned"`
	Interrupted    bool         `json:"interrupted,omitempty"`
	Plans          []PlanJSON   `json:"plans"`
	Explain        *Explanation `json:"explain,omitempty"`
}

// PlanJSON is a plan in fit --json's document.
type PlanJSON struct {
	Plan          string  `json:"plan"`
	Flags         string  `json:"flags"`
	PeakAllocated int64   `json:"peak_allocated"`
	PeakReserved  int64   `json:"peak_reserved"`
	Headroom      int64   `json:"headroom"`
	Fits          bool    `json:"fits"`
	StepTime      float64 `json:"step_time_s"`
	Cost          struct {
		Compute   float64 `json:"compute_s"`
		Attention float64 `json:"attention_s"`
		Optimizer float64 `json:"optimizer_s"`
		Host      float64 `json:"host_s"`
		Comm      float64 `json:"comm_s"`
		FLOPs     float64 `json:"flops"`
	} `json:"cost"`
}

// JSON returns the report as fit --json prints it.
func (r *Report) JSON() ReportJSON {
	j := ReportJSON{MaxBatch: r.Batch.MaxBatch, Capped: r.Batch.Capped, NoFit: r.Batch.NoFit, SimulatedSteps: r.Batch.Steps + r.Plans.Steps,
		Trials: len(r.Batch.Trials) + len(r.Plans.Tried), GPU: r.Req.GPU.Name, GPUMemory: r.Config.GPUMemory,
		Limit: Limit(r.Config, r.Req.Margin), Margin: r.Req.Margin, Considered: r.Plans.Considered, Pruned: r.Plans.Pruned,
		Interrupted: r.Interrupted(), Plans: []PlanJSON{}, Explain: r.Why}
	for _, p := range r.Plans.Fitting {
		pj := PlanJSON{Plan: p.Name(), Flags: r.flags(p), PeakAllocated: p.PeakAllocated, PeakReserved: p.PeakReserved,
			Headroom: p.Headroom, Fits: p.Fits, StepTime: p.StepTime()}
		c := p.Cost
		pj.Cost.Compute, pj.Cost.Attention, pj.Cost.Optimizer, pj.Cost.Host, pj.Cost.Comm, pj.Cost.FLOPs =
			c.Compute, c.Attention, c.Optimizer, c.Host, c.Comm, c.FLOPs
		j.Plans = append(j.Plans, pj)
	}
	return j
}

// WriteJSON writes the report as JSON, indented.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r.JSON())
}

// WriteMarkdown writes the plans as a markdown table.
func (r *Report) WriteMarkdown(w io.Writer) error {
	r.write(w, true)
	return nil
}

// WriteText writes the report for a terminal: what fits means, the largest batch, the plans that fit with
// the run flags of each, and with Explain the comparisons.
func (r *Report) WriteText(w io.Writer) error {
	r.write(w, false)
	return nil
}

func (r *Report) write(w io.Writer, markdown bool) {
	cfg := r.Config
	if !markdown {
		fmt.Fprintf(w, "%s, micro-batch %d x accumulate %d, on %s (%s taken by the CUDA context), step times for %s\n",
			cfg.ModelName(), cfg.Batch, cfg.Accum, units.FormatSize(int64(cfg.GPUMemory)), units.FormatSize(int64(cfg.ContextReserve)), r.Req.GPU.Name)
		fmt.Fprintf(w, "fits: no OOM in %d simulated steps and peak reserved <= %s (%.0f%% of what the context leaves)\n\n",
			Steps(cfg), units.FormatSize(Limit(cfg, r.Req.Margin)), 100*(1-r.Req.Margin))
		fmt.Fprintf(w, "%s.\n", capitalize(r.Batch.String()))
		if r.Batch.Interrupted {
			return // String said what is known
		}
		alike := 0
		for _, p := range r.Plans.Skipped {
			if p.Skipped == SkippedFailsAlike {
				alike++
			}
		}
		fmt.Fprintf(w, "\nPlans that fit, cheapest first: %d combinations, %d simulated (%d steps), %d skipped by dominance, %d as failing alike:\n\n",
			r.Plans.Considered, len(r.Plans.Tried), r.Plans.Steps, r.Plans.Pruned-alike, alike)
	}
	header := []string{"#", "plan", "peak allocated", "peak reserved", "headroom", "step time"}
	if r.Req.FreeBatch {
		header = append(header, "per sample")
	}
	var rows [][]string
	for i, p := range r.Plans.Fitting {
		row := []string{fmt.Sprint(i + 1), p.Name(), units.FormatSize(p.PeakAllocated), units.FormatSize(p.PeakReserved),
			units.FormatSize(p.Headroom), fmt.Sprintf("%.3f s", p.StepTime())}
		if r.Req.FreeBatch {
			row = append(row, fmt.Sprintf("%.2f ms", 1e3*p.PerSample()))
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "No plan fits: allow more (--allow lora,qlora,offload,zero), or a larger card.")
	} else {
		table.Write(w, header, rows, markdown, 2)
	}
	if r.Plans.Interrupted {
		fmt.Fprintln(w, "\nInterrupted: more plans were left to try.")
	}
	if markdown {
		return
	}
	if len(rows) > 0 {
		fmt.Fprintln(w, "\nTo run a plan:")
	}
	for i, p := range r.Plans.Fitting {
		fmt.Fprintf(w, "%3d  oomdbg run %s\n", i+1, r.flags(p))
	}
	if r.Why != nil {
		r.writeExplain(w)
	}
}

// writeExplain writes Explain's comparisons.
func (r *Report) writeExplain(w io.Writer) {
	e := r.Why
	fmt.Fprintf(w, "\nBatch finders, each trial judged by the rule above (on a GPU each trial is real steps):\n\n")
	batch := func(b int) string {
		if b == 0 {
			return "none"
		}
		return fmt.Sprint(b)
	}
	rows := [][]string{
		{e.Halving.Name, batch(e.Halving.Batch), fmt.Sprint(e.Halving.Trials), fmt.Sprint(e.Halving.Steps)},
		{e.Doubling.Name, batch(e.Doubling.Batch), fmt.Sprint(e.Doubling.Trials), fmt.Sprint(e.Doubling.Steps)},
		{"oomdbg fit (simulated)", batch(r.Batch.MaxBatch), fmt.Sprint(len(r.Batch.Trials)), fmt.Sprint(r.Batch.Steps)},
	}
	table.Write(w, []string{"finder", "batch", "trials", "steps"}, rows, false, 1)
	fmt.Fprintf(w, "\nHalving takes the first power of two below %d that fits; the largest that fits is %s. Doubling counts\n"+
		"%d steps a trial (Lightning's steps_per_trial), halving one step for each OOM and the trial that fits.\n",
		HalvingStart, batch(r.Batch.MaxBatch), LightningStepsPerTrial)
	if len(e.Savings) == 0 {
		return
	}
	fmt.Fprintf(w, "\nWhat each fix saves of the memory a step needs (peak allocated with unlimited memory, %d steps):\n\n", Steps(r.Config))
	rows = [][]string{{"as configured", units.FormatSize(e.Savings[0].Base), "-"}}
	for _, s := range e.Savings {
		rows = append(rows, []string{s.Fix, units.FormatSize(s.Needs), fmt.Sprintf("%.0f%%", 100*s.SavedShare)})
	}
	table.Write(w, []string{"fix", "needs", "saves"}, rows, false, 1)
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
