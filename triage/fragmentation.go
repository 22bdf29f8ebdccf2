package triage

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// An out-of-memory error is about capacity or about fragmentation. PyTorch's message says "If reserved but
// unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid
// fragmentation"; the report says which it was, at the failing request: the free memory inside the reserved
// segments, how many blocks it is split into and the largest of them, and which settings, replayed through
// the allocator model, would have served the request.

// The kinds of OOM.
const (
	// OOMCapacity: allocated memory plus the request exceed what the allocator could have (its segments and
	// what the device had free): no layout of the memory serves it.
	OOMCapacity = "capacity"
	// OOMFragmentation: the memory was there, but split among cached blocks none of which holds the request,
	// and what the device had free was not enough for a new segment.
	OOMFragmentation = "fragmentation"
)

// OOMKind tells the kinds apart: a request of request bytes (rounded) that failed with free bytes in free
// blocks inside the reserved segments and deviceFree bytes free on the device is a fragmentation OOM when it
// is no more than the two together, a capacity OOM otherwise.
func OOMKind(request, free, deviceFree int64) string {
	if request <= free+deviceFree {
		return OOMFragmentation
	}
	return OOMCapacity
}

// Replayer replays a snapshot's allocator trace through the caching allocator model. The command line
// implements it with allocator/replay; triage does not run the model itself.
type Replayer interface {
	// ServeOOM replays the trace up to its first out-of-memory error under the recorded settings and under
	// each setting it tries, and says whether each serves that error's request.
	ServeOOM(ctx context.Context, s *snapshot.Snapshot) (*Replays, error)
}

// Replays is what replaying a trace under other allocator settings found at its first OOM.
type Replays struct {
	// Note says how the replays ran, e.g. on what capacity.
	Note string
	// Recorded is the replay under the settings of the recording: it must fail as the recording did for the
	// others to mean anything.
	Recorded Replayed
	Tried    []Replayed
	// Fixes are fixes of the program (a smaller batch, accumulation, another optimizer, ...) applied to the
	// trace and replayed on the OOM's device (the what-if), and Before that device's replay as recorded,
	// which they are compared with; FixesNote says how they ran. Empty when none could be replayed.
	Fixes     []TraceFix
	Before    TraceFix
	FixesNote string
}

// TraceFix is one fix of the program replayed on a trace: the peaks of its replay, up to where the
// recording ends, and its verdict by the headroom rule ("fits", "tight", "oom", "edge" or "unknown").
type TraceFix struct {
	Fix                         string
	PeakAllocated, PeakReserved int64
	Verdict                     string
	// Assumption says what the change of the trace assumed, with its figures.
	Assumption string
}

// Replayed is one replay of the trace up to the OOM.
type Replayed struct {
	Settings string `json:"settings"`
	// Served says whether the model served the request that failed; FailedEarlier that it failed an
	// allocation before it.
	Served        bool `json:"served"`
	FailedEarlier bool `json:"failed_earlier"`
	// PeakReserved is the model's peak of reserved memory up to the OOM.
	PeakReserved int64 `json:"peak_reserved"`
}

// DiagnoseOOM says what the request of the oom event at seq met, as the report does: the kind of OOM and
// the sentence that explains it ("the 1.20 GiB request fits in none of 37 free blocks totalling ...").
func DiagnoseOOM(tl *timeline.Timeline, seq int) (kind, diagnosis string) {
	s := tl.Snapshot()
	if seq < tl.Base() || seq >= tl.Len() || s.Events.Action(seq) != snapshot.ActionOOM {
		return "", ""
	}
	e := s.Events.At(seq)
	// The figures are the failing device's own (focus.go); a one-device snapshot is its own view.
	d := &onDevice{index: int(e.Device), tl: tl}
	if len(s.Meta.Devices) > 1 {
		var err error
		if d, err = deviceOf(tl, int(e.Device)); err != nil {
			return "", ""
		}
	}
	local := d.local(seq)
	o := &OOM{Device: d.index, Event: local, Requested: e.Size, AllocSize: e.BlockSize, Free: e.DeviceFree,
		Allocated: d.tl.Allocated(local), Reserved: d.tl.Reserved(local)}
	if o.AllocSize <= 0 {
		o.AllocSize = o.Requested
	}
	oomFragmentation(d.tl, o, e.Device, e.Stream)
	return o.Kind, o.Diagnosis
}

