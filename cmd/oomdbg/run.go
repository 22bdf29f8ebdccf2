package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/internal/outfile"
	"github.com/oomdbg/oomdbg/workloads/train"
)

func newRunCmd() *cobra.Command {
	var rec app.Recording
	var ranks string
	var mem memory
	var flags *configFlags
	cmd := &cobra.Command{
		Use:   "run [flags]",
		Short: "Record a training workload headless into a snapshot file",
		Long: `Run a training workload and record every allocation, with its stack, phase, iteration, module and
category, into a snapshot file; then print the peak, the phases and the OOM, if any.

Every dimension of the model and every setting of the run is a flag, so any shape can be recorded
without writing code. Without --preset or --hf-config it runs the MLP; --preset starts from a built-in
workload instead (--model gpt from ` + train.DefaultPreset + `), and the flags given change it. The defaults
below say which are the MLP's, and which every model shares. The
gpt loop is nanoGPT's train.py: it keeps the logits alive through backward until the next forward returns
(--logits drop frees them before backward, as HF Trainer does). An OOM stops the run like it stops a
PyTorch job, with a complete snapshot; so do Ctrl-C, SIGTERM and SIGHUP (the exit code is then 130, 143
or 129, as shells expect). The exit code is 1 when the run ran out of memory, or when the file it wrote
fails oomdbg check's leak verdict (the summary then ends with check's line).

The recording is written as it happens, a chunk at every phase end and at least every 200 ms, so a
run killed any other way (kill -9, the OOM killer) leaves a snapshot that reads up to its last 200 ms,
and oomdbg view --follow can watch it grow. A write that fails part-way (a full disk, a file-size limit)
stops the run at its next phase, with the summary of what was written, and exit code 2. When standard
error is a terminal, it shows the run's progress on one line as it goes: steps done, the loss on the cpu
device, and the time. -o - writes the snapshot to standard output and the
summary to standard error. An existing regular file is replaced; a symbolic link or a read-only file
only with --force; a directory, a socket or a block device never. A FIFO or a character device
(/dev/null) is written into like a pipe.

On the cpu device the tensors live in host memory: the run first measures what the model needs on the
meta device and refuses to start when that is more than --max-memory.`,
		Example: `  oomdbg run --preset gpt2-medium -o medium.oomdbg          # OOMs on a 24 GiB card
  oomdbg run --preset gpt2-medium --amp bf16 --attention flash --checkpoint all
  oomdbg run --preset llama-3.1-8b --lora 16 --lora-targets q,k,v,o,gate,up,down --qlora --checkpoint all
  oomdbg run --hf-config config.json --batch 2 --seq 4096 --optimizer paged-adamw8bit
  oomdbg run --hidden 4096 --layers 8 --batch 4096 --gpu-mem 8GiB -o big.oomdbg
  oomdbg run --bug retain-graph --steps 20 -o leak.oomdbg
  oomdbg run --preset llama-3.1-8b --gpus 8 --dp zero3 --offload optimizer --checkpoint all --gpu-mem 80GiB
  oomdbg run --preset buildalong --gpus 4 --dp zero2 --ranks uneven -o job.oomdbg && oomdbg report job.rank*.oomdbg
  oomdbg run --preset tiny --steps 2000 -o - | oomdbg view -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ranks != "" && ranks != "uneven" {
				return fmt.Errorf("--ranks %q: the only choice is uneven (--rank N records one rank)", ranks)
			}
			cfg, err := flags.config()
			if err != nil {
				return err
			}
			flags.writeSource(cmd.ErrOrStderr())
			rec.Memory, rec.Version = &mem.Limit, toolVersion()
			if outfile.IsTerminal(cmd.ErrOrStderr()) {
				rec.Progress = cmd.ErrOrStderr()
			}
			record := app.Record
			if ranks == "uneven" {
				record = app.RecordRanks
			}
			return flags.explain(record(cmd.Context(), cfg, rec, cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}
	flags = addConfigFlags(cmd.Flags(), train.DefaultMLP()).addHFConfig()
	flags.showDefaults()
	cmd.Flags().StringVar(&ranks, "ranks", "", "uneven: record rank 0 and every rank whose memory differs, each into -o's name with .rankN before its extension")
	cmd.Flags().StringVarP(&rec.Path, "output", "o", "run.oomdbg", "snapshot file to write ('-' for standard output)")
	cmd.Flags().BoolVar(&rec.Force, "force", false, "write through a symbolic link, or replace a read-only file")
	addMemoryFlag(cmd.Flags(), &mem)
	return cmd
}
