package export

import (
	"fmt"
	"io"

	"github.com/google/pprof/profile"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// Pprof writes the live set after event at as a gzipped pprof heap profile (see PprofProfile).
func Pprof(w io.Writer, tl *timeline.Timeline, at int) error {
	p, err := PprofProfile(tl, at)
	if err != nil {
		return err
	}
	return p.Write(w)
}

// PprofProfile returns the blocks allocated after event at as a heap profile, the shape of Go's own:
// sample types inuse_objects/count and inuse_space/bytes (the block sizes that memory_allocated counts), one
// sample per distinct stack and tags, each Go or Python frame a Location whose Function has the file and
// line. The tags are sample labels: phase, category (as of event at), scope and tensor (strings), iteration
// (a number, -1 for setup), and device when the snapshot has several. `go tool pprof -tagfocus
// category=activation` and `-tagroot phase` then answer the usual questions.
//
// Leaks: export at the end of two iterations (At{Kind: AtIterationEnd}) and compare them with
// `go tool pprof -diff_base a.pb.gz b.pb.gz`: what grew is what leaked, by stack.
func PprofProfile(tl *timeline.Timeline, at int) (*profile.Profile, error) {
	return pprofProfile(tl, at, at)
}

// pprofProfile is PprofProfile for event at, which the snapshot the profile describes numbers number.
func pprofProfile(tl *timeline.Timeline, at, number int) (*profile.Profile, error) {
	n := tl.Len()
	if n == 0 {
		return nil, fmt.Errorf("the snapshot has no events")
	}
	if at < 0 || at >= n {
		return nil, fmt.Errorf("event %d is outside the snapshot's %d events", at, n)
	}
	s := tl.Snapshot()
	e := s.Events.At(at)
	p := &profile.Profile{
		SampleType: []*profile.ValueType{
			{Type: "inuse_objects", Unit: "count"},
			{Type: "inuse_space", Unit: "bytes"},
		},
		DefaultSampleType: "inuse_space",
		PeriodType:        &profile.ValueType{Type: "space", Unit: "bytes"},
		Period:            1,
	}
	if s.Meta.TimeUnit != "index" {
		p.DurationNanos = e.Time
		if !s.Meta.Created.IsZero() {
			p.TimeNanos = s.Meta.Created.UnixNano() + e.Time
		}
	}
	where := fmt.Sprintf("event %d", number)
	if e.Iteration >= 0 {
		where += fmt.Sprintf(", iteration %d", e.Iteration)
	}
	if e.Phase != snapshot.PhaseNone {
		where += ", " + e.Phase.String()
	}
	p.Comments = []string{
		"oomdbg: device memory allocated after " + where + " of " + Title(s.Meta),
		fmt.Sprintf("allocated %s, reserved %s", units.FormatSize(tl.Allocated(at)), units.FormatSize(tl.Reserved(at))),
	}
	mapping := &profile.Mapping{ID: 1, File: Title(s.Meta), HasFunctions: true, HasFilenames: true, HasLineNumbers: true}
	p.Mapping = []*profile.Mapping{mapping}

	b := pprofBuilder{p: p, s: s, mapping: mapping, locs: make(map[snapshot.FrameID]*profile.Location),
		funcs: make(map[[2]snapshot.StringID]*profile.Function), samples: make(map[sampleKey]*profile.Sample)}
	devices := make(map[int16]bool)
	live := tl.LiveAt(at, nil)
	for i := range live {
		devices[live[i].Device] = true
	}
	for i := range live {
		b.add(&live[i], len(devices) > 1)
	}
	if err := p.CheckValid(); err != nil {
		return nil, err
	}
	return p, nil
}

// sampleKey is what makes blocks one sample: the same stack and the same tags.
type sampleKey struct {
	stack        snapshot.StackID
	phase        snapshot.Phase
	category     snapshot.Category
	scope, label snapshot.StringID
	iteration    int32
	device       int16
}

type pprofBuilder struct {
	p       *profile.Profile
	s       *snapshot.Snapshot
	mapping *profile.Mapping
	locs    map[snapshot.FrameID]*profile.Location
	funcs   map[[2]snapshot.StringID]*profile.Function
	samples map[sampleKey]*profile.Sample
	noStack *profile.Location
}

func (b *pprofBuilder) add(a *timeline.Allocation, multiDevice bool) {
	k := sampleKey{stack: a.Stack, phase: a.Phase, category: a.Category, scope: a.Scope, label: a.Label, iteration: a.Iteration}
	if multiDevice {
		k.device = a.Device
	}
	if sm, ok := b.samples[k]; ok {
		sm.Value[0]++
		sm.Value[1] += a.Size
		return
	}
	sm := &profile.Sample{
		Value:    []int64{1, a.Size},
		Location: b.locations(a.Stack),
		Label:    map[string][]string{"phase": {a.Phase.String()}, "category": {a.Category.String()}},
		NumLabel: map[string][]int64{"iteration": {int64(a.Iteration)}},
		// A unit keeps iteration 0: pprof's decoder drops a numeric label of value 0 that has none.
		NumUnit: map[string][]string{"iteration": {"iteration"}},
	}
	if v := b.s.String(a.Scope); v != "" {
		sm.Label["scope"] = []string{v}
	}
	if v := b.s.String(a.Label); v != "" {
		sm.Label["tensor"] = []string{v}
	}
	if multiDevice {
		sm.NumLabel["device"] = []int64{int64(a.Device)}
		sm.NumUnit["device"] = []string{"device"}
	}
	b.samples[k] = sm
	b.p.Sample = append(b.p.Sample, sm)
}

// locations returns a stack as Locations, leaf first as pprof wants them; a block without a stack gets one
// location that says so, rather than vanishing from the profile's tree.
func (b *pprofBuilder) locations(id snapshot.StackID) []*profile.Location {
	frames := b.s.Stack(id)
	if len(frames) == 0 {
		if b.noStack == nil {
			fn := &profile.Function{ID: uint64(len(b.p.Function) + 1), Name: "(no stack recorded)", SystemName: "(no stack recorded)"}
			b.p.Function = append(b.p.Function, fn)
			b.noStack = &profile.Location{ID: uint64(len(b.p.Location) + 1), Mapping: b.mapping, Line: []profile.Line{{Function: fn}}}
			b.p.Location = append(b.p.Location, b.noStack)
		}
		return []*profile.Location{b.noStack}
	}
	out := make([]*profile.Location, len(frames))
	for i, fid := range frames {
		loc, ok := b.locs[fid]
		if !ok {
			f := b.s.Frame(fid)
			key := [2]snapshot.StringID{f.Function, f.File}
			fn, ok := b.funcs[key]
			if !ok {
				name := b.s.String(f.Function)
				fn = &profile.Function{ID: uint64(len(b.p.Function) + 1), Name: name, SystemName: name, Filename: b.s.String(f.File)}
				b.funcs[key] = fn
				b.p.Function = append(b.p.Function, fn)
			}
			loc = &profile.Location{ID: uint64(len(b.p.Location) + 1), Mapping: b.mapping, Line: []profile.Line{{Function: fn, Line: int64(f.Line)}}}
			b.locs[fid] = loc
			b.p.Location = append(b.p.Location, loc)
		}
		out[i] = loc
	}
	return out
}

// sampleBlocks counts the blocks a profile's samples hold.
func sampleBlocks(p *profile.Profile) int {
	n := int64(0)
	for _, s := range p.Sample {
		n += s.Value[0]
	}
	return int(n)
}
