// Package triage explains a snapshot's memory: the peak (exact, and what was alive at it), the out-of-memory
// error (PyTorch's message, what was alive, by category, scope and stack), every phase of every iteration,
// the largest allocations, the CUDA-context and fragmentation gaps, the leak verdict, and which fixes would
// bring the peak down and by how much. It writes the result as text for a terminal, markdown for an issue
// or a pull request, or JSON (docs/report-json.md).
//
// Savings are measured when a Measurer is given and the snapshot came from oomdbg's own workload: the
// command line re-runs the workload with each fix on the meta device. Otherwise they are estimated from
// what was alive at the peak, and the report says so.
package triage

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// Format is the value of a JSON report's "format" field.
const Format = "oomdbg-report/5"

// Options tune Analyze.
type Options struct {
	// File names the snapshot in the report (source.file).
	File string
	// Measurer re-runs the workload with each fix. Nil: savings are estimated.
	Measurer Measurer
	// Replayer replays the trace of an OOM under other allocator settings. Nil: OOM.ServedBy is null.
	Replayer Replayer
	// Leaks are the options of the leak analysis (warm-up, filters).
	Leaks []leaks.Option
	// Top is how many allocations, scopes and stacks the report lists (default 10).
	Top int
}

// Report is everything triage found about one snapshot. Its JSON form is the "oomdbg-report/5" schema.
type Report struct {
	Format  string   `json:"format"`
	Source  Source   `json:"source"`
	Devices []Device `json:"devices"`
	Peak    Peak     `json:"peak"`
	OOM     *OOM     `json:"oom"`
	Gaps    Gaps     `json:"gaps"`
	// ModelStates are the parameters, gradients and optimizer state where they sum highest between phases;
	// Host is the host memory of a rank that offloads (null without a host device).
	ModelStates ModelStates `json:"model_states"`
	Host        *Host       `json:"host"`
	Iterations  []Iteration `json:"iterations"`
	Leaks       Leaks       `json:"leaks"`
	Advice      []Advice    `json:"advice"`
	// AdviceNote says how the savings were found: measured (and how), or estimated (and why).
	AdviceNote string `json:"advice_note"`
	// FragmentationRule holds the rule "above 20% fragmentation, call empty_cache" against the measured
	// settings; null when they were not measured.
	FragmentationRule *RuleCheck `json:"fragmentation_rule"`
	// Margin is the share of the device's usable memory a run must leave unreserved to fit (the headroom
	// rule every verdict follows), and FitsRule says the rule for the device in a sentence.
	Margin   float64 `json:"margin"`
	FitsRule string  `json:"fits_rule"`

	scopes     []Share // every scope alive at the peak, for Diff
	leakAdvice string  // the code change that fixes the leak, when there is one
}

// Source describes the snapshot.
type Source struct {
	File        string `json:"file"`
	Tool        string `json:"tool"`
	ToolVersion string `json:"tool_version"`
	// Origin is where the events came from: "oomdbg" (a traced workload) or "pytorch" (an imported snapshot).
	Origin   string `json:"origin"`
	Created  string `json:"created"` // RFC 3339, "" when unknown
	Host     string `json:"host"`
	TimeUnit string `json:"time_unit"`
	// Workload is the recorded workload's configuration, null for an imported snapshot; WorkloadSummary says
	// it in a line, e.g. "mlp, batch 64, adam, bug retain-graph".
	Workload          json.RawMessage `json:"workload"`
	WorkloadSummary   string          `json:"workload_summary"`
	AllocatorSettings string          `json:"allocator_settings"`
	Events            int             `json:"events"`
	// EventsByAction counts the events the snapshot recorded, by action: for an imported trace, its own
	// entries and markers. ReconstructedByAction counts apart the events an importer added for memory
	// allocated before the trace began (snapshot.PreExistingLabel); Events counts both.
	EventsByAction        map[string]int `json:"events_by_action"`
	ReconstructedByAction map[string]int `json:"reconstructed_by_action"`
	Allocations           int            `json:"allocations"`
	// Iterations says where the iteration boundaries come from: the recording's markers, or what the
	// importer found them from ("from Optimizer.step regions"), or "none: ..." when there are none.
	Iterations string `json:"iterations_source"`
	// Complete is false for a snapshot cut short (Warning says where) or written without a footer.
	Complete bool   `json:"complete"`
	Warning  string `json:"warning"`
	// UnmatchedFrees counts frees of blocks allocated before the trace began (imported traces).
	UnmatchedFrees int `json:"unmatched_frees"`
	// Parameters is the recorded workload's parameter count and TrainableParameters how many of them its
	// optimizer trains (fewer under LoRA); null for an imported snapshot or a recording without them.
	Parameters          *int64 `json:"parameters"`
	TrainableParameters *int64 `json:"trainable_parameters"`
}

