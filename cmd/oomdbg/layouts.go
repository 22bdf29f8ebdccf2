package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/fit/layouts"
	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist/layout"
	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
)

func newLayoutsCmd() *cobra.Command {
	var preset, hfConfig, gpu string
	var seq, gpus, nodes, batch, micro, top, tp, pp, cp int
	var gpuMem uint64
	var margin float64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "layouts [--preset NAME | --hf-config FILE] --gpus N --nodes N [--gpu-mem SIZE] [--gpu NAME]",
		Short: "Search the model-parallel layouts (DP, TP, PP, CP) of a job that fit, fastest first",
		Long: `Enumerate every Megatron-style layout of the job: DP x TP x PP x CP = --gpus with TP within a node,
sequence parallelism with TP, the 1F1B and interleaved pipeline schedules, micro-batch sizes (--micro-batch,
or 1, 2, 4 and 8) and so micro-batch counts for the global --batch, recompute none, selective or full, and
the distributed optimizer on and off. Each layout's per-rank memory comes from workloads/dist/layout's
formulas (checked against Megatron-LM's report_theoretical_memory); a layout fits when its worst pipeline
stage's rank is within the headroom rule of what the allocator can use (--gpu-mem less the CUDA context,
less --margin). Those that fit are ranked by a modelled step time on --gpu's published peaks: compute,
the pipeline bubble, TP's, CP's and DP's collectives and the optimizer step (docs/distributed.md).

Exit codes: 0 a layout fits, 1 none fits, 2 bad usage.`,
		Example: `  oomdbg layouts --preset llama-2-70b --gpus 64 --nodes 8 --gpu-mem 80GiB
  oomdbg layouts --preset llama-2-70b --gpus 64 --nodes 8 --tp 8 --pp 1   # judge the layouts of TP 8 alone
  oomdbg layouts --preset llama-3.1-8b --gpus 8 --gpu h100 --batch 128 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			model, name, err := layoutsModel(preset, hfConfig, seq)
			if err != nil {
				return err
			}
			g, err := fit.LookupGPU(gpu)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("gpu-mem") {
				gpuMem = g.Memory
			}
			if margin < 0 || margin >= 100 || margin != margin {
				return fmt.Errorf("--margin %v: want a percentage in [0, 100)", margin)
			}
			if top < 1 || top > 1000 {
				return fmt.Errorf("--plans %d: want 1 to 1000", top)
			}
			job := layouts.Job{Name: name, Model: model, GPUs: gpus, Nodes: nodes, GlobalBatch: batch, MicroBatch: micro,
				GPU: g, Usable: int64(gpuMem) - device.DefaultContextReserve, Margin: margin / 100, Top: top, TP: tp, PP: pp, CP: cp}
			rep, err := layouts.Search(job)
			if err != nil {
				return err
			}
			write := rep.WriteText
			if asJSON {
				write = rep.WriteJSON
			}
			out := &checkedWriter{w: cmd.OutOrStdout()}
			if err := write(out); err != nil {
				return err
			}
			if err := out.Err(); err != nil {
				return err
			}
			if rep.Fitting == 0 {
				return &app.ProblemError{Msg: fmt.Sprintf("no layout of %s on %d GPUs fits within %s", name, gpus,
					units.FormatSize(int64(float64(job.Usable)*(1-job.Margin))))}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&preset, "preset", "llama-3.1-8b", "a published model: "+strings.Join(decoderPresets(), ", "))
	f.StringVar(&hfConfig, "hf-config", "", "a Hugging Face config.json of a decoder instead of --preset")
	f.IntVar(&seq, "seq", 0, "tokens a sequence (default: the model's context, at most 4096)")
	f.IntVar(&gpus, "gpus", 8, "GPUs in the job, every node's together")
	f.IntVar(&nodes, "nodes", 1, "nodes the GPUs are spread evenly over")
	f.IntVar(&batch, "batch", 1024, "global batch: sequences of one optimizer step over all data-parallel replicas")
	f.IntVar(&micro, "micro-batch", 0, "sequences a micro-batch (default: try 1, 2, 4 and 8)")
	f.IntVar(&tp, "tp", 0, "only layouts of this many tensor-parallel ranks (default: every size)")
	f.IntVar(&pp, "pp", 0, "only layouts of this many pipeline stages (default: every size)")
	f.IntVar(&cp, "cp", 0, "only layouts of this many context-parallel ranks (default: every size)")
	f.Var(sizeFlag{&gpuMem}, "gpu-mem", "each GPU's memory, e.g. 80GiB (binary units) (default: --gpu's)")
	f.Lookup("gpu-mem").DefValue = ""
	f.StringVar(&gpu, "gpu", fit.DefaultGPU, "the card whose published peaks the step times use: "+strings.Join(gpuNames(), ", "))
	f.Float64Var(&margin, "margin", 100*fit.DefaultMargin, "percent of the allocator's memory a layout must leave unreserved")
	f.IntVar(&top, "plans", layouts.DefaultTop, "how many fitting layouts to print")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// layoutsModel reads the model --preset or --hf-config names into layout's shape, and its name.
func layoutsModel(preset, hfConfig string, seq int) (m layout.Model, name string, err error) {
	var hf *hfconfig.Model
	if hfConfig != "" {
		f, err := os.Open(hfConfig)
		if err != nil {
			return m, "", err
		}
		defer f.Close()
		if hf, err = hfconfig.Read(f); err != nil {
			return m, "", fmt.Errorf("%s: %w", hfConfig, err)
		}
		name = hfConfig
	} else {
		if hf, err = hfconfig.Published(preset); err != nil {
			return m, "", fmt.Errorf("--preset %q: want one of %s", preset, strings.Join(decoderPresets(), ", "))
		}
		name = preset
	}
	if seq < 0 || seq > 1<<24 {
		return m, "", fmt.Errorf("--seq %d: want 1 to %d tokens, or 0 for the model's context", seq, 1<<24)
	}
	m, err = layouts.ModelFromHF(hf, seq)
	return m, name, err
}

// decoderPresets are the published models layouts can search: the decoders without experts.
func decoderPresets() []string {
	var names []string
	for _, n := range hfconfig.PublishedNames() {
		if m, err := hfconfig.Published(n); err == nil && m.Family() != "bert" && m.Experts == 0 {
			names = append(names, n)
		}
	}
	return names
}
