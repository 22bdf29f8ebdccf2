package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/table"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/workloads/train"
)

func newFixesCmd() *cobra.Command {
	cfg, err := train.PresetConfig(train.DefaultPreset) // what fixes measures without --preset or --model
	if err != nil {
		panic(err) // the default preset is built in
	}
	var preset string
	var markdown, frag bool
	cmd := &cobra.Command{
		Use:   "fixes [flags]",
		Short: "Measure what each memory fix does to a workload's peak",
		Long: `Run a workload on the meta device with each memory fix and combination of fixes (flash attention,
mixed precision, activation checkpointing, a smaller batch with gradient accumulation, another
optimizer) and print the peak allocated and reserved memory, whether it fits the device, and what it
needs with unlimited memory. Two steps per fix: the second carries the optimizer state.

It takes the same flags as run; without --preset or --model it measures the default workload,
` + train.DefaultPreset + `, whose settings the defaults below show. --model mlp starts from the MLP instead.

--fragmentation measures what changes how the caching allocator's memory fragments instead, for --steps
steps (fragmentation builds up over steps of different shapes): expandable_segments:True,
max_split_size_mb:128 and :512, garbage_collection_threshold:0.6 (with the memory fraction it needs to
act), empty_cache at every step, and for variable lengths (--seq-dist) padding to a multiple of 64 and
length grouping. For each: peak allocated and reserved memory, the share of reserved memory unallocated
when it peaked, whether it fits (and, for an OOM, whether it was capacity's or fragmentation's), and
the cudaMalloc and cudaFree calls per step after the first, with what empty_cache returned. Below the
table, the rule "above 20% fragmentation, call empty_cache" is held against the measurement.`,
		Example: `  oomdbg fixes                                  # the default workload (gpt2-medium, batch 16, 24 GiB)
  oomdbg fixes --preset buildalong --markdown
  oomdbg fixes --preset gpt2-large --gpu-mem 80GiB
  oomdbg fixes --fragmentation --preset gpt2-small --amp bf16 --attention flash --batch 20 \
      --seq-dist uniform:64:1024 --steps 20 --markdown`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, name := range sweepFixed {
				if cmd.Flags().Changed(name) && !(frag && name == "steps") {
					return fmt.Errorf("--%s does not apply: fixes measures two steps on the meta device, without leak bugs", name)
				}
			}
			if preset == "" && !cmd.Flags().Changed("model") && !cmd.Flags().Changed("hf-config") {
				preset = train.DefaultPreset
			}
			cfg, err := configFromFlags(cmd.Flags(), preset)
			if err != nil {
				return err
			}
			if err := cfg.Validate(); err != nil {
				return flagError(err)
			}
			if frag {
				rows, err := train.SweepSettings(cmd.Context(), cfg, train.SettingsFixesFor(cfg))
				if err != nil {
					return err
				}
				printSettings(cmd.OutOrStdout(), cfg, rows, markdown)
				return nil
			}
			rows, err := train.Sweep(cmd.Context(), cfg, train.FixesFor(cfg))
			if err != nil {
				return err
			}
			printFixes(cmd.OutOrStdout(), cfg, rows, markdown)
			return nil
		},
	}
	addConfigFlags(cmd.Flags(), &cfg)
	for _, name := range sweepFixed {
		cmd.Flags().MarkHidden(name)
	}
	addModelSourceFlags(cmd.Flags(), &preset)
	cmd.Flags().BoolVar(&markdown, "markdown", false, "print a markdown table")
	cmd.Flags().BoolVar(&frag, "fragmentation", false, "measure the allocator settings, empty_cache and the data's shapes over --steps steps instead")
	return cmd
}

// sweepFixed are run's flags that a sweep sets itself (train.Sweep), hidden from fixes --help and refused.
var sweepFixed = []string{"steps", "device", "bug"}

