package triage

import (
	"cmp"
	"context"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/internal/torchrules"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
)

// Measurer re-runs the workload a snapshot recorded, once per memory fix, and reports the peaks. The
// command line implements it with the training workload's sweep on the meta device; triage does not run
// workloads itself.
type Measurer interface {
	// Measure returns the peaks of the workload as configured and with each fix. It returns an error
	// wrapping ErrNotMeasurable when the snapshot's workload cannot be re-run (an imported trace).
	Measure(ctx context.Context, s *snapshot.Snapshot) (*Measurements, error)
}

// ErrNotMeasurable says a snapshot's workload cannot be re-run.
var ErrNotMeasurable = errors.New("the snapshot does not describe a workload oomdbg can re-run")

// Measurements are the peaks of a workload under each fix.
type Measurements struct {
	// Note says how they were measured, e.g. "re-run on the meta device, 2 steps per fix".
	Note string
	// Rows are the fixes; the first is the workload as configured.
	Rows []Measurement
	// Settings are the allocator settings, empty_cache and the data's shapes, measured over the recorded
	// steps (SettingsNote says how); the first is the workload as configured. Empty when not measured.
	SettingsNote string
	Settings     []Measurement
}

// Measurement is one fix's run.
type Measurement struct {
	Fix           string
	PeakAllocated int64 // on the configured device, up to the OOM when it ran out
	PeakReserved  int64
	OOM           bool // it ran out of memory on the configured device
	OOMPhase      string
	// NeedsAllocated is the peak with unlimited memory: what the run needs.
	NeedsAllocated int64
	// NeedsReserved is the peak of reserved memory with unlimited memory.
	NeedsReserved int64
	// Fragmentation is (reserved - allocated) / reserved when reserved memory peaked on the configured
	// device.
	Fragmentation float64
	// CostSteps is how many completed steps after the first the costs are the mean of (0: none): cudaMalloc
	// calls, cudaFree calls and the bytes empty_cache returned per step.
	CostSteps       int
	MallocsPerStep  float64
	FreesPerStep    float64
	ReleasedPerStep int64
}

// Advice is one fix and what it saves.
type Advice struct {
	Fix string `json:"fix"`
	// Measured says whether Saving was measured by re-running the workload, or estimated.
	Measured bool `json:"measured"`
	// Replayed says Saving and Fits come from replaying the recorded trace through the allocator model under
	// the setting, up to the OOM: Saving is the drop in peak reserved memory, Fits whether the failing
	// request is served.
	Replayed bool `json:"replayed"`
	// Saving is the bytes the fix takes off the peak of Metric memory ("allocated", or "reserved" for
	// allocator settings): measured (negative when the fix costs memory), or an upper bound when estimated.
	Saving int64  `json:"saving"`
	Metric string `json:"metric"`
	// PeakAfter is the measured peak the run needs with the fix, and Fits whether it fits the device by the
	// headroom rule (Report.FitsRule); both null for an estimate. Verdict says it in a word: "fits",
	// "tight" (no OOM, but inside the margin), "oom"; "" for an estimate, and for a replayed setting (whose
	// Fits says it serves the failing request).
	PeakAfter *int64 `json:"peak_after"`
	Fits      *bool  `json:"fits"`
	Verdict   string `json:"verdict"`
	// Why says what the fix changes in what was alive at the peak.
	Why string `json:"why"`
}

// composition is what was alive at the peak, in the terms the fixes act on.
type composition struct {
	peak        int64
	activations int64 // activation and autograd_detail
	inputs      int64
	optimizer   int64
	attention   int64 // B*H*T*T score and probability tensors
	fp32Acts    int64 // activations labelled f32
	blocks      int   // distinct numbered blocks among the activations' scopes
	gap         int64 // reserved - allocated at the peak
	reserved    int64
}

// scoreShape matches a label of a 4-D tensor whose last two dimensions are equal: attention scores.
var scoreShape = regexp.MustCompile(`^[a-z0-9]+\[\d+,\d+,(\d+),(\d+)\]`)