// Device is a device of the recording, and its own memory. On a snapshot of several devices the peak and
// the other sections are one device's (Peak.Device), and each device's own figures are given here.
type Device struct {
	Index          int    `json:"index"`
	Name           string `json:"name"`
	Kind           string `json:"kind"`
	Capacity       int64  `json:"capacity"`
	ContextReserve int64  `json:"context_reserve"`
	// CapacityGiven says that Capacity is the user's (--gpu-mem), not the recording's.
	CapacityGiven bool `json:"capacity_given,omitempty"`
	// PeakAllocated is the device's highest allocated memory, first reached after PeakEvent (an event of
	// the whole snapshot); PeakReserved its highest reserved memory. EndAllocated and EndReserved are the
	// device's memory after the last event.
	PeakAllocated int64 `json:"peak_allocated"`
	PeakEvent     int   `json:"peak_event"`
	PeakReserved  int64 `json:"peak_reserved"`
	EndAllocated  int64 `json:"end_allocated"`
	EndReserved   int64 `json:"end_reserved"`
	// ReservedUnallocatedAtPeak is the device's reserved less allocated memory at its own peak.
	ReservedUnallocatedAtPeak int64 `json:"reserved_unallocated_at_peak"`
}

// Peak is the highest allocated memory of one device and what was alive then.
type Peak struct {
	// Device is the device it is of: the only one, or, of several, the one that ran out of memory, else
	// the one whose allocated memory peaks highest. Devices says how many hold memory.
	Device    int   `json:"device"`
	Devices   int   `json:"devices"`
	Allocated int64 `json:"allocated"`
	// Event is the first event after which allocated memory was at its peak.
	Event     int    `json:"event"`
	Time      int64  `json:"time"`
	Phase     string `json:"phase"`
	Iteration int32  `json:"iteration"`
	// Reserved is the peak of reserved memory, reached first after ReservedEvent.
	Reserved      int64 `json:"reserved"`
	ReservedEvent int   `json:"reserved_event"`
	Alive
}

// Alive is what was alive at an event: bytes by category (every category, zeros included), the largest
// scopes and stacks, and the largest allocations.
type Alive struct {
	ByCategory map[string]int64 `json:"by_category"`
	ByScope    []Share          `json:"by_scope"`
	ByStack    []StackShare     `json:"by_stack"`
	Top        []Allocation     `json:"top_allocations"`
}

// Share is the bytes and blocks of one scope (or other name).
type Share struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
	Count int    `json:"count"`
}

// StackShare is the bytes and blocks allocated from one stack.
type StackShare struct {
	Frames []string `json:"frames"`
	Bytes  int64    `json:"bytes"`
	Count  int      `json:"count"`
}

// Allocation is one live block.
type Allocation struct {
	Event     int      `json:"event"` // its alloc event
	Bytes     int64    `json:"bytes"`
	Requested int64    `json:"requested"`
	Category  string   `json:"category"`
	Scope     string   `json:"scope"`
	Label     string   `json:"label"`
	Phase     string   `json:"phase"`
	Iteration int32    `json:"iteration"`
	Stack     []string `json:"stack"`
}

