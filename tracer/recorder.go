// Package tracer records a training workload's memory as snapshot events.
//
// A Recorder is two things at once. It is the caching allocator's observer (it implements
// allocator.Observer, with basic parameter types so neither package imports the other), turning every
// alloc, free and segment change into an event with the Go stack of the code that caused it. And it is the
// runtime's tagger: the training loop tells it the phase and iteration, modules push their scope, tensors say
// what the next allocation is (category and label), autograd reports category changes, and heap dumps report
// who retains each live tensor. Every event carries the tags current when it happened.
//
// Stacks are the ones runtime.Callers gives. Where Go keeps frame pointers (amd64, arm64) they are captured by
// walking them and cached by the chain of return addresses, so a call path seen before costs the walk and one
// map lookup; runtime.Callers, symbolising and filtering frames (allocator and runtime internals are skipped)
// happen once per distinct path.
package tracer

import (
	"errors"
	"sync"
	"time"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Sink is where a Recorder puts events: a *snapshot.Writer, or anything that interns and stores like one.
type Sink interface {
	InternString(s string) snapshot.StringID
	InternFrame(function, file string, line int) snapshot.FrameID
	InternStack(frames []snapshot.FrameID) snapshot.StackID
	Write(e *snapshot.Event) error
	Flush() error
	Close(f *snapshot.Footer) error
}

// ErrClosed is returned by a Recorder used after Close.
var ErrClosed = errors.New("tracer: recorder is closed")

// Recorder turns allocator hooks and runtime tags into snapshot events. It is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	sink   Sink
	now    func() int64
	stacks *stackTable // nil when stacks are off
	err    error       // the first error from the sink; once set, nothing more is recorded

	// Tags current for the next event.
	phase     snapshot.Phase
	iteration int32
	scopes    []snapshot.StringID
	next      nextAlloc

	ev      snapshot.Event // scratch, reused so recording does not allocate
	summary summaryBuilder
}

// nextAlloc holds what the runtime said about the allocation it is about to make.
type nextAlloc struct {
	category snapshot.Category
	label    snapshot.StringID
}

// Option configures a Recorder.
type Option func(*config)

type config struct {
	now       func() int64
	depth     int
	skipFuncs []string
}

// WithClock sets the clock events are stamped with (nanoseconds); the default is the time since New.
// Tests use it for reproducible files.
func WithClock(now func() int64) Option { return func(c *config) { c.now = now } }

// WithStackDepth sets how many program counters are captured per stack (default 48); 0 records no stacks.
func WithStackDepth(n int) Option { return func(c *config) { c.depth = max(n, 0) } }

// WithSkippedFrames adds function-name prefixes (usually "import/path.") whose frames are left out of stacks,
// in addition to the Go runtime, this package and the allocator model.
func WithSkippedFrames(prefixes ...string) Option {
	return func(c *config) { c.skipFuncs = append(c.skipFuncs, prefixes...) }
}

// New returns a Recorder writing to sink. The phase starts as setup and the iteration as -1.
func New(sink Sink, opts ...Option) *Recorder {
	start := time.Now()
	c := config{
		now:       func() int64 { return int64(time.Since(start)) },
		depth:     defaultStackDepth,
		skipFuncs: append([]string(nil), defaultSkippedFrames...),
	}
	for _, o := range opts {
		o(&c)
	}
	r := &Recorder{sink: sink, now: c.now, phase: snapshot.PhaseSetup, iteration: -1}
	if c.depth > 0 {
		r.stacks = newStackTable(sink, c.depth, c.skipFuncs)
	}
	return r
}

// begin fills the scratch event with the action, the time and the current tags. The caller holds r.mu.
func (r *Recorder) begin(a snapshot.Action, device int, stream int64) *snapshot.Event {
	e := &r.ev
	*e = snapshot.Event{
		Time:      r.now(),
		Action:    a,
		Device:    int16(device),
		Stream:    stream,
		Phase:     r.phase,
		Iteration: r.iteration,
	}
	if n := len(r.scopes); n > 0 {
		e.Scope = r.scopes[n-1]
	}
	return e
}

// emit writes the scratch event. The caller holds r.mu.
func (r *Recorder) emit(e *snapshot.Event) {
	if r.err != nil {
		return
	}
	if err := r.sink.Write(e); err != nil {
		r.err = err
		return
	}
	r.summary.add(e)
}

// stack captures the current goroutine's stack. The Recorder's and the allocator's frames are captured too
// (they tell call paths apart cheaply) and dropped when the stack is first symbolised.
func (r *Recorder) stack() snapshot.StackID {
	if r.stacks == nil || r.err != nil {
		return 0
	}
	return r.stacks.capture()
}

// Err returns the first error the sink reported, or ErrClosed after Close. Recording stops at the first error.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Summary returns what has been recorded so far: event counts, the allocated and reserved peaks.
func (r *Recorder) Summary() snapshot.Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.summary.snapshot()
}

// Flush asks the sink to write out buffered events, so a follower sees them.
func (r *Recorder) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	if err := r.sink.Flush(); err != nil {
		r.err = err
	}
	return r.err
}

// Close finishes the snapshot: the sink writes its last events and a footer with the summary and segments,
// the allocator's final state. A Recorder that already failed still closes its sink, so what was recorded
// stays readable, and returns the first error.
func (r *Recorder) Close(segments []snapshot.Segment) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if errors.Is(r.err, ErrClosed) {
		return ErrClosed
	}
	var footer *snapshot.Footer
	if r.err == nil {
		footer = &snapshot.Footer{Summary: r.summary.snapshot(), Segments: segments}
	}
	err := r.sink.Close(footer)
	if r.err != nil {
		err = r.err
	}
	r.err = ErrClosed
	return err
}
