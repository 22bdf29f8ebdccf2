package layouts

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/internal/table"
	"github.com/oomdbg/oomdbg/internal/units"
)

// WriteText writes the report for a terminal: the job, the rule, and the fastest plans that fit, one a row.
func (r *Report) WriteText(w io.Writer) error {
	j := r.Job
	nodes := "1 node"
	if j.Nodes > 1 {
		nodes = strconv.Itoa(j.Nodes) + " nodes"
	}
	fmt.Fprintf(w, "%s on %d GPUs (%s of %d), %s, global batch %d sequences of %d tokens\n", j.Name, j.GPUs, nodes,
		j.GPUsPerNode(), j.GPU.Name, j.GlobalBatch, j.Model.Seq)
	fmt.Fprintln(w, headroom.Rule(j.Usable, j.Margin))
	fmt.Fprintf(w, "%d layouts searched, %d fit; the fastest by modelled step time (docs/distributed.md):\n\n", r.Searched, r.Fitting)
	if len(r.Plans) == 0 {
		if r.Smallest != nil {
			p := r.Smallest
			fmt.Fprintf(w, "none fits; the smallest worst rank is %s mb=%d %s recompute=%s: %s\n", p.Layout, p.MicroBatch,
				p.Layout.Schedule, p.Layout.Recompute, units.FormatSize(int64(p.Worst.Total())))
		}
		return nil
	}
	header := []string{"layout", "schedule", "mb x M", "recompute", "dist-opt", "worst", "weights", "grads", "optim", "activ",
		"peak", "headroom", "step", "compute", "bubble", "tp", "cp", "dp", "optim"}
	var rows [][]string
	for _, p := range r.Plans {
		sched := p.Layout.Schedule.String()
		if p.Layout.PP == 1 {
			sched = "-"
		}
		dist := "off"
		if p.Layout.DistributedOptimizer {
			dist = "on"
		}
		s := p.Worst
		rows = append(rows, []string{p.Layout.String(), sched, strconv.Itoa(p.MicroBatch) + " x " + strconv.Itoa(p.Layout.MicroBatches),
			p.Layout.Recompute.String(), dist, "stage " + strconv.Itoa(s.Index),
			size(s.Weights), size(s.Gradients), size(s.Optimizer), size(s.Activation), size(s.Total()),
			units.FormatSize(p.Verdict.Limit - p.Verdict.PeakReserved),
			secs(p.Time.Total()), secs(p.Time.Compute), secs(p.Time.Bubble), secs(p.Time.TP), secs(p.Time.CP), secs(p.Time.DP),
			secs(p.Time.Optimizer)})
	}
	table.Write(w, header, rows, false, 5)
	return nil
}

func size(b float64) string { return units.FormatSize(int64(b)) }

// secs prints a time in the unit that keeps three or four figures: "94.60s", "63.2ms", "12.3us", "0".
func secs(s float64) string {
	switch {
	case s == 0:
		return "0"
	case s >= 1:
		return strconv.FormatFloat(s, 'f', 2, 64) + "s"
	case s >= 1e-3:
		return strconv.FormatFloat(s*1e3, 'f', 1, 64) + "ms"
	}
	return strconv.FormatFloat(s*1e6, 'f', 1, 64) + "us"
}

// jsonReport is the report's JSON: the job and the plans, sizes in bytes and times in seconds.
type jsonReport struct {
	Model       string     `json:"model"`
	GPUs        int        `json:"gpus"`
	Nodes       int        `json:"nodes"`
	GPU         string     `json:"gpu"`
	GlobalBatch int        `json:"global_batch"`
	Seq         int64      `json:"seq"`
	Usable      int64      `json:"usable"`
	Margin      float64    `json:"margin"`
	Searched    int        `json:"searched"`
	Fitting     int        `json:"fitting"`
	Plans       []jsonPlan `json:"plans"`
}

type jsonPlan struct {
	DP                   int     `json:"dp"`
	TP                   int     `json:"tp"`
	PP                   int     `json:"pp"`
	CP                   int     `json:"cp"`
	SequenceParallel     bool    `json:"sequence_parallel"`
	Schedule             string  `json:"schedule"`
	MicroBatch           int     `json:"micro_batch"`
	MicroBatches         int     `json:"micro_batches"`
	Recompute            string  `json:"recompute"`
	DistributedOptimizer bool    `json:"distributed_optimizer"`
	WorstStage           int     `json:"worst_stage"`
	Weights              int64   `json:"weights"`
	Gradients            int64   `json:"gradients"`
	Optimizer            int64   `json:"optimizer"`
	Activations          int64   `json:"activations"`
	Peak                 int64   `json:"peak"`
	Verdict              string  `json:"verdict"`
	Limit                int64   `json:"limit"`
	Headroom             int64   `json:"headroom"` // Limit less Peak
	StepSeconds          float64 `json:"step_s"`
	ComputeSeconds       float64 `json:"compute_s"`
	BubbleSeconds        float64 `json:"bubble_s"`
	TPSeconds            float64 `json:"tp_s"`
	CPSeconds            float64 `json:"cp_s"`
	DPSeconds            float64 `json:"dp_s"`
	OptimizerSeconds     float64 `json:"optimizer_s"`
	FLOPs                float64 `json:"flops"`
}

// WriteJSON writes the report as JSON, indented.
func (r *Report) WriteJSON(w io.Writer) error {
	j := r.Job
	out := jsonReport{Model: j.Name, GPUs: j.GPUs, Nodes: j.Nodes, GPU: j.GPU.Name, GlobalBatch: j.GlobalBatch, Seq: j.Model.Seq,
		Usable: j.Usable, Margin: j.Margin, Searched: r.Searched, Fitting: r.Fitting, Plans: []jsonPlan{}}
	for _, p := range r.Plans {
		l, s, t := p.Layout, p.Worst, p.Time
		out.Plans = append(out.Plans, jsonPlan{DP: l.DP, TP: l.TP, PP: l.PP, CP: l.CP, SequenceParallel: l.SequenceParallel,
			Schedule: l.Schedule.String(), MicroBatch: p.MicroBatch, MicroBatches: l.MicroBatches, Recompute: l.Recompute.String(),
			DistributedOptimizer: l.DistributedOptimizer, WorstStage: s.Index, Weights: int64(s.Weights), Gradients: int64(s.Gradients),
			Optimizer: int64(s.Optimizer), Activations: int64(s.Activation), Peak: int64(s.Total()), Verdict: p.Verdict.Word,
			Limit: p.Verdict.Limit, Headroom: p.Verdict.Limit - p.Verdict.PeakReserved, StepSeconds: t.Total(), ComputeSeconds: t.Compute, BubbleSeconds: t.Bubble, TPSeconds: t.TP,
			CPSeconds: t.CP, DPSeconds: t.DP, OptimizerSeconds: t.Optimizer, FLOPs: t.FLOPs})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
