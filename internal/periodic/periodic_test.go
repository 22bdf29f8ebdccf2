package periodic

import (
	"strings"
	"testing"
)

func TestPrefix(t *testing.T) {
	tests := []struct {
		s            string
		repeats      int
		span, period int
	}{
		{"abcabcabcx", 3, 9, 3},
		{"abcabcabx", 3, 0, 0}, // two repeats only
		{"abcabcab", 2, 8, 3},  // a partial period at the end counts
		{"aaaaaa", 2, 0, 0},    // a run of one token is no loop
		{"abababab", 2, 8, 2},  // the shortest period
		{"xabcabc", 2, 0, 0},   // a prefix, not a stretch inside
		{"", 2, 0, 0},
	}
	for _, tc := range tests {
		span, period := Prefix(len(tc.s), func(i int) byte { return tc.s[i] }, tc.repeats)
		if span != tc.span || period != tc.period {
			t.Errorf("%q x%d: span %d period %d, want %d %d", tc.s, tc.repeats, span, period, tc.span, tc.period)
		}
	}
	// Five periods and the start of a sixth.
	s := strings.Repeat("abcd", 5) + "abzz"
	span, period := Prefix(len(s), func(i int) byte { return s[i] }, 2)
	if span != 22 || period != 4 {
		t.Errorf("span %d period %d, want 22 4", span, period)
	}
}