// oomFragmentation fills in what o's request, made on stream, met: the free blocks inside the device's
// segments, the kind of OOM, and its diagnosis, which names the free memory cached on other streams.
func oomFragmentation(tl *timeline.Timeline, o *OOM, device int16, stream int64) {
	f := tl.FragmentationAt(o.Event, device, "")
	o.Request = o.Requested
	o.FreeInReserved, o.LargestFreeBlock, o.FreeBlocks = f.Free, f.Largest, f.FreeBlocks
	o.Kind = OOMKind(o.Request, o.FreeInReserved, o.Free)
	o.Diagnosis = diagnosis(o) + otherStreams(tl.SegmentsAt(o.Event), device, stream, o.Request)
}

// otherStreams says how much of the free memory is cached on streams other than the request's, which the
// caching allocator never hands to it (get_free_block looks on the request's stream only): "" when none is.
func otherStreams(segs []timeline.SegmentState, device int16, stream int64, request int64) string {
	type cached struct{ free, largest int64 }
	by := map[int64]*cached{}
	var own int64
	for i := range segs {
		s := &segs[i]
		if s.Device != device {
			continue
		}
		if s.Stream == stream {
			own = max(own, s.LargestGap())
			continue
		}
		c := by[s.Stream]
		if c == nil {
			c = &cached{}
			by[s.Stream] = c
		}
		c.free += s.FreeBytes()
		c.largest = max(c.largest, s.LargestGap())
	}
	var streams []int64
	var free, largest int64
	for st, c := range by {
		if c.free > 0 {
			streams = append(streams, st)
			free += c.free
			largest = max(largest, c.largest)
		}
	}
	if len(streams) == 0 {
		return ""
	}
	slices.Sort(streams)
	var parts []string
	for _, st := range streams {
		parts = append(parts, fmt.Sprintf("stream %d %s", st, units.FormatSize(by[st].free)))
	}
	out := fmt.Sprintf(". Of the free blocks, %s %s cached on streams other than the request's (stream %d), which the allocator never hands to it (%s)",
		units.FormatSize(free), "is", stream, strings.Join(parts, ", "))
	if largest >= request && own < request {
		out += fmt.Sprintf("; one there would hold the request, the largest on its own stream is %s", units.FormatSize(own))
	}
	return out
}

// diagnosis says in a sentence what the request met.
func diagnosis(o *OOM) string {
	req := units.FormatSize(o.Request)
	var b strings.Builder
	switch {
	case o.FreeBlocks == 0:
		fmt.Fprintf(&b, "the %s request met no free block inside the %s reserved", req, units.FormatSize(o.Reserved))
	case o.LargestFreeBlock < o.Request:
		fmt.Fprintf(&b, "the %s request fits in none of %s totalling %s (the largest is %s)", req,
			fmt.Sprintf("%d %s", o.FreeBlocks, plural(o.FreeBlocks, "free block")), units.FormatSize(o.FreeInReserved), units.FormatSize(o.LargestFreeBlock))
	default:
		// A free block as large exists, in a pool or on a stream the request cannot use, or oversize under
		// max_split_size_mb.
		fmt.Fprintf(&b, "the %s request was not served from %s totalling %s, although the largest is %s (another pool or stream, or oversize)",
			req, fmt.Sprintf("%d %s", o.FreeBlocks, plural(o.FreeBlocks, "free block")), units.FormatSize(o.FreeInReserved), units.FormatSize(o.LargestFreeBlock))
	}
	fmt.Fprintf(&b, ", and the device had %s free for a new segment of %s", units.FormatSize(o.Free), units.FormatSize(o.AllocSize))
	if o.Kind == OOMFragmentation {
		fmt.Fprintf(&b, ": a fragmentation OOM. %s allocated plus the request is %s, within the %s the allocator could have",
			units.FormatSize(o.Allocated), units.FormatSize(o.Allocated+o.Request), units.FormatSize(o.Reserved+o.Free))
	} else {
		fmt.Fprintf(&b, ": a capacity OOM. %s allocated plus the request is %s, more than the %s the allocator could have",
			units.FormatSize(o.Allocated), units.FormatSize(o.Allocated+o.Request), units.FormatSize(o.Reserved+o.Free))
	}
	return b.String()
}

// WeighNeeds holds the kind of OOM against runNeeds, the peak the run needs with unlimited memory
// (measured), on usable bytes for the allocator: see weighNeeds. The TUI calls it once its measurement is in.
func (o *OOM) WeighNeeds(runNeeds, usable int64) {
	o.RunNeeds = &runNeeds
	o.weighNeeds(usable)
}

