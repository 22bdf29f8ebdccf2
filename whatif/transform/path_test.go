package transform

import (
	"strings"
	"testing"
)

// TestSharedChild holds sharedChild against the definition it replaces: split both paths at the dots, count
// the leading components they share, and join q's components up to one past them.
func TestSharedChild(t *testing.T) {
	paths := []string{"", ".", "a", "a.", ".a", "a.b", "a.b.c", "a.bc", "ab.c", "a..b", "a.b.", "transformer.h.0.attn",
		"transformer.h.0.mlp", "transformer.h.1", "transformer.h", "transformer", "lm_head"}
	for _, p := range paths {
		for _, q := range paths {
			ps, qs := strings.Split(p, "."), strings.Split(q, ".")
			n := 0
			for n < len(ps) && n < len(qs) && ps[n] == qs[n] {
				n++
			}
			want, wantOK := "", n < len(qs)
			if wantOK {
				want = strings.Join(qs[:n+1], ".")
			}
			if got, ok := sharedChild(p, q); got != want || ok != wantOK {
				t.Errorf("sharedChild(%q, %q) = %q, %v; want %q, %v", p, q, got, ok, want, wantOK)
			}
			if got, want := within(p, q), p == q || strings.HasPrefix(p, q+"."); got != want {
				t.Errorf("within(%q, %q) = %v, want %v", p, q, got, want)
			}
		}
	}
}
