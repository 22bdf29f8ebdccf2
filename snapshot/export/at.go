package export

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// AtKind says how an At names its event.
type AtKind uint8

// The kinds of At.
const (
	AtPeak         AtKind = iota // the first event after which allocated bytes were highest
	AtOOM                        // the first oom event
	AtEnd                        // the last event
	AtIterationEnd               // the last event of iteration N (-1: of setup), where the runtime takes its heap dump
	AtEvent                      // event number N
)

// At names the event an export describes: "peak", "oom", "end", "iteration-end:N" or an event number.
type At struct {
	Kind AtKind
	N    int // the iteration (AtIterationEnd) or the event number (AtEvent)
}

// ParseAt parses an At as the --at flag spells it.
func ParseAt(s string) (At, error) {
	switch s {
	case "peak":
		return At{Kind: AtPeak}, nil
	case "oom":
		return At{Kind: AtOOM}, nil
	case "end":
		return At{Kind: AtEnd}, nil
	}
	if n, ok := strings.CutPrefix(s, "iteration-end:"); ok {
		it, err := strconv.Atoi(n)
		if err != nil || it < -1 {
			return At{}, fmt.Errorf("bad iteration in %q (want iteration-end:N, N from 0, or -1 for the end of setup)", s)
		}
		return At{Kind: AtIterationEnd, N: it}, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return At{}, fmt.Errorf("bad event %q (want peak, oom, end, iteration-end:N or an event number)", s)
	}
	return At{Kind: AtEvent, N: n}, nil
}

// String spells a as ParseAt reads it.
func (a At) String() string {
	switch a.Kind {
	case AtPeak:
		return "peak"
	case AtOOM:
		return "oom"
	case AtEnd:
		return "end"
	case AtIterationEnd:
		return "iteration-end:" + strconv.Itoa(a.N)
	}
	return strconv.Itoa(a.N)
}

// Resolve returns the seq of the event a names in tl.
func (a At) Resolve(tl *timeline.Timeline) (int, error) { return a.resolve(tl, nil, tl.Len()) }

// resolve is Resolve on a device view whose events came from the seqs of a snapshot of total events (seqs
// nil: tl is the whole snapshot): an event number names the last event of the view at or before it.
func (a At) resolve(tl *timeline.Timeline, seqs []int, total int) (int, error) {
	n := tl.Len()
	if n == 0 {
		return 0, fmt.Errorf("the snapshot has no events")
	}
	switch a.Kind {
	case AtPeak:
		return tl.Peak(timeline.Allocated).Seq, nil
	case AtOOM:
		if ooms := tl.OOMs(); len(ooms) > 0 {
			return ooms[0], nil
		}
		return 0, fmt.Errorf("the snapshot has no OOM (try --at peak)")
	case AtEnd:
		return n - 1, nil
	case AtIterationEnd:
		var have []int32
		for _, it := range tl.Iterations() {
			if int(it.Iteration) == a.N {
				return it.End - 1, nil
			}
			if it.Iteration >= 0 {
				have = append(have, it.Iteration)
			}
		}
		if len(have) == 0 {
			return 0, fmt.Errorf("the snapshot has no iterations")
		}
		return 0, fmt.Errorf("the snapshot has no iteration %d (it has %d to %d)", a.N, have[0], have[len(have)-1])
	}
	if a.N >= total {
		return 0, fmt.Errorf("the snapshot has no event %d (it has %d events)", a.N, total)
	}
	seq := a.N
	if seqs != nil {
		seq = sort.SearchInts(seqs, a.N+1) - 1 // the last kept event at or before N
		if seq < 0 {
			seq = 0
		}
	}
	return min(seq, n-1), nil
}