// OOM is the first out-of-memory error of the snapshot, with the memory of the device it happened on.
type OOM struct {
	// Device is the device that ran out of memory: every figure below is its own.
	Device int `json:"device"`
	// Message is PyTorch's message for it; Exact says whether the snapshot held everything the message
	// needs (an imported trace does not record the device's capacity).
	Message   string `json:"message"`
	Exact     bool   `json:"exact"`
	Event     int    `json:"event"`
	Phase     string `json:"phase"`
	Iteration int32  `json:"iteration"`
	// Requested is the rounded request, AllocSize what the allocator tried to get from the device (what the
	// message says it tried to allocate), Free what the device had free.
	Requested int64    `json:"requested"`
	AllocSize int64    `json:"alloc_size"`
	Free      int64    `json:"free"`
	Label     string   `json:"label"`
	Scope     string   `json:"scope"`
	Stack     []string `json:"stack"`
	Allocated int64    `json:"allocated"`
	Reserved  int64    `json:"reserved"`
	// Kind is OOMCapacity or OOMFragmentation: whether allocated memory plus Request exceed what the allocator
	// could have (Reserved plus Free), or the memory was there in pieces none of which held the request.
	Kind string `json:"kind"`
	// Request is what a free block needed to hold: the rounded request (Requested). FreeInReserved is the
	// bytes of the free blocks inside the device's reserved segments at the OOM, FreeBlocks how many blocks
	// they are, LargestFreeBlock the largest.
	Request          int64 `json:"request"`
	FreeInReserved   int64 `json:"free_in_reserved"`
	LargestFreeBlock int64 `json:"largest_free_block"`
	FreeBlocks       int   `json:"free_blocks"`
	// Diagnosis says it in a sentence: "the 1.20 GiB request fits in none of 37 free blocks totalling ...".
	Diagnosis string `json:"diagnosis"`
	// RunNeeds is the peak the run needs with unlimited memory, measured by re-running its workload; null
	// when not measured. Above the usable memory it makes the OOM a capacity one whatever the request met.
	RunNeeds *int64 `json:"run_needs"`
	// Replays are the trace replayed through the allocator model up to the OOM, first under the recorded
	// settings (which must fail as the recording did), then under each setting tried; ServedBy are those that
	// serve the request. Both are null when not replayed, and ReplayNote says why; else how they ran.
	Replays    []Replayed `json:"replays"`
	ServedBy   []Replayed `json:"served_by"`
	ReplayNote string     `json:"replay_note"`
	Alive

	// The fixes of the program replayed on the trace, for the advice (Replays.Fixes).
	traceFixes     []TraceFix
	traceBefore    TraceFix
	traceFixesNote string
}

// Gaps is the memory of the device that allocated tensors do not use.
type Gaps struct {
	// Device is the device they are of, Peak's.
	Device int `json:"device"`
	// ContextReserve is what the CUDA context takes before the allocator gets any memory.
	ContextReserve int64 `json:"context_reserve"`
	// ReservedUnallocatedAtPeak is reserved minus allocated memory at the peak of allocated memory: cached
	// blocks the allocator holds but no tensor uses (fragmentation) when memory is tightest. AtEnd is the
	// same after the last event, AtOOM at the OOM (null without one).
	ReservedUnallocatedAtPeak int64  `json:"reserved_unallocated_at_peak"`
	ReservedUnallocatedAtEnd  int64  `json:"reserved_unallocated_at_end"`
	ReservedUnallocatedAtOOM  *int64 `json:"reserved_unallocated_at_oom"`
}

// Iteration is one training iteration (-1 is setup) and its phases.
type Iteration struct {
	Iteration     int32   `json:"iteration"`
	StartEvent    int     `json:"start_event"`
	EndEvent      int     `json:"end_event"` // one past the last
	PeakAllocated int64   `json:"peak_allocated"`
	EndAllocated  int64   `json:"end_allocated"`
	Phases        []Phase `json:"phases"`
}

// Phase is one phase of one iteration. Under activation checkpointing the backward phase spans the
// recomputations inside it, and a "recompute" phase after it sums them up: its peak is the highest inside a
// recomputation, its delta the sum of theirs, its end that of the last one.
type Phase struct {
	Name          string `json:"name"`
	StartEvent    int    `json:"start_event"`
	EndEvent      int    `json:"end_event"` // one past the last
	PeakAllocated int64  `json:"peak_allocated"`
	PeakEvent     int    `json:"peak_event"`
	EndAllocated  int64  `json:"end_allocated"`
	// EndByCategory is allocated memory by category after the phase; DeltaByCategory its change over the
	// phase.
	EndByCategory   map[string]int64 `json:"end_by_category"`
	DeltaByCategory map[string]int64 `json:"delta_by_category"`
}