// weighNeeds holds the kind of OOM against what the run needs with unlimited memory (RunNeeds, measured):
// a request that the memory at the OOM could have served, in one piece, is fragmentation at that moment, but
// when the run needs more than the usable bytes the allocator has, serving it only moves the OOM on. Then
// the OOM is about capacity, and the diagnosis says why.
func (o *OOM) weighNeeds(usable int64) {
	if o.RunNeeds == nil || usable <= 0 || *o.RunNeeds <= usable || o.Kind != OOMFragmentation {
		return
	}
	o.Kind = OOMCapacity
	i := strings.Index(o.Diagnosis, ": a fragmentation OOM.")
	if i < 0 {
		return
	}
	o.Diagnosis = o.Diagnosis[:i] + fmt.Sprintf(": the memory for this request was there, in pieces, but the run needs %s "+
		"with unlimited memory (measured), more than the %s the allocator can use: a capacity OOM, which no allocator "+
		"setting makes fit. %s allocated plus the request is %s, within the %s the allocator could have at this request",
		units.FormatSize(*o.RunNeeds), units.FormatSize(usable), units.FormatSize(o.Allocated), units.FormatSize(o.Allocated+o.Request),
		units.FormatSize(o.Reserved+o.Free))
}

// replayOOM replays the trace under other settings and records which serve o's request.
func replayOOM(ctx context.Context, s *snapshot.Snapshot, o *OOM, rp Replayer) {
	if rp == nil {
		o.ReplayNote = "not replayed through the allocator model"
		return
	}
	rs, err := rp.ServeOOM(ctx, s)
	switch {
	case err != nil:
		o.ReplayNote = "replaying the trace through the allocator model failed: " + err.Error()
		return
	case rs == nil:
		o.ReplayNote = "not replayed: the trace holds no OOM to replay"
		return
	case rs.Recorded.Served || rs.Recorded.FailedEarlier:
		// The model does not fail where the recording did: its word on other settings is worth nothing here.
		o.ReplayNote = "not known: replayed under the recorded settings (" + orDefault(rs.Recorded.Settings) +
			"), the allocator model does not fail where the recording did (" + rs.Note + ")"
		return
	}
	o.ReplayNote = rs.Note
	o.traceFixes, o.traceBefore, o.traceFixesNote = rs.Fixes, rs.Before, rs.FixesNote
	o.ServedBy = []Replayed{}
	o.Replays = []Replayed{rs.Recorded}
	for _, r := range rs.Tried {
		o.Replays = append(o.Replays, r)
		if r.Served {
			o.ServedBy = append(o.ServedBy, r)
		}
	}
}

func orDefault(settings string) string {
	if settings == "" {
		return "PyTorch's defaults"
	}
	return settings
}

// servedText says in a sentence which replayed settings serve the request.
func servedText(o *OOM) string {
	if o.Replays == nil {
		return "Which setting would serve it: " + o.ReplayNote + "."
	}
	var yes, no []string
	for _, r := range o.Replays[1:] {
		if r.Served {
			yes = append(yes, r.Settings)
		} else if r.FailedEarlier {
			no = append(no, r.Settings+" (fails earlier)")
		} else {
			no = append(no, r.Settings)
		}
	}
	out := "Replayed through the allocator model (" + o.ReplayNote + "): "
	switch {
	case len(yes) == 0:
		out += "no setting tried serves it"
	default:
		out += strings.Join(yes, ", ") + " would have served it"
	}
	if len(no) > 0 {
		out += "; " + strings.Join(no, ", ") + " would not"
	}
	return out + "."
}

// FragmentationRule is the rule of thumb users are taught: when (reserved - allocated) / reserved is above
// 20%, call torch.cuda.empty_cache().
const FragmentationRule = 0.20

// RuleCheck is FragmentationRule held against a measurement: the workload as configured and with empty_cache
// at every step.
type RuleCheck struct {
	// Fragmentation is (reserved - allocated) / reserved when reserved memory peaked, as configured; Applies
	// whether it is above the rule's threshold.
	Fragmentation float64 `json:"fragmentation"`
	Threshold     float64 `json:"threshold"`
	Applies       bool    `json:"applies"`
	// Before is the run as configured, After with empty_cache every step.
	Before RuleOutcome `json:"before"`
	After  RuleOutcome `json:"after"`
	// Verdict says what empty_cache changed and cost, as measured.
	Verdict string `json:"verdict"`
}

// RuleOutcome is one side of a RuleCheck.
type RuleOutcome struct {
	PeakReserved int64 `json:"peak_reserved"`
	OOM          bool  `json:"oom"`
	// MallocsPerStep, FreesPerStep and ReleasedPerStep are the mean cudaMalloc calls, cudaFree calls and
	// bytes empty_cache returned per step after the first; null when no step after the first completed.
	MallocsPerStep  *float64 `json:"mallocs_per_step"`
	FreesPerStep    *float64 `json:"frees_per_step"`
	ReleasedPerStep *int64   `json:"released_per_step"`
}