// printFixes prints the sweep as an aligned table, or as markdown.
func printFixes(w io.Writer, cfg train.Config, rows []train.SweepRow, markdown bool) {
	name := cfg.Preset
	if name == "" {
		name = cfg.Model
	}
	if cfg.Parallel.World() > 1 {
		printDistFixes(w, cfg, name, rows, markdown)
		return
	}
	fmt.Fprintf(w, "%s, batch %d, on %s (%s taken by the CUDA context), meta device, 2 steps:\n\n",
		name, cfg.Batch, units.FormatSize(int64(cfg.GPUMemory)), units.FormatSize(int64(cfg.ContextReserve)))
	if cfg.Model == "llama" {
		fmt.Fprintf(w, "sequence %d, AdamW unless named, LoRA and QLoRA of rank 16 (alpha 32) on every projection under bf16 autocast, attention %s\n\n",
			cfg.Seq, map[knob.Attention]string{knob.AttentionFlash: "sdpa (flash)", knob.AttentionNaive: "eager"}[cfg.Attention])
	}
	header := []string{"fix", "peak allocated", "peak reserved", "fits", "needs (allocated)"}
	paged := slices.ContainsFunc(rows, func(r train.SweepRow) bool { return r.Paged > 0 })
	if paged { // unified memory is outside the allocator's figures: say it apart
		header = append(header, "paged state (evicted)")
	}
	var cells [][]string
	for _, r := range rows {
		fits := "yes"
		if r.OOM != nil {
			fits = fmt.Sprintf("OOM in %s", r.OOM.Phase)
		}
		row := []string{r.Fix, units.FormatSize(r.PeakAllocated), units.FormatSize(r.PeakReserved), fits,
			units.FormatSize(r.NeedsAllocated)}
		if paged {
			cell := ""
			if r.Paged > 0 {
				cell = fmt.Sprintf("%s (%s)", units.FormatSize(int64(r.Paged)), units.FormatSize(int64(r.PagedEvicted)))
			}
			row = append(row, cell)
		}
		cells = append(cells, row)
	}
	table.Write(w, header, cells, markdown, 1)
}

// sweepTitle says what a sweep ran: the workload, its shape and data, and the card.
func sweepTitle(cfg train.Config) string {
	name := cfg.Preset
	if name == "" {
		name = cfg.Model
	}
	var parts []string
	for _, p := range []struct{ val, off string }{{cfg.AMP.String(), "off"}, {cfg.Attention.String(), "naive"}} {
		if p.val != p.off {
			parts = append(parts, p.val)
		}
	}
	if cfg.Checkpoint != knob.CheckpointOff {
		parts = append(parts, "checkpoint "+cfg.Checkpoint.String())
	}
	shape := fmt.Sprintf("batch %d", cfg.Batch)
	if !cfg.SeqDist.Fixed() {
		shape += ", lengths " + cfg.SeqDist.String() + " (context " + fmt.Sprint(cfg.Seq) + "), padding " + cfg.Padding.String()
		if cfg.SortByLength {
			shape += ", sorted by length"
		}
	}
	if s := cfg.AllocConf.String(); s != "" {
		parts = append(parts, "PYTORCH_CUDA_ALLOC_CONF="+s)
	}
	if len(parts) > 0 {
		name += " (" + strings.Join(parts, ", ") + ")"
	}
	return fmt.Sprintf("%s, %s, on %s (%s taken by the CUDA context)", name, shape,
		units.FormatSize(int64(cfg.GPUMemory)), units.FormatSize(int64(cfg.ContextReserve)))
}

