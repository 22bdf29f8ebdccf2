package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/allocator/replay"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/whatif"
	"github.com/oomdbg/oomdbg/whatif/transform"
)

// whatIfOptions are the fixes `oomdbg whatif` applies, parsed.
type whatIfOptions struct {
	batchScale float64
	accum      int
	optimizer  string
	optImpl    string
	zeroGrad   string
	checkpoint string
	allocConf  string
	amp        string
	gpuMem     uint64
	changed    func(string) bool
}

// transforms parses the options into the transformations, in the order they compose: checkpointing
// first (it works on the recorded passes), then the batch and accumulation, zero_grad, the optimizer's
// implementation, the optimizer.
func (o whatIfOptions) transforms() ([]transform.Transform, *allocator.Config, error) {
	var ts []transform.Transform
	if o.changed("amp") {
		return nil, nil, errors.New("--amp: mixed precision cannot be read off a trace: a trace records sizes, not " +
			"dtypes, so which tensors would halve is unknown; simulate the model instead (oomdbg run --amp bf16 ...)")
	}
	if o.changed("checkpoint") {
		c, err := knob.ParseCheckpoint(o.checkpoint)
		if err == nil {
			err = transform.CheckCheckpoint(c)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("--checkpoint: %w", err)
		}
		ts = append(ts, transform.Checkpoint(c))
	}
	if o.changed("batch-scale") {
		if !(o.batchScale > 0 && o.batchScale <= 64) {
			return nil, nil, fmt.Errorf("--batch-scale %g: want a factor above 0 and at most 64", o.batchScale)
		}
		if o.batchScale != 1 {
			ts = append(ts, transform.BatchScale(o.batchScale))
		}
	}
	if o.changed("accum") {
		if o.accum < 2 || o.accum > 64 {
			return nil, nil, fmt.Errorf("--accum %d: want 2 to 64 micro-batches", o.accum)
		}
		ts = append(ts, transform.Accumulate(o.accum))
	}
	if o.changed("zero-grad") {
		m, err := knob.ParseZeroGrad(o.zeroGrad)
		if err != nil {
			return nil, nil, fmt.Errorf("--zero-grad: %w", err)
		}
		ts = append(ts, transform.ZeroGrad(m))
	}
	if o.changed("optimizer-impl") {
		impl, err := knob.ParseOptimizerImpl(o.optImpl)
		if err != nil {
			return nil, nil, fmt.Errorf("--optimizer-impl: %w", err)
		}
		ts = append(ts, transform.OptimizerImpl(impl))
	}
	if o.changed("optimizer") {
		opt, err := knob.ParseOptimizer(o.optimizer)
		if err == nil {
			err = transform.CheckOptimizer(opt)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("--optimizer: %w", err)
		}
		ts = append(ts, transform.SwitchOptimizer(opt))
	}
	var cfg *allocator.Config
	if o.changed("alloc-conf") {
		c, err := allocator.ParseConfig(o.allocConf)
		if err != nil {
			return nil, nil, fmt.Errorf("--alloc-conf %q: %w", o.allocConf, err)
		}
		cfg = &c
	}
	if len(ts) == 0 && cfg == nil {
		return nil, nil, errors.New("no fix given: add --batch-scale, --accum, --optimizer, --optimizer-impl, --zero-grad, --checkpoint or --alloc-conf")
	}
	return ts, cfg, nil
}

// costWhatIf is what an event costs a what-if: the trace, its transformed copy and the two replays;
// costWhatIfEnds the same where checkpointing makes a second transformed copy and a third replay. Peak
// resident memory over events, with 96-byte events: 241 bytes a batch scale and 546 a checkpointing on a
// 1,344,295-event GPT recording, a quarter of whose events are retains, which a transformed copy drops; 417
// and 764 on the same run as a PyTorch pickle (897,406 events, none dropped); rounded up.
const (
	costWhatIf     = 8 * snapshot.EventBytes
	costWhatIfEnds = 10 * snapshot.EventBytes
)