// EmptyCacheFix is the name of the measurement with empty_cache at every step.
const EmptyCacheFix = "empty_cache every step"

// CheckFragmentationRule holds FragmentationRule against a settings measurement whose first row is the
// workload as configured; nil when it has no empty_cache row.
func CheckFragmentationRule(rows []Measurement) *RuleCheck {
	if len(rows) == 0 {
		return nil
	}
	base := rows[0]
	var ec *Measurement
	for i := range rows {
		if rows[i].Fix == EmptyCacheFix {
			ec = &rows[i]
		}
	}
	if ec == nil {
		return nil
	}
	rc := &RuleCheck{Fragmentation: base.Fragmentation, Threshold: FragmentationRule, Applies: base.Fragmentation > FragmentationRule,
		Before: outcome(base), After: outcome(*ec)}
	var b strings.Builder
	fmt.Fprintf(&b, "%.1f%% of reserved memory was unallocated at its peak", 100*base.Fragmentation)
	if rc.Applies {
		fmt.Fprintf(&b, " (above %.0f%%: the rule says empty_cache)", 100*FragmentationRule)
	} else {
		fmt.Fprintf(&b, " (not above %.0f%%: the rule says nothing)", 100*FragmentationRule)
	}
	fmt.Fprintf(&b, "; measured, empty_cache every step takes peak reserved from %s to %s", units.FormatSize(base.PeakReserved), units.FormatSize(ec.PeakReserved))
	switch {
	case base.OOM && !ec.OOM:
		b.WriteString(" and the run from out of memory to fitting")
	case base.OOM && ec.OOM:
		b.WriteString(" and the run still runs out of memory")
	case !base.OOM && ec.OOM:
		b.WriteString(" and the run from fitting to out of memory")
	default:
		b.WriteString(" and the run fits either way")
	}
	if ec.CostSteps > 0 {
		fmt.Fprintf(&b, "; it costs %s cudaMalloc and %s cudaFree calls per step", PerStep(ec.MallocsPerStep), PerStep(ec.FreesPerStep))
		if base.CostSteps > 0 {
			fmt.Fprintf(&b, " (%s and %s without)", PerStep(base.MallocsPerStep), PerStep(base.FreesPerStep))
		}
		fmt.Fprintf(&b, ", returning %s per step", units.FormatSize(ec.ReleasedPerStep))
	} else {
		b.WriteString("; no step after the first completed to count its cost")
	}
	rc.Verdict = b.String()
	return rc
}

func outcome(m Measurement) RuleOutcome {
	o := RuleOutcome{PeakReserved: m.PeakReserved, OOM: m.OOM}
	if m.CostSteps > 0 {
		mallocs, frees, released := m.MallocsPerStep, m.FreesPerStep, m.ReleasedPerStep
		o.MallocsPerStep, o.FreesPerStep, o.ReleasedPerStep = &mallocs, &frees, &released
	}
	return o
}

// PerStep prints a mean count per step: whole when it is, else to one decimal.
func PerStep(x float64) string {
	if x == math.Trunc(x) {
		return fmt.Sprintf("%.0f", x)
	}
	return fmt.Sprintf("%.1f", x)
}

