package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/recorder"
)

// exitCodeError ends oomdbg with the recorded job's own exit status.
type exitCodeError struct {
	code int
	msg  string
}

func (e *exitCodeError) Error() string { return e.msg }
func (e *exitCodeError) ExitCode() int { return e.code }

func newRecordCmd() *cobra.Command {
	var opt recorder.Options
	var stacks string
	var scopes, view bool
	cmd := &cobra.Command{
		Use:   "record [flags] -- COMMAND [ARGS...]",
		Short: "Record a PyTorch training job's GPU memory, unchanged, with oomdbg's tags",
		Long: `Run a PyTorch training command unchanged (python train.py, python -m pkg, torchrun ...,
accelerate launch ..., deepspeed ..., pytest ...) and record its GPU memory: every allocation and
free with its stack (torch.cuda.memory's history), and what PyTorch does not record: where each
iteration and phase begins (forward, backward, recompute, optimizer, zero_grad, eval, the batch),
which module's forward allocated each block, and which blocks hold parameters, gradients, optimizer
state and the batch. No package is installed and no line of the job changes: a Python module
carried in oomdbg starts in every Python process of the job when it imports torch, through a
sitecustomize hook first on PYTHONPATH (a sitecustomize of the job's own still runs).

Each process that uses CUDA writes its snapshots into DIR, named by its RANK (else LOCAL_RANK):
  rankN.oom.pickle          at an out-of-memory error, before PyTorch raises it
  rankN.end.pickle          at exit, after an uncaught exception, or on SIGTERM
  rankN.stepNNNNNNNN.pickle every --every optimizer steps and on SIGUSR1, the newest --keep kept
They are PyTorch's own snapshots (torch.cuda.memory._dump_snapshot's pickle, so memory_viz opens
them) with oomdbg's tags in one added key; oomdbg view, report and check read the tags as recorded,
not inferred. The job's output and exit status are its own: oomdbg exits with the job's code (128+N
when signal N ended it), 127 when the command does not exist, 2 for bad usage. SIGINT, SIGTERM and
SIGHUP are passed on to the job. Where torch has no CUDA, or lacks a feature the recorder uses, it
says so once on stderr and the job runs as it would.

--view opens the TUI on the newest snapshot while the job runs and moves to each newer one, landing
on the out-of-memory error when one is written; the job's output then goes to DIR/job.log.`,
		Example: `  oomdbg record -- python train.py --lr 3e-4
  oomdbg record -o dumps --every 100 -- torchrun --nproc-per-node 8 train.py
  oomdbg record --view -- accelerate launch finetune.py
  oomdbg record -o dumps -- pytest tests/ && oomdbg check dumps/rank0.end.pickle`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("no command to record: oomdbg record [flags] -- COMMAND [ARGS...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := recorder.ParseStacks(stacks)
			if err != nil {
				return err
			}
			opt.Stacks, opt.NoScopes = st, !scopes
			opt.Tool = "oomdbg record " + toolVersion()
			if opt.Entries < 1 || opt.Keep < 1 || opt.Every < 0 {
				return errors.New("--entries and --keep take a positive number, --every zero or more")
			}
			if view {
				return recordAndView(cmd, args, opt)
			}
			opt.Stdin, opt.Stdout, opt.Stderr = cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
			res, err := recorder.Run(cmd.Context(), args, opt)
			if err != nil {
				return err
			}
			recorder.WriteSummary(cmd.ErrOrStderr(), opt.Dir, res)
			return jobStatus(res)
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // flags after COMMAND are the job's: oomdbg record python train.py --lr 1 works too
	f.StringVarP(&opt.Dir, "out", "o", "oomdbg-record", "the directory the snapshots go to")
	f.IntVar(&opt.Entries, "entries", 1_000_000, "allocator events kept (the history's max_entries; the oldest go first)")
	f.StringVar(&stacks, "stacks", "python", "stacks kept with each event: python, all (Python and C++ frames) or none")
	f.IntVar(&opt.Every, "every", 0, "also write a snapshot every N optimizer steps (0: never)")
	f.IntVar(&opt.Keep, "keep", 3, "how many of the --every snapshots to keep per rank, the newest")
	f.BoolVar(&scopes, "scopes", true, "record which module's forward allocated each block (--scopes=false: cheaper)")
	f.BoolVar(&opt.Force, "force", false, "remove an earlier recording's snapshots from the directory first")
	f.BoolVar(&view, "view", false, "open the TUI on the newest snapshot while the job runs")
	return cmd
}

// jobStatus is nil for a job that exited 0, else an error that makes oomdbg exit with the job's status.
func jobStatus(res recorder.Result) error {
	switch {
	case res.ExitCode == 0:
		return nil
	case res.Signal != 0:
		return &exitCodeError{code: res.ExitCode, msg: fmt.Sprintf("record: the job was ended by %v (exit status %d)", res.Signal, res.ExitCode)}
	}
	return &exitCodeError{code: res.ExitCode, msg: fmt.Sprintf("record: the job exited with status %d", res.ExitCode)}
}

// recordAndView runs the job in the background, its output in DIR/job.log, and the TUI on its snapshots.
func recordAndView(cmd *cobra.Command, args []string, opt recorder.Options) error {
	if err := os.MkdirAll(opt.Dir, 0o755); err != nil {
		return err
	}
	keys, closeKeys, err := viewTerminal(cmd, opt.Dir)
	if err != nil {
		return err
	}
	defer closeKeys()
	logPath := filepath.Join(opt.Dir, "job.log")
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer log.Close()
	opt.Stdin, opt.Stdout, opt.Stderr = strings.NewReader(""), log, log
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	type outcome struct {
		res recorder.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := recorder.Run(ctx, args, opt)
		done <- outcome{res, err}
		if err != nil {
			cancel() // the job did not start: close the TUI
		}
	}()
	var mem memory
	if err := followDir(ctx, cmd, keys, opt.Dir, 0, &mem); err != nil {
		return err
	}
	// The TUI was closed: the job goes on to its end unless it was asked to stop.
	fmt.Fprintf(cmd.ErrOrStderr(), "oomdbg record: waiting for the job to end (its output is in %s; Ctrl-C stops it)\n", logPath)
	o := <-done
	if o.err != nil {
		return o.err
	}
	recorder.WriteSummary(cmd.ErrOrStderr(), opt.Dir, o.res)
	return jobStatus(o.res)
}
