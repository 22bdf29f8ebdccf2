package transform

import (
	"cmp"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// additions are events to insert into a trace, each at the index of the event it goes next to: the events
// in the order they were added, and their places, which sort orders.
type additions struct {
	evs    []snapshot.Event
	places []place
}

// place is where addition evs[i] goes: next to event at.
type place struct{ at, i int }

func (a *additions) add(at int, evs ...snapshot.Event) {
	for _, e := range evs {
		a.places = append(a.places, place{at, len(a.evs)})
		a.evs = append(a.evs, e)
	}
}

// sort orders the additions by index, keeping the order they were added in at each.
func (a *additions) sort() {
	slices.SortFunc(a.places, func(x, y place) int {
		if c := cmp.Compare(x.at, y.at); c != 0 {
			return c
		}
		return cmp.Compare(x.i, y.i)
	})
}

// appendAt appends the sorted additions at index i to dst and consumes them; those before i must be consumed.
func (a *additions) appendAt(dst []snapshot.Event, i int) []snapshot.Event {
	for len(a.places) > 0 && a.places[0].at == i {
		dst = append(dst, a.evs[a.places[0].i])
		a.places = a.places[1:]
	}
	return dst
}

// len returns the number of additions not consumed.
func (a *additions) len() int { return len(a.places) }