// blockScope is a scope's numbered block: "transformer.h.3" of "transformer.h.3.attn.c_attn".
var blockScope = regexp.MustCompile(`^(.*?\.\d+)(\.|$)`)

// compose reads what was alive at the peak of device d, the report's.
func compose(d *onDevice, r *Report) composition {
	tl := d.tl
	s := tl.Snapshot()
	c := composition{peak: r.Peak.Allocated, gap: r.Gaps.ReservedUnallocatedAtPeak, reserved: r.Peak.Reserved}
	blocks := map[string]bool{}
	for _, b := range tl.LiveAt(d.local(r.Peak.Event), nil) {
		label := s.String(b.Label)
		switch b.Category {
		case snapshot.CategoryActivation, snapshot.CategoryAutogradDetail:
			c.activations += b.Size
			if strings.HasPrefix(label, "f32[") {
				c.fp32Acts += b.Size
			}
			if m := blockScope.FindStringSubmatch(s.String(b.Scope)); m != nil {
				blocks[m[1]] = true
			}
		case snapshot.CategoryInput:
			c.inputs += b.Size
		case snapshot.CategoryOptimizerState:
			c.optimizer += b.Size
		}
		if m := scoreShape.FindStringSubmatch(label); m != nil && m[1] == m[2] && m[1] != "1" {
			c.attention += b.Size
		}
	}
	c.blocks = len(blocks)
	return c
}

// advise returns the fixes for the peak, measured when m can re-run the workload, estimated otherwise.
func advise(ctx context.Context, s *snapshot.Snapshot, d *onDevice, r *Report, m Measurer) ([]Advice, string) {
	c := compose(d, r)
	why := reasons(c)
	var advice []Advice
	note := ""
	var ms *Measurements
	var err error
	if m != nil {
		ms, err = m.Measure(ctx, s)
	}
	switch {
	case m == nil:
		note = "estimated from what was alive at the peak; no measurement was asked for"
	case errors.Is(err, ErrNotMeasurable):
		note = "estimated from what was alive at the peak; not measured: " + err.Error()
	case err != nil:
		note = "estimated from what was alive at the peak; measuring failed: " + err.Error()
	case ms == nil || len(ms.Rows) == 0:
		note = "estimated from what was alive at the peak; the measurement returned nothing"
	default:
		note = "measured: " + ms.Note + "; saving is the drop in the peak the run needs with unlimited memory"
		base := ms.Rows[0]
		for _, row := range ms.Rows[1:] {
			v := r.judge(row.PeakReserved, row.OOM)
			after, fits := row.NeedsAllocated, v.Fits()
			a := Advice{Fix: row.Fix, Measured: true, Saving: base.NeedsAllocated - row.NeedsAllocated, Metric: "allocated",
				PeakAfter: &after, Fits: &fits, Verdict: v.Word, Why: measuredWhy(row, v, base.NeedsAllocated-row.NeedsAllocated, why)}
			advice = append(advice, a)
		}
		if r.OOM != nil {
			r.OOM.WeighNeeds(base.NeedsAllocated, r.usable())
		}
	}
	if ms == nil || err != nil || len(ms.Rows) == 0 {
		advice = append(advice, estimates(c, why)...)
	}
	if a, ok := loadAdvice(r); ok {
		advice = append(advice, a)
	}
	// Allocator settings, empty_cache and the data's shapes: measured over the run when the workload was
	// re-run, else replayed up to the OOM when there is one; both are ranked among themselves
	// (settingsAdvice, replayAdvice) and come first when the OOM was fragmentation's. Else expandable
	// segments are estimated, and ranked with the other estimates.
	var settings []Advice
	switch {
	case ms != nil && err == nil && len(ms.Settings) > 1:
		settings = settingsAdvice(ms.Settings, r.judge)
		note += "; allocator settings, empty_cache and the data's shapes: " + ms.SettingsNote +
			", saving is the drop in peak reserved memory on the configured device"
		r.FragmentationRule = CheckFragmentationRule(ms.Settings)
	case r.OOM != nil && len(r.OOM.Replays) > 1:
		settings = replayAdvice(r.OOM)
		note += "; allocator settings: replayed through the allocator model up to the OOM, those that serve the failing request, saving is the drop in peak reserved memory up to it"
	case c.gap > 0 && c.gap*100 >= c.reserved && !alreadySet(s, torchrules.Config{ExpandableSegments: true}):
		advice = append(advice, Advice{Fix: "expandable_segments:True", Saving: c.gap, Metric: "reserved",
			Why: units.FormatSize(c.gap) + " was reserved but unallocated at the peak; expandable segments grow and shrink in place instead of caching whole segments"})
	}
	slices.SortStableFunc(advice, func(a, b Advice) int { return cmp.Compare(b.Saving, a.Saving) })
	// The program's fixes replayed on a trace whose workload cannot be re-run are measured, where the
	// estimates are bounds: they come first.
	if r.OOM != nil && (ms == nil || err != nil) {
		if fixes := traceFixAdvice(r.OOM); len(fixes) > 0 {
			advice = append(fixes, advice...)
			note += "; " + r.OOM.traceFixesNote
		}
	}
	// A leak's fix comes first: it is the cause, and every other fix is measured without it.
	if r.Leaks.Verdict == string(leaks.Leak) {
		a := Advice{Fix: "fix the leak", Metric: "allocated", Why: r.leakAdvice,
			Saving: r.Leaks.LeakPerIteration * int64(max(r.Leaks.Iterations-1, 1))}
		if ms != nil && err == nil && len(ms.Rows) > 0 { // the workload was re-run without its leak
			base := ms.Rows[0]
			v := r.judge(base.PeakReserved, base.OOM)
			after, fits := base.NeedsAllocated, v.Fits()
			a.Measured, a.Saving, a.PeakAfter, a.Fits, a.Verdict = true, r.Peak.Allocated-base.NeedsAllocated, &after, &fits, v.Word
		}
		advice = append([]Advice{a}, advice...)
	}
	if r.OOM != nil && r.OOM.Kind == OOMFragmentation {
		advice = append(settings, advice...)
	} else {
		advice = append(advice, settings...)
	}
	if advice == nil {
		advice = []Advice{}
	}
	return advice, note
}