// Leaks is the leak analysis (package leaks).
type Leaks struct {
	Verdict                    string      `json:"verdict"`
	Kind                       string      `json:"kind"`
	Reason                     string      `json:"reason"`
	Warmup                     int         `json:"warmup"`
	Iterations                 int         `json:"iterations"`
	GrowthPerIteration         int64       `json:"growth_per_iteration"`
	ReservedGrowthPerIteration int64       `json:"reserved_growth_per_iteration"`
	LeakPerIteration           int64       `json:"leak_per_iteration"`
	Points                     []LeakPoint `json:"points"`
	Suspects                   []Suspect   `json:"suspects"`
	// HeldBytes is what Held adds up to: memory training allocated that outlives its iteration without
	// growing.
	HeldBytes int64  `json:"held_bytes"`
	Held      []Held `json:"held"`
	// GradientsNeverCleared is the finding that no zero_grad clears the gradients between optimizer steps;
	// null when none.
	GradientsNeverCleared *GradientsNeverCleared `json:"gradients_never_cleared"`
}

// Held is a group of blocks held across iterations: one stack, scope and category.
type Held struct {
	Scope      string        `json:"scope"`
	Category   string        `json:"category"`
	Stack      []string      `json:"stack"`
	Bytes      int64         `json:"bytes"`
	Count      int           `json:"count"`
	Iterations []int32       `json:"iterations"`
	Label      string        `json:"label"`
	RetainedBy *RetainerPath `json:"retainer"`
}

// GradientsNeverCleared is the finding that gradients are never cleared between optimizer steps.
type GradientsNeverCleared struct {
	Reason         string `json:"reason"`
	Steps          int    `json:"steps"`
	Of             int    `json:"of"`
	FirstIteration int32  `json:"first_iteration"`
	Bytes          int64  `json:"bytes"`
	Blocks         int    `json:"blocks"`
	Certain        bool   `json:"certain"`
}

// LeakPoint is memory at the end of one iteration.
type LeakPoint struct {
	Iteration int32 `json:"iteration"`
	Event     int   `json:"event"`
	Allocated int64 `json:"allocated"`
	Reserved  int64 `json:"reserved"`
}

// Suspect is a group of blocks that keeps growing.
type Suspect struct {
	Scope             string        `json:"scope"`
	Category          string        `json:"category"`
	Stack             []string      `json:"stack"`
	Kind              string        `json:"kind"`
	BytesPerIteration int64         `json:"bytes_per_iteration"`
	CountPerIteration float64       `json:"count_per_iteration"`
	Survivors         []int32       `json:"survivors"`
	Label             string        `json:"label"`
	RetainedBy        *RetainerPath `json:"retainer"`
}

// RetainerPath is the chain of holders that kept a suspect's example block alive at a heap dump.
type RetainerPath struct {
	Root string `json:"root"`
	// Path lists the holders from the one holding the block to the root.
	Path          []string `json:"path"`
	HeapDumpEvent int      `json:"heap_dump_event"`
	Reason        string   `json:"reason"`
}

// Analyze builds the report of the snapshot tl indexes.
func Analyze(ctx context.Context, tl *timeline.Timeline, opts Options) *Report {
	if opts.Top <= 0 {
		opts.Top = 10
	}
	s := tl.Snapshot()
	devs, views := devices(tl)
	r := &Report{Format: Format, Source: source(s, tl, opts.File), Devices: devs, Margin: headroom.DefaultMargin}
	// The peak, the OOM, the gaps and the phases are one device's: memory on two cards is no one pool.
	f := focusDevice(tl, views)
	r.Peak = peak(s, f, opts.Top)
	r.scopes = allScopes(f.tl.Snapshot(), f.tl.LiveAt(f.local(r.Peak.Event), nil))
	r.OOM = oomOn(tl, f, opts.Top)
	if r.OOM != nil {
		replayOOM(ctx, s, r.OOM, opts.Replayer)
	}
	r.Gaps = gaps(f, r)
	r.ModelStates = modelStates(tl)
	r.Host = host(s)
	r.Iterations = iterations(f)
	lr := leaks.Analyze(tl, opts.Leaks...)
	r.Leaks = LeakReport(lr)
	r.leakAdvice = lr.Advice()
	r.FitsRule = headroom.Rule(r.usable(), r.Margin)
	r.Advice, r.AdviceNote = advise(ctx, s, f, r, opts.Measurer)
	return r
}

