package table

import (
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	header := []string{"fix", "kind", "peak"}
	rows := [][]string{{"as configured", "-", "22.87 GiB"}, {"bf16", "amp", "1 B"}}
	for name, tc := range map[string]struct {
		markdown bool
		left     int
		want     string
	}{
		"terminal, one label": {false, 1, "" +
			"fix            kind       peak\n" +
			"as configured     -  22.87 GiB\n" +
			"bf16            amp        1 B\n"},
		"terminal, two labels": {false, 2, "" +
			"fix            kind       peak\n" +
			"as configured  -     22.87 GiB\n" +
			"bf16           amp         1 B\n"},
		"terminal, all labels": {false, 3, "" +
			"fix            kind  peak\n" +
			"as configured  -     22.87 GiB\n" +
			"bf16           amp   1 B\n"},
		"markdown": {true, 1, "" +
			"| fix | kind | peak |\n" +
			"|---|---|---|\n" +
			"| as configured | - | 22.87 GiB |\n" +
			"| bf16 | amp | 1 B |\n"},
	} {
		t.Run(name, func(t *testing.T) {
			var b strings.Builder
			Write(&b, header, rows, tc.markdown, tc.left)
			if b.String() != tc.want {
				t.Errorf("got\n%s\nwant\n%s", b.String(), tc.want)
			}
		})
	}
}