// settingsAdvice turns a settings measurement into advice, ranked by measured effect: those that make the
// run fit first, then the lowest peak of reserved memory on the configured device, then the fewest cudaMalloc
// calls per step. Saving is the drop in that peak; judge says whether a run fits. (With unlimited memory a
// run never meets the release paths max_split_size_mb and garbage_collection_threshold act through, so the
// configured device is where they are measured.)
func settingsAdvice(rows []Measurement, judge func(peakReserved int64, oom bool) headroom.Verdict) []Advice {
	if len(rows) < 2 {
		return nil
	}
	base := rows[0]
	ranked := slices.Clone(rows[1:])
	slices.SortStableFunc(ranked, func(a, b Measurement) int {
		if fa, fb := judge(a.PeakReserved, a.OOM).Fits(), judge(b.PeakReserved, b.OOM).Fits(); fa != fb {
			if fa {
				return -1
			}
			return 1
		}
		if a.OOM != b.OOM {
			if !a.OOM {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(a.PeakReserved, b.PeakReserved); c != 0 && !a.OOM {
			return c
		}
		return cmp.Compare(a.MallocsPerStep, b.MallocsPerStep)
	})
	var out []Advice
	for _, row := range ranked {
		v := judge(row.PeakReserved, row.OOM)
		after, fits := row.PeakReserved, v.Fits()
		why := fmt.Sprintf("peak reserved %s (as configured %s)", units.FormatSize(row.PeakReserved), units.FormatSize(base.PeakReserved))
		why += fmt.Sprintf(", %.1f%% of it unallocated (as configured %.1f%%)", 100*row.Fragmentation, 100*base.Fragmentation)
		switch {
		case row.OOM:
			why += "; still runs out of memory"
			if row.OOMPhase != "" {
				why += " in " + row.OOMPhase
			}
		case v.Word == headroom.Unknown:
			why += "; runs, on a device of unknown capacity"
		default:
			why += "; " + v.Short()
		}
		if row.CostSteps > 0 {
			why += fmt.Sprintf("; %s cudaMalloc and %s cudaFree calls per step", PerStep(row.MallocsPerStep), PerStep(row.FreesPerStep))
			if base.CostSteps > 0 {
				why += fmt.Sprintf(" (as configured %s and %s)", PerStep(base.MallocsPerStep), PerStep(base.FreesPerStep))
			}
			if row.ReleasedPerStep > 0 {
				why += ", returning " + units.FormatSize(row.ReleasedPerStep) + " per step"
			}
		}
		out = append(out, Advice{Fix: row.Fix, Measured: true, Saving: base.PeakReserved - row.PeakReserved, Metric: "reserved",
			PeakAfter: &after, Fits: &fits, Verdict: v.Word, Why: why})
	}
	return out
}

// traceFixAdvice turns the fixes of the program replayed on the trace into advice, for a trace whose
// workload cannot be re-run: those whose replay runs to where the recording ends, those that fit by the
// headroom rule first, then by what they save of the peak allocated. A fix that still runs out of memory, or
// saves nothing, is no advice.
func traceFixAdvice(o *OOM) []Advice {
	var out []Advice
	for _, f := range o.traceFixes {
		saving := o.traceBefore.PeakAllocated - f.PeakAllocated
		if saving <= 0 || f.Verdict != headroom.Fits && f.Verdict != headroom.Tight && f.Verdict != headroom.Unknown {
			continue
		}
		after, fits := f.PeakAllocated, f.Verdict == headroom.Fits
		why := fmt.Sprintf("the trace changed as the fix changes the program's requests and replayed through the allocator model "+
			"(the what-if, oomdbg whatif) up to where the recording ends: peak %s allocated, %s reserved (as recorded %s and %s)",
			units.FormatSize(f.PeakAllocated), units.FormatSize(f.PeakReserved), units.FormatSize(o.traceBefore.PeakAllocated),
			units.FormatSize(o.traceBefore.PeakReserved))
		switch f.Verdict {
		case headroom.Fits:
			why += "; fits so far"
		case headroom.Tight:
			why += "; runs so far, but inside the margin (tight)"
		}
		if f.Assumption != "" {
			why += "; assumes " + strings.TrimPrefix(f.Assumption, f.Fix+": ")
		}
		out = append(out, Advice{Fix: f.Fix, Replayed: true, Saving: saving, Metric: "allocated", PeakAfter: &after, Fits: &fits,
			Verdict: f.Verdict, Why: why})
	}
	slices.SortStableFunc(out, func(a, b Advice) int {
		if *a.Fits != *b.Fits {
			if *a.Fits {
				return -1
			}
			return 1
		}
		return cmp.Compare(b.Saving, a.Saving)
	})
	return out
}

// replayAdvice turns the replays of an OOM into advice, for a trace whose workload cannot be re-run: each
// setting that serves the failing request, with its peak reserved up to the OOM against the recorded
// settings'. A setting the replay showed would not serve it is no advice: the OOM's text says so instead.
func replayAdvice(o *OOM) []Advice {
	var out []Advice
	recordedPeak := o.Replays[0].PeakReserved
	ranked := slices.DeleteFunc(slices.Clone(o.Replays[1:]), func(r Replayed) bool { return !r.Served })
	slices.SortStableFunc(ranked, func(a, b Replayed) int {
		if a.Served != b.Served {
			if a.Served {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.PeakReserved, b.PeakReserved)
	})
	for _, r := range ranked {
		served := r.Served
		why := "replayed through the allocator model up to the OOM: "
		switch {
		case r.Served:
			why += "serves the failing request"
		case r.FailedEarlier:
			why += "fails an earlier allocation"
		default:
			why += "fails the request too"
		}
		out = append(out, Advice{Fix: r.Settings, Replayed: true, Saving: recordedPeak - r.PeakReserved, Metric: "reserved",
			Fits: &served, Why: why})
	}
	return out
}