func source(s *snapshot.Snapshot, tl *timeline.Timeline, file string) Source {
	st := tl.Stats()
	src := Source{
		File: file, Tool: s.Meta.Tool, ToolVersion: s.Meta.ToolVersion, Origin: s.Meta.Source, Host: s.Meta.Host,
		TimeUnit: s.Meta.TimeUnit, AllocatorSettings: s.Meta.AllocatorSettings,
		Events: st.Events, Allocations: st.Blocks, EventsByAction: map[string]int{}, ReconstructedByAction: map[string]int{},
		Complete: s.Footer != nil && s.Warning == nil, UnmatchedFrees: st.UnmatchedFrees,
	}
	if !s.Meta.Created.IsZero() {
		src.Created = s.Meta.Created.UTC().Format(time.RFC3339)
	}
	if s.Meta.Parameters > 0 {
		p, t := s.Meta.Parameters, s.Meta.TrainableParameters
		src.Parameters, src.TrainableParameters = &p, &t
	}
	if len(s.Meta.Workload) > 0 && json.Valid(s.Meta.Workload) {
		src.Workload = s.Meta.Workload
		src.WorkloadSummary = workloadSummary(s.Meta.Workload)
	}
	if s.Warning != nil {
		src.Warning = s.Warning.Error()
	}
	src.Iterations = s.Meta.Iterations
	if src.Iterations == "" {
		src.Iterations = "none: the recording marks no iteration"
		if slices.ContainsFunc(tl.Iterations(), func(it timeline.IterationSpan) bool { return it.Iteration >= 0 }) {
			src.Iterations = "from the recording's iteration markers"
		}
	}
	var rebuilt [snapshot.NumActions]int
	if s.Meta.Source != "oomdbg" { // only importers rebuild state
		for _, ep := range s.Events.All() {
			if e := &ep; e.Action.Valid() && s.Reconstructed(e) {
				rebuilt[e.Action]++
			}
		}
	}
	for a, n := range st.ByAction {
		if n > 0 && snapshot.Action(a).Valid() {
			if own := n - rebuilt[a]; own > 0 {
				src.EventsByAction[snapshot.Action(a).String()] = own
			}
			if rebuilt[a] > 0 {
				src.ReconstructedByAction[snapshot.Action(a).String()] = rebuilt[a]
			}
		}
	}
	return src
}

// workloadSummary says in a line what a recorded workload was, from the fields every oomdbg workload
// configuration has.
func workloadSummary(raw json.RawMessage) string {
	var w struct {
		Model, Preset, Device, Optimizer, AMP, Checkpoint, Attention, Bug string
		Batch, Steps, Accum                                               int
		Architecture, Weights                                             string
		LoRA                                                              int `json:"lora"`
		QLoRA                                                             bool
	}
	if json.Unmarshal(raw, &w) != nil || w.Model == "" {
		return ""
	}
	parts := []string{w.Model}
	switch {
	case w.Preset != "" && w.Preset != w.Model:
		parts[0] = w.Preset
	case w.Architecture != "":
		parts[0] = w.Architecture
	}
	switch {
	case w.QLoRA:
		parts = append(parts, "QLoRA r="+itoa(int64(w.LoRA)))
	case w.LoRA > 0:
		parts = append(parts, "LoRA r="+itoa(int64(w.LoRA)))
	}
	if w.Weights != "" && w.Weights != "f32" {
		parts = append(parts, w.Weights+" weights")
	}
	parts = append(parts, "batch "+itoa(int64(w.Batch)))
	if w.Accum > 1 {
		parts[len(parts)-1] += " x " + itoa(int64(w.Accum)) + " accumulated"
	}
	parts = append(parts, itoa(int64(w.Steps))+" steps", w.Optimizer)
	for _, fix := range []struct{ name, val, off string }{{"amp", w.AMP, "off"}, {"checkpoint", w.Checkpoint, "off"}, {"attention", w.Attention, "naive"}} {
		if fix.val != "" && fix.val != fix.off {
			parts = append(parts, fix.name+" "+fix.val)
		}
	}
	if w.Device != "" {
		parts = append(parts, w.Device+" device")
	}
	if w.Bug != "" {
		parts = append(parts, "bug "+w.Bug)
	}
	return joinComma(parts)
}