// alreadySet reports whether the snapshot was recorded with every setting of fix already made: advice to
// make it again would change nothing. Settings that do not parse are taken as not set.
func alreadySet(s *snapshot.Snapshot, fix torchrules.Config) bool {
	recorded, err := torchrules.ParseConfig(s.Meta.AllocatorSettings)
	return err == nil && recorded.Includes(fix)
}

// reasons says, per kind of fix, what it changes in what was alive at the peak.
func reasons(c composition) map[string]string {
	why := map[string]string{}
	if c.attention > 0 {
		why["flash"] = "flash attention never materialises the B*H*T*T attention scores and probabilities (" + units.FormatSize(c.attention) + " at the peak)"
	}
	if c.activations > 0 && c.blocks >= 2 {
		why["checkpoint"] = "checkpointing keeps only the inputs of the " + strconv.Itoa(c.blocks) + " blocks alive at the peak instead of the activations they saved for backward (" + units.FormatSize(c.activations) + ") and recomputes those in backward"
	}
	if c.fp32Acts > 0 {
		why["bf16"] = "autocast saves the outputs of matmuls for backward in 16 bits (of the " + units.FormatSize(c.fp32Acts) + " of fp32 activations at the peak) and keeps 16-bit copies of the weights"
		why["fp16"] = why["bf16"]
	}
	if c.activations+c.inputs > 0 {
		why["batch"] = "activations and inputs (" + units.FormatSize(c.activations+c.inputs) + " at the peak) scale with the micro-batch"
	}
	if c.optimizer > 0 {
		why["SGD"] = "Adam's two fp32 slots per parameter (" + units.FormatSize(c.optimizer) + " at the peak) go; SGD keeps no state"
	}
	return why
}

