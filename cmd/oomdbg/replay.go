package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/app"
)

// newReplayCmd is `oomdbg replay FILE [--alloc-conf SETTINGS]`.
func newReplayCmd() *cobra.Command {
	var (
		conf   string
		gpuMem uint64
		asJSON bool
		mem    memory
	)
	cmd := &cobra.Command{
		Use:   "replay FILE",
		Short: "Replay a PyTorch memory trace through the caching allocator model, under its settings or others",
		Long: `Replay the allocations and frees of a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot, pickle or
JSON) through oomdbg's model of PyTorch's CUDA caching allocator.

Under the settings the snapshot was recorded with, the replay reports its fidelity: the sizes of the
segments the recording created, the addresses of the blocks it reused, the segments each empty_cache
released and the final segment state, against the model's. Segments alive before the trace began (PyTorch's
trace is a ring buffer) are rebuilt from the final state where their layout is certain; allocations in the
others are counted as not replayed, never guessed. Snapshots from before PyTorch 2.4 do not record their
settings: PyTorch's defaults are assumed.

--alloc-conf replays the trace again under other settings, written as PYTORCH_CUDA_ALLOC_CONF
(expandable_segments:True, max_split_size_mb:N, roundup_power2_divisions:N or [k:v,...],
garbage_collection_threshold:F with per_process_memory_fraction:F, ...), and compares the peak reserved
memory, what fragmentation costs and whether the recorded out-of-memory error would still happen. The
device's capacity is --gpu-mem, or, when the recording has an OOM, the memory reserved then plus what the
device reported free; otherwise it is unlimited.`,
		Example: `  oomdbg replay dump_snapshot.pickle
  oomdbg replay dump_snapshot.pickle --alloc-conf expandable_segments:True
  oomdbg replay dump_snapshot.pickle --alloc-conf max_split_size_mb:128 --gpu-mem 24GiB --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var tried *allocator.Config
			if cmd.Flags().Changed("alloc-conf") {
				cfg, err := allocator.ParseConfig(conf)
				if err != nil {
					return fmt.Errorf("--alloc-conf %q: %w", conf, err)
				}
				tried = &cfg
			}
			rep, err := app.Replay(args[0], tried, gpuMem, &mem.Limit, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if asJSON {
				return rep.WriteJSON(cmd.OutOrStdout())
			}
			return rep.WriteText(cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&conf, "alloc-conf", "", "allocator settings to try, as PYTORCH_CUDA_ALLOC_CONF (e.g. expandable_segments:True)")
	cmd.Flags().Var(sizeFlag{&gpuMem}, "gpu-mem", "device memory the allocator may use in the --alloc-conf replays, e.g. 24GiB (binary units) (default: the memory reserved at a recorded OOM plus what the device reported free; else unlimited)")
	cmd.Flags().Lookup("gpu-mem").DefValue = "0" // not shown: the usage says what the default is
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	addMemoryFlag(cmd.Flags(), &mem)
	return cmd
}
