package train

import "github.com/oomdbg/oomdbg/snapshot"

// EmptyCache is when the loop calls torch.cuda.empty_cache() (--empty-cache): never (the zero value), at the
// end of every step, or at the end of every phase. It returns every cached segment that holds no block in use
// to the device; the next step then gets its memory back from cudaMalloc, and that cost is counted
// (StepStat).
type EmptyCache uint8

// The empty_cache settings.
const (
	EmptyCacheNever EmptyCache = iota
	EmptyCacheStep
	EmptyCachePhase
)

var emptyCacheNames = []string{"never", "step", "phase"}

// ParseEmptyCache reads an empty_cache setting: never, step or phase ("" is never).
func ParseEmptyCache(s string) (EmptyCache, error) {
	i, err := parseWord(emptyCacheNames, "empty-cache", s)
	return EmptyCache(i), err
}

func (e EmptyCache) String() string                   { return nameOf(emptyCacheNames, int(e), "empty_cache") }
func (e EmptyCache) MarshalText() ([]byte, error)     { return []byte(e.String()), nil }
func (e *EmptyCache) UnmarshalText(text []byte) error { return parseInto(e, ParseEmptyCache, text) }

// IsZero reports whether e is never, so that a Config's JSON leaves it out as it always did.
func (e EmptyCache) IsZero() bool { return e == EmptyCacheNever }

// StepStat is what one training step asked of the device: the shape of each micro-batch, the cudaMalloc and
// cudaFree calls the caching allocator made (a page map or unmap of an expandable segment counts as one), and
// what empty_cache returned.
type StepStat struct {
	Iteration int
	// SeqLens is the padded length of each micro-batch (and the evaluation batch, if any); Tokens the
	// samples' own tokens and PaddedTokens the tokens put on the device, padding included.
	SeqLens      []int
	Tokens       int64
	PaddedTokens int64
	// DeviceAllocs and DeviceFrees count the allocator's num_device_alloc and num_device_free over the step.
	DeviceAllocs int64
	DeviceFrees  int64
	// EmptyCacheCalls counts the empty_cache calls of the step, EmptyCacheReleased the bytes they returned.
	EmptyCacheCalls    int
	EmptyCacheReleased int64
	// PeakAllocated and PeakReserved are the step's peaks; EndReserved is reserved memory when it ended.
	PeakAllocated, PeakReserved, EndReserved int64
}

// emptyCacheNote is the annotation recorded at each empty_cache call, so that the timeline shows why the
// segments it frees went.
const emptyCacheNote = "torch.cuda.empty_cache()"

// emptyCache calls torch.cuda.empty_cache() and counts it in the step's statistics.
func (r *run) emptyCache() {
	a := r.dev.Allocator()
	before := a.Stats().ReservedBytes.All().Current
	if r.rec != nil {
		r.rec.Annotate(emptyCacheNote)
	}
	if err := a.EmptyCache(); err != nil {
		panic(err) // a device that fails to free: the run cannot go on (Run returns it)
	}
	if st := r.stepStat; st != nil {
		st.EmptyCacheCalls++
		st.EmptyCacheReleased += before - a.Stats().ReservedBytes.All().Current
	}
}

// beginStep starts the statistics of step i.
func (r *run) beginStep(i int) {
	st := r.dev.Allocator().Stats()
	r.res.StepStats = append(r.res.StepStats, StepStat{Iteration: i, DeviceAllocs: -st.NumDeviceAlloc, DeviceFrees: -st.NumDeviceFree})
	r.stepStat = &r.res.StepStats[len(r.res.StepStats)-1]
	r.stepPeaks = [2]int64{st.AllocatedBytes.All().Current, st.ReservedBytes.All().Current}
}

// notePeaks folds the allocator's peaks since the last reset (a phase begins) into the step's.
func (r *run) notePeaks() {
	if r.stepStat == nil {
		return
	}
	st := r.dev.Allocator().Stats()
	r.stepPeaks[0] = max(r.stepPeaks[0], st.AllocatedBytes.All().Peak)
	r.stepPeaks[1] = max(r.stepPeaks[1], st.ReservedBytes.All().Peak)
}

// endStep closes the step's statistics; it is called at the end of a step and at the OOM or interrupt that
// cuts one short.
func (r *run) endStep() {
	s := r.stepStat
	if s == nil {
		return
	}
	r.notePeaks()
	st := r.dev.Allocator().Stats()
	s.DeviceAllocs += st.NumDeviceAlloc
	s.DeviceFrees += st.NumDeviceFree
	s.PeakAllocated, s.PeakReserved = r.stepPeaks[0], r.stepPeaks[1]
	s.EndReserved = st.ReservedBytes.All().Current
	r.stepStat = nil
}

// nextBatch draws the shape of the next batch and counts its tokens in the step's statistics.
func (r *run) nextBatch() batchShape {
	b := r.lengths.next(r.cfg.Batch)
	if s := r.stepStat; s != nil && r.cfg.Model != "mlp" {
		s.SeqLens = append(s.SeqLens, b.t)
		s.PaddedTokens += int64(b.n) * int64(b.t)
		if b.lengths == nil {
			s.Tokens += int64(b.n) * int64(b.t)
		}
		for _, l := range b.lengths {
			s.Tokens += int64(l)
		}
	}
	return b
}

// phaseEnds is called when a phase ends, before the next begins: with empty_cache at every phase, the cache
// is emptied there; not after setup (nothing of a step is cached yet), nor after a step's last phase, which
// the step's own call at its end closed.
func (r *run) phaseEnds(next snapshot.Phase) {
	if r.cfg.EmptyCache == EmptyCachePhase && r.phase != snapshot.PhaseSetup && r.phase != next && !r.stepEmptied {
		r.emptyCache()
	}
	r.stepEmptied = false
}

// StepCost is what steps asked of the device on average: cudaMalloc and cudaFree calls (page maps and unmaps
// of expandable segments included) and the bytes empty_cache returned.
type StepCost struct {
	Steps              int // the steps averaged
	Mallocs, Frees     float64
	EmptyCacheReleased float64
}

// SteadyCost returns the mean cost of the completed steps after the first, which fills the cache: what a
// setting costs for as long as the run lasts. Steps is 0 when no such step completed.
func (r *Result) SteadyCost() StepCost {
	var c StepCost
	for i, s := range r.StepStats {
		if i == 0 || i >= r.Steps {
			continue
		}
		c.Steps++
		c.Mallocs += float64(s.DeviceAllocs)
		c.Frees += float64(s.DeviceFrees)
		c.EmptyCacheReleased += float64(s.EmptyCacheReleased)
	}
	if c.Steps > 0 {
		n := float64(c.Steps)
		c.Mallocs, c.Frees, c.EmptyCacheReleased = c.Mallocs/n, c.Frees/n, c.EmptyCacheReleased/n
	}
	return c
}