// devices describes each device of the recording with its own memory, and returns each device's own
// timeline (snapshot.DeviceView) by index, for those that hold events: the whole snapshot's where it holds
// one device.
func devices(tl *timeline.Timeline) ([]Device, map[int]*onDevice) {
	s := tl.Snapshot()
	out := make([]Device, 0, len(s.Meta.Devices))
	views := map[int]*onDevice{}
	for _, d := range s.Meta.Devices {
		dev := Device{Index: d.Index, Name: d.Name, Kind: d.Kind, Capacity: d.Capacity, ContextReserve: d.ContextReserve,
			CapacityGiven: d.CapacityGiven}
		od, err := deviceOf(tl, d.Index)
		if err != nil { // the device holds no events: nothing allocated
			out = append(out, dev)
			continue
		}
		views[d.Index] = od
		if n := od.tl.Len(); n > 0 {
			pk := od.tl.Peak(timeline.Allocated)
			dev.PeakAllocated, dev.PeakEvent = pk.Bytes, od.whole(pk.Seq)
			dev.PeakReserved = od.tl.Peak(timeline.Reserved).Bytes
			dev.EndAllocated, dev.EndReserved = od.tl.Allocated(n-1), od.tl.Reserved(n-1)
			if pk.Seq >= 0 {
				dev.ReservedUnallocatedAtPeak = max(0, od.tl.Reserved(pk.Seq)-pk.Bytes)
			}
		}
		out = append(out, dev)
	}
	return out, views
}

// device returns the recording's device with the given index, if the metadata describes it.
func device(m snapshot.Meta, index int) (snapshot.DeviceInfo, bool) {
	i := slices.IndexFunc(m.Devices, func(d snapshot.DeviceInfo) bool { return d.Index == index })
	if i < 0 {
		return snapshot.DeviceInfo{}, false
	}
	return m.Devices[i], true
}

// LeakReport returns a leak analysis in the report's form (the "leaks" object of the JSON report).
func LeakReport(lr *leaks.Result) Leaks {
	l := Leaks{
		Verdict: string(lr.Verdict), Kind: string(lr.Kind), Reason: lr.Reason, Warmup: lr.Warmup, Iterations: lr.Iterations,
		GrowthPerIteration: lr.GrowthPerIteration, ReservedGrowthPerIteration: lr.ReservedGrowthPerIteration,
		LeakPerIteration: lr.LeakPerIteration, Points: []LeakPoint{}, Suspects: []Suspect{},
		HeldBytes: lr.HeldBytes, Held: []Held{},
	}
	if g := lr.Gradients; g != nil {
		l.GradientsNeverCleared = &GradientsNeverCleared{Reason: g.Reason, Steps: g.Steps, Of: g.Of, FirstIteration: g.FirstIteration,
			Bytes: g.Bytes, Blocks: g.Blocks, Certain: g.Certain}
	}
	for _, h := range lr.Held {
		l.Held = append(l.Held, Held{Scope: h.Scope, Category: h.Category.String(), Stack: nonNil(h.Stack), Bytes: h.Bytes,
			Count: h.Count, Iterations: h.Iterations, Label: h.Label, RetainedBy: retainerReport(h.RetainedBy)})
	}
	for _, p := range lr.Points {
		l.Points = append(l.Points, LeakPoint{Iteration: p.Iteration, Event: p.Seq, Allocated: p.Allocated, Reserved: p.Reserved})
	}
	for _, sp := range lr.Suspects {
		out := Suspect{
			Scope: sp.Scope, Category: sp.Category.String(), Stack: nonNil(sp.Stack), Kind: string(sp.Kind),
			BytesPerIteration: sp.BytesPerIteration, CountPerIteration: sp.CountPerIteration,
			Survivors: sp.Survivors, Label: sp.Label,
		}
		if out.Survivors == nil {
			out.Survivors = []int32{}
		}
		out.RetainedBy = retainerReport(sp.RetainedBy)
		l.Suspects = append(l.Suspects, out)
	}
	return l
}

func retainerReport(rt *leaks.RetainerPath) *RetainerPath {
	if rt == nil {
		return nil
	}
	return &RetainerPath{Root: rt.Root, Path: nonNil(rt.Path), HeapDumpEvent: rt.Dump, Reason: rt.Reason}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
