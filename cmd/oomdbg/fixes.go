package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/fixes"
	"github.com/oomdbg/oomdbg/workloads/train"
)

func newFixesCmd() *cobra.Command {
	cfg, err := train.PresetConfig(train.DefaultPreset) // what fixes measures without --preset or --model
	if err != nil {
		panic(err) // the default preset is built in
	}
	var markdown, frag bool
	var flags *configFlags
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
			for _, name := range append(sweepFixed, "steps") {
				if cmd.Flags().Changed(name) && !(frag && name == "steps") {
					return fmt.Errorf("--%s does not apply: fixes measures two steps on the meta device, without leak bugs (--steps: with --fragmentation)", name)
				}
			}
			cfg, err := flags.config()
			if err != nil {
				return err
			}
			flags.writeSource(cmd.ErrOrStderr())
			rows, err := fixes.Measure(cmd.Context(), cfg, frag)
			if err != nil {
				return flags.explain(err)
			}
			write := fixes.Write
			if frag {
				write = fixes.WriteSettings
			}
			out := &checkedWriter{w: cmd.OutOrStdout()}
			write(out, cfg, rows, markdown)
			return out.Err()
		},
	}
	flags = addConfigFlags(cmd.Flags(), cfg).addHFConfig()
	flags.defaultPreset = train.DefaultPreset
	for _, name := range sweepFixed {
		cmd.Flags().MarkHidden(name)
	}
	cmd.Flags().Lookup("steps").Usage = "with --fragmentation, the steps measured (without it, fixes measures two and refuses --steps)"
	flags.showDefaults()
	cmd.Flags().BoolVar(&markdown, "markdown", false, "print a markdown table")
	cmd.Flags().BoolVar(&frag, "fragmentation", false, "measure the allocator settings, empty_cache and the data's shapes over --steps steps instead")
	return cmd
}

// sweepFixed are run's flags that a sweep sets itself (train.Sweep), hidden from fixes --help and refused;
// --steps is refused too, but for --fragmentation, which measures that many.
var sweepFixed = []string{"device", "bug"}
