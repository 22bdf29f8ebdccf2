package load

import (
	"errors"
	"fmt"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

func TestPartial(t *testing.T) {
	damage := &snapshot.DecodeError{Offset: 100, Op: "chunk", Err: snapshot.ErrChecksum}
	for name, tc := range map[string]struct {
		events int
		err    error
		want   bool
	}{
		"whole":                 {10, nil, false},
		"damaged after events":  {10, fmt.Errorf("run.oomdbg: %w", damage), true},
		"damaged before events": {0, damage, false},
		"over the budget":       {10, &MemoryError{Path: "x"}, false},
		"past a limit":          {10, fmt.Errorf("x: %w", snapshot.ErrEventLimit), false},
		"not a snapshot":        {0, errors.New("x is " + ErrUnknownFormat.Error()), false},
	} {
		if got := Partial(tc.events, tc.err); got != tc.want {
			t.Errorf("%s: Partial(%d, %v) = %v, want %v", name, tc.events, tc.err, got, tc.want)
		}
	}
}
