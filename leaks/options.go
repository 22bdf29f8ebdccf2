package leaks

import (
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/snapshot"
)

// DefaultWarmup is how many iterations are left out before growth is measured: the first step allocates the
// optimizer's state, the first iterations fill caches.
const DefaultWarmup = 2

// An Option tunes Analyze, Find, Verify and Check.
type Option func(*config)

type config struct {
	warmup    int
	maxGrowth int64 // -1: any leak fails
	maxPeak   int64 // -1: no limit
	maxHeld   int64 // -1: no limit
	scopes    []string
	functions []string
	cats      []snapshot.Category
	filter    func(*Suspect) bool
}

func newConfig(opts []Option) config {
	c := config{warmup: DefaultWarmup, maxGrowth: -1, maxPeak: -1, maxHeld: -1}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// Warmup sets how many iterations to leave out before measuring growth (default 2). Growth is measured from
// the end of the last warm-up iteration, at the end of every complete iteration after it.
func Warmup(n int) Option { return func(c *config) { c.warmup = max(n, 0) } }

// MaxGrowth lets a leak of up to bytes per iteration pass Verify and Check: only a leak that grows faster
// fails. Without it any leak fails.
func MaxGrowth(bytes int64) Option { return func(c *config) { c.maxGrowth = max(bytes, 0) } }

// MaxPeak makes Verify and Check fail when the peak of allocated memory exceeds bytes.
func MaxPeak(bytes int64) Option { return func(c *config) { c.maxPeak = max(bytes, 0) } }

// MaxHeld makes Verify and Check fail when more than bytes are held across iterations (Result.HeldBytes).
// Without it, memory held across iterations is reported and passes.
func MaxHeld(bytes int64) Option { return func(c *config) { c.maxHeld = max(bytes, 0) } }

// IgnoreScopes leaves out memory allocated in the given module scopes and the scopes under them:
// "blocks.3" covers "blocks.3" and "blocks.3.attn.qkv", not "blocks.30".
func IgnoreScopes(scopes ...string) Option {
	return func(c *config) { c.scopes = append(c.scopes, scopes...) }
}

// IgnoreFunctions leaves out memory allocated with the given function on its stack, named in full
// ("github.com/you/model.(*Cache).Grow") or without its import path ("model.(*Cache).Grow"). A Python
// stack's functions are plain names ("forward").
func IgnoreFunctions(names ...string) Option {
	return func(c *config) { c.functions = append(c.functions, names...) }
}

// IgnoreCategories leaves out memory of the given categories.
func IgnoreCategories(cats ...snapshot.Category) Option {
	return func(c *config) { c.cats = append(c.cats, cats...) }
}

// Filter keeps only the suspects for which keep returns true, as pytest-memray's filter_fn does: a leak
// whose suspects are all filtered out is not a leak.
func Filter(keep func(s *Suspect) bool) Option { return func(c *config) { c.filter = keep } }

// ignored reports whether the ignore options leave out blocks of group k.
func (c *config) ignored(s *snapshot.Snapshot, k groupKey) bool {
	if slices.Contains(c.cats, k.category) {
		return true
	}
	if len(c.scopes) > 0 {
		scope := s.String(k.scope)
		for _, p := range c.scopes {
			if scope == p || strings.HasPrefix(scope, p+".") {
				return true
			}
		}
	}
	if len(c.functions) > 0 {
		for _, f := range s.Stack(k.stack) {
			fn := s.String(s.Frame(f).Function)
			for _, name := range c.functions {
				if fn == name || snapshot.ShortFunction(fn) == name {
					return true
				}
			}
		}
	}
	return false
}