// newWhatIfCmd is `oomdbg whatif FILE [fixes]`.
func newWhatIfCmd() *cobra.Command {
	var (
		o      whatIfOptions
		asJSON bool
		mem    memory
	)
	cmd := &cobra.Command{
		Use:   "whatif FILE",
		Short: "Apply fixes to a recorded trace and replay it: would the run still run out of memory?",
		Long: `Change a recorded trace the way a fix would change the program's requests to the caching allocator,
replay it through oomdbg's model of the allocator, and print the peak allocated and reserved memory and
whether the run fits, before and after, with PyTorch's message where it does not.

The fixes read the trace's tags (phase, iteration, category, module scope); oomdbg's recordings carry them
all. A trace that lacks what a fix needs is refused, never guessed. Each fix says what it assumed, with
its figures. A trace that ends in an out-of-memory error is changed as far as it was recorded: what would
have come after was never recorded. Mixed precision cannot be read off a trace (dtypes are not recorded).

The device's capacity is --gpu-mem, else the recorded device's (less the CUDA context), else the memory
reserved at a recorded OOM plus what the device reported free. See docs/whatif.md.`,
		Example: `  oomdbg whatif run.oomdbg --batch-scale 0.5
  oomdbg whatif run.oomdbg --accum 4 --optimizer sgd
  oomdbg whatif run.oomdbg --checkpoint every:2 --alloc-conf expandable_segments:True --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.changed = cmd.Flags().Changed
			ts, cfg, err := o.transforms()
			if err != nil {
				return err
			}
			cost := costWhatIf
			if o.checkpoint != "" {
				cost = costWhatIfEnds
			}
			s, err := load.File(args[0], load.WithBudget(mem.budget(cost)))
			if err != nil {
				return memoryError(err, &mem)
			}
			// Accumulation repeats forward and backward: the transformed trace and its replay hold about
			// K times the events, two copies of each (measured: 960 bytes an event at K = 4).
			if k := int64(max(o.accum, 1)); k > 1 {
				need := int64(s.Events.Len()) * (cost + (k-1)*2*snapshot.EventBytes)
				if limit := mem.resolve(); uint64(need) > limit {
					return fmt.Errorf("%s: accumulating %d micro-batches would hold about %s, more than the %s "+
						"--max-memory allows", args[0], k, units.FormatSize(need), units.FormatSize(limit))
				}
			}
			rep, err := whatIf(s, ts, cfg, o.gpuMem)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			rep.File = filepath.Base(args[0])
			if s.Warning != nil { // a recording cut short: the figures are for what it holds
				rep.Notes = append(rep.Notes, fmt.Sprintf("%v: the figures are for the %d events it holds", s.Warning, s.Events.Len()))
			}
			if asJSON {
				return rep.writeJSON(cmd.OutOrStdout())
			}
			return rep.writeText(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.Float64Var(&o.batchScale, "batch-scale", 1, "multiply the batch by this factor, e.g. 0.5")
	f.IntVar(&o.accum, "accum", 1, "accumulate gradients over K micro-batches of batch/K")
	f.StringVar(&o.optimizer, "optimizer", "", "switch the optimizer: sgd, momentum, adam, adamw or adamw8bit (bitsandbytes)")
	f.StringVar(&o.optImpl, "optimizer-impl", "", "run Adam's step as foreach or for-loop (one parameter at a time)")
	f.StringVar(&o.zeroGrad, "zero-grad", "", "zero_grad mode: none (set_to_none) or zero")
	f.StringVar(&o.checkpoint, "checkpoint", "", "activation checkpointing of the repeated blocks: all or every:N")
	f.StringVar(&o.allocConf, "alloc-conf", "", "allocator settings for the replay after, as PYTORCH_CUDA_ALLOC_CONF")
	f.StringVar(&o.amp, "amp", "", "mixed precision: refused, since a trace does not record dtypes")
	f.Var(sizeFlag{&o.gpuMem, maxSize}, "gpu-mem", "device memory the allocator may use, e.g. 24GiB (binary units)")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	addMemoryFlag(f, &mem)
	return cmd
}

// whatIfSide is one replay's result.
type whatIfSide struct {
	PeakAllocated int64  `json:"peak_allocated"`
	PeakReserved  int64  `json:"peak_reserved"`
	OOM           bool   `json:"oom"`
	Message       string `json:"message,omitempty"` // PyTorch's message for the OOM
	Settings      string `json:"settings"`
}

// whatIfReport is what `oomdbg whatif` prints.
type whatIfReport struct {
	File         string     `json:"file"`
	Fixes        []string   `json:"fixes"`
	Device       int        `json:"device"`
	Capacity     uint64     `json:"capacity"` // 0: unknown (unlimited)
	CapacityFrom string     `json:"capacity_from"`
	Before       whatIfSide `json:"before"`
	After        whatIfSide `json:"after"`
	// AfterHeld is the replay after with the releases the trace does not record held as late as it allows
	// (checkpointing: transform.ApplyEnds); After puts them as early. Absent when no fix places any.
	AfterHeld *whatIfSide `json:"after_held,omitempty"`
	// Verdict is "fits", "oom", or "edge" where After and AfterHeld differ; "unknown" without a capacity.
	Verdict     string   `json:"verdict"`
	Assumptions []string `json:"assumptions"`
	// Unrecorded says what the trace never recorded, when it ends in an out-of-memory error.
	Unrecorded string   `json:"unrecorded,omitempty"`
	Notes      []string `json:"notes,omitempty"`
}

// whatIf applies ts to s, replays the trace before and after (after under cfg when given) and compares.
func whatIf(s *snapshot.Snapshot, ts []transform.Transform, cfg *allocator.Config, gpuMem uint64) (*whatIfReport, error) {
	recorded, _ := replay.RecordedSettings(s)
	afterCfg := recorded
	if cfg != nil {
		afterCfg = *cfg
	}
	// The replay before and the transformation only read s: they run side by side.
	var (
		prep *whatif.Prepared
		tErr error
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		prep, tErr = whatif.Prepare(s, ts...)
	}()
	w, before, err := whatif.Before(s, recorded, gpuMem)
	<-done
	if errors.Is(err, replay.ErrNoTrace) {
		return nil, fmt.Errorf("%w; record one with torch.cuda.memory._record_memory_history()", err)
	}
	if err != nil {
		return nil, err
	}
	if err := tErr; err != nil {
		return nil, err
	}
	res, err := prep.Replay(afterCfg, w.Device, w.Capacity)
	if err != nil {
		return nil, err
	}
	rep := &whatIfReport{Device: w.Device, Capacity: w.Capacity, CapacityFrom: w.CapacityFrom,
		Before: side(w.Outcome), After: side(res.After), Assumptions: prep.Assumptions}
	for _, t := range ts {
		rep.Fixes = append(rep.Fixes, t.Name)
	}
	if cfg != nil {
		rep.Fixes = append(rep.Fixes, "alloc-conf "+cfg.String())
		was := recorded.String()
		if was == "" {
			was = "PyTorch's defaults"
		}
		rep.Assumptions = append(rep.Assumptions, fmt.Sprintf("alloc-conf: the requests replayed after under %s, "+
			"before under the recorded settings (%s)", cfg.String(), was))
	}
	switch {
	case w.Capacity == 0:
		rep.Verdict = "unknown"
	case res.Edge():
		rep.Verdict = "edge"
	case rep.After.OOM:
		rep.Verdict = "oom"
	default:
		rep.Verdict = "fits"
	}
	if res.Held != nil {
		held := side(*res.Held)
		rep.AfterHeld = &held
	}
	if len(before) > 1 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the trace has %d devices: device %d, whose reserved memory peaks highest, is shown",
			len(before), w.Device))
	}
	if w.Capacity == 0 {
		rep.Notes = append(rep.Notes, "no device capacity is known: give --gpu-mem to see whether the run fits")
	}
	if w.RecordedOOMs > 0 {
		rep.Unrecorded = "the recording ends in an out-of-memory error: the figures are for the part that was " +
			"recorded; what would have come after it was never recorded (record with a fix that lets the step " +
			"finish, or simulate the model with oomdbg run)"
	}
	return rep, nil
}

// side reads one replay's outcome.
func side(o replay.Outcome) whatIfSide {
	s := whatIfSide{PeakAllocated: o.PeakAllocated, PeakReserved: o.PeakReserved, Settings: o.Settings}
	s.OOM, s.Message = whatif.Fails(o)
	return s
}

func (r *whatIfReport) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (r *whatIfReport) writeText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n", r.File, strings.Join(r.Fixes, ", "))
	verdict := func(s whatIfSide) string {
		switch {
		case s.OOM:
			return "out of memory"
		case r.Capacity == 0:
			return "unknown"
		case r.Unrecorded != "":
			return "fits so far"
		}
		return "fits"
	}
	capacity := "unknown"
	if r.Capacity > 0 {
		capacity = units.FormatSize(r.Capacity) + " (" + r.CapacityFrom + ")"
	}
	fmt.Fprintf(&b, "device %d, capacity %s\n\n", r.Device, capacity)
	held := r.AfterHeld
	if held == nil {
		fmt.Fprintf(&b, "  %-16s %14s %14s %10s\n", "", "before", "after", "change")
		row := func(name string, x, y int64) {
			fmt.Fprintf(&b, "  %-16s %14s %14s %10s\n", name, units.FormatSize(x), units.FormatSize(y), units.FormatChange(y-x))
		}
		row("peak allocated", r.Before.PeakAllocated, r.After.PeakAllocated)
		row("peak reserved", r.Before.PeakReserved, r.After.PeakReserved)
		fmt.Fprintf(&b, "  %-16s %14s %14s\n", "verdict", verdict(r.Before), verdict(r.After))
	} else {
		// The after column puts the releases the trace does not record as early as it allows, the held
		// column as late.
		fmt.Fprintf(&b, "  %-16s %14s %14s %14s %10s\n", "", "before", "after", "if held", "change")
		row := func(name string, x, y, z int64) {
			fmt.Fprintf(&b, "  %-16s %14s %14s %14s %10s\n", name, units.FormatSize(x), units.FormatSize(y),
				units.FormatSize(z), units.FormatChange(y-x))
		}
		row("peak allocated", r.Before.PeakAllocated, r.After.PeakAllocated, held.PeakAllocated)
		row("peak reserved", r.Before.PeakReserved, r.After.PeakReserved, held.PeakReserved)
		fmt.Fprintf(&b, "  %-16s %14s %14s %14s\n", "verdict", verdict(r.Before), verdict(r.After), verdict(*held))
		b.WriteString("\nafter: each tensor a checkpointed block saved is released once the first op that read it " +
			"returns; if held: once the function that made it returns. The trace does not record which op reads a " +
			"tensor last, so the run lies between the two.\n")
	}
	if r.Verdict == "edge" {
		b.WriteString("at the edge: it fits at one end and runs out of memory at the other: leave headroom, or " +
			"record the fix to know.\n")
	}
	if r.After.OOM {
		fmt.Fprintf(&b, "\nafter: %s\n", r.After.Message)
	} else if held != nil && held.OOM {
		fmt.Fprintf(&b, "\nif held: %s\n", held.Message)
	}
	b.WriteString("\nassumes:\n")
	for _, a := range r.Assumptions {
		fmt.Fprintf(&b, "  - %s\n", a)
	}
	if r.Unrecorded != "" {
		fmt.Fprintf(&b, "\n%s\n", r.Unrecorded)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