// usable is the memory the allocator can use on the report's device: its capacity less the CUDA
// context; 0 when the snapshot does not record it.
func (r *Report) usable() int64 {
	for _, d := range r.Devices {
		if d.Index == r.Peak.Device && d.Capacity > 0 {
			return d.Capacity - d.ContextReserve
		}
	}
	return 0
}

// judge judges a measured run on the report's device by the headroom rule.
func (r *Report) judge(peakReserved int64, oom bool) headroom.Verdict {
	return headroom.Judge(peakReserved, oom, r.usable(), r.Margin)
}

// measuredWhy explains a measured fix by the parts of its name that have a reason; a fix that saves
// nothing gets no reason, which would read as a saving the measurement contradicts.
func measuredWhy(row Measurement, v headroom.Verdict, saving int64, why map[string]string) string {
	var parts []string
	if saving <= 0 {
		why = nil
	}
	for _, k := range []string{"flash", "checkpoint", "bf16", "fp16", "batch", "SGD"} {
		if strings.Contains(row.Fix, k) && why[k] != "" && !slices.Contains(parts, why[k]) {
			parts = append(parts, why[k])
		}
	}
	out := "needs " + units.FormatSize(row.NeedsAllocated)
	if saving < 0 {
		out += ", " + units.FormatSize(-saving) + " more than as configured"
	}
	switch {
	case row.OOM:
		out += "; still runs out of memory"
		if row.OOMPhase != "" {
			out += " in " + row.OOMPhase
		}
	case v.Word == headroom.Unknown:
		out += "; runs, on a device of unknown capacity"
	default:
		out += "; " + v.String()
	}
	if len(parts) > 0 {
		out += "; " + strings.Join(parts, "; ")
	}
	return out
}

// estimates are the savings the composition of the peak suggests, each an upper bound: what the fix would
// remove if it removed all it can (autocast leaves the fp32 inputs of softmax and losses, checkpointing
// recomputes one block at a time, flash attention keeps a logsumexp per row).
func estimates(c composition, why map[string]string) []Advice {
	var out []Advice
	add := func(fix string, saving int64, key string) {
		if saving > 0 {
			out = append(out, Advice{Fix: fix, Saving: saving, Metric: "allocated", Why: why[key]})
		}
	}
	add("flash attention", c.attention, "flash")
	if c.blocks >= 2 && c.activations*10 >= c.peak {
		add("checkpoint every block", c.activations*int64(c.blocks-1)/int64(c.blocks), "checkpoint")
	}
	add("bf16 autocast", c.fp32Acts/2, "bf16")
	add("batch / 4, accumulate 4", (c.activations+c.inputs)*3/4, "batch")
	add("SGD instead of Adam", c.optimizer, "SGD")
	return out
}

// loadAdvice is the fix for a peak set while the model was loaded (the load phase: from_pretrained puts each
// weight on the device in the checkpoint's dtype and quantizes a 4-bit one there): a checkpoint stored
// already quantized loads as it is stored. Its saving is the peak less the highest of every other phase.
func loadAdvice(r *Report) (Advice, bool) {
	if r.Peak.Phase != snapshot.PhaseLoad.String() {
		return Advice{}, false
	}
	var rest int64
	for _, it := range r.Iterations {
		for _, p := range it.Phases {
			if p.Name != snapshot.PhaseLoad.String() {
				rest = max(rest, p.PeakAllocated)
			}
		}
	}
	if rest >= r.Peak.Allocated {
		return Advice{}, false
	}
	return Advice{Fix: "load a checkpoint already quantized", Saving: r.Peak.Allocated - rest, Metric: "allocated",
		Why: "the peak is set while the model is loaded, each weight on the device in 16 bits while it is quantized; a checkpoint stored quantized (a -bnb-4bit repository) loads as it is stored (oomdbg run --load none)"}, true
}