// printSettings prints a settings sweep: each setting's peaks, fragmentation, fit and cost, then the rule
// of thumb held against it.
func printSettings(w io.Writer, cfg train.Config, rows []train.SweepRow, markdown bool) {
	steps := 0
	if len(rows) > 0 {
		steps = rows[0].MeasuredOnSteps
	}
	fmt.Fprintf(w, "%s, meta device, %d steps:\n\n", sweepTitle(cfg), steps)
	header := []string{"setting", "peak allocated", "peak reserved", "fragmentation", "fits", "cudaMalloc per step", "cudaFree per step", "empty_cache returns per step"}
	var cells [][]string
	var ms []triage.Measurement
	for _, r := range rows {
		m := measurement(r)
		ms = append(ms, m)
		fits := "yes"
		if o := r.OOM; o != nil {
			kind := triage.OOMKind(o.Request, o.Reserved-o.Allocated, o.DeviceFree)
			fits = fmt.Sprintf("OOM in step %d, %s (%s)", o.Iteration, o.Phase, kind)
		}
		mallocs, frees, released := "-", "-", "-"
		if m.CostSteps > 0 {
			mallocs, frees = triage.PerStep(m.MallocsPerStep), triage.PerStep(m.FreesPerStep)
			if r.Config.EmptyCache != train.EmptyCacheNever {
				released = units.FormatSize(m.ReleasedPerStep)
			}
		}
		cells = append(cells, []string{r.Fix, units.FormatSize(r.PeakAllocated), units.FormatSize(r.PeakReserved),
			fmt.Sprintf("%.1f%%", 100*m.Fragmentation), fits, mallocs, frees, released})
	}
	table.Write(w, header, cells, markdown, 1)
	fmt.Fprintf(w, "\nFragmentation is (reserved - allocated) / reserved when reserved memory peaked; the costs are the means\n"+
		"of the completed steps after the first, which fills the cache (- when none completed, or for empty_cache\n"+
		"when the setting does not call it).\n")
	if rc := triage.CheckFragmentationRule(ms); rc != nil {
		fmt.Fprintf(w, "\nThe %.0f%% rule (call empty_cache when more than %.0f%% of reserved memory is unallocated): %s.\n",
			100*rc.Threshold, 100*rc.Threshold, rc.Verdict)
	}
}

// printDistFixes prints a sweep of a data-parallel job's strategies: each rank's peak and what it is made of
// at the peak, its host memory and what it sends per step.
func printDistFixes(w io.Writer, cfg train.Config, name string, rows []train.SweepRow, markdown bool) {
	p := cfg.Parallel
	nodes := ""
	if p.NodeCount() > 1 {
		nodes = fmt.Sprintf(" on %d nodes", p.NodeCount())
	}
	fmt.Fprintf(w, "%s, micro-batch %d per rank, %d x %s%s (%s taken by the CUDA context), meta device, 2 steps, rank %d:\n",
		name, cfg.Batch, p.World(), units.FormatSize(int64(cfg.GPUMemory)), nodes, units.FormatSize(int64(cfg.ContextReserve)), p.Rank)
	fmt.Fprintf(w, "mixed-precision AdamW (bf16), checkpoint %s, attention %s; the peak's parts are those of the run with unlimited memory where the rank ran out\n\n",
		cfg.Checkpoint, cfg.Attention)
	header := []string{"strategy", "peak per rank", "fits", "parameters", "gradients", "optimizer state", "activations", "other", "host", "sent per step"}
	var cells [][]string
	for _, r := range rows {
		fits := "yes"
		if r.OOM != nil {
			fits = fmt.Sprintf("OOM in %s (needs %s)", r.OOM.Phase, units.FormatSize(r.NeedsAllocated))
		}
		c := r.Composition
		other := c[snapshot.CategoryTemporary] + c[snapshot.CategoryAutogradDetail] + c[snapshot.CategoryAMPCache] +
			c[snapshot.CategoryInput] + c[snapshot.CategoryUnknown]
		host := "-"
		if r.Host.PeakAllocated > 0 {
			host = units.FormatSize(int64(r.Host.PeakAllocated))
		}
		cells = append(cells, []string{r.Fix, units.FormatSize(r.PeakAllocated), fits,
			units.FormatSize(c[snapshot.CategoryParameter]), units.FormatSize(c[snapshot.CategoryGradient]),
			units.FormatSize(c[snapshot.CategoryOptimizerState]), units.FormatSize(c[snapshot.CategoryActivation]),
			units.FormatSize(other), host, units.FormatSize(r.Traffic.Sent)})
	}
	table.Write(w, header, cells, markdown, 1)
}
