package train

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzLengths feeds arbitrary bytes to the length-file parser and to a stored distribution's JSON: each
// either reads, into lengths that are increasing, positive and within the bounds, or is refused in one line.
func FuzzLengths(f *testing.F) {
	for _, seed := range []string{"12\n7\n", "", "\n\n", "1e3", "-1\n", "16777216\n", "\x00\xff", `{"file":"x","counts":[[5,1],[9,2]]}`, `"uniform:1:9"`, `"file:/etc/passwd"`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		check := func(lf *LengthFile, err error) {
			if err != nil {
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("a message of more than one line: %q", err)
				}
				return
			}
			if len(lf.lengths) == 0 || len(lf.lengths) > MaxDistinctLengths || lf.Samples() <= 0 {
				t.Fatalf("read %d lengths, %d samples", len(lf.lengths), lf.Samples())
			}
			for i, l := range lf.lengths {
				if l < 1 || l > MaxSeqLength || i > 0 && l <= lf.lengths[i-1] {
					t.Fatalf("lengths %v", lf.lengths)
				}
			}
			if d := lf.draw(lf.Samples() - 1); d != lf.Max() {
				t.Fatalf("the last sample draws %d, not the longest %d", d, lf.Max())
			}
		}
		check(parseLengths("fuzz", data))
		var d SeqDist
		if err := json.Unmarshal(data, &d); err == nil && d.kind == seqFile {
			check(d.file, nil)
		}
	})
}
