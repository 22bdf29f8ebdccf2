package fixes

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestMeasureAndWrite holds the fixes table to the sweep it writes: a row for each fix measured, under the
// title and header, and a configuration that cannot run refused with its field.
func TestMeasureAndWrite(t *testing.T) {
	cfg := train.DefaultMLP()
	rows, err := Measure(context.Background(), cfg, false)
	if err != nil || len(rows) == 0 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	var b strings.Builder
	Write(&b, cfg, rows, true)
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if want := "mlp, batch 64, on 24.00 GiB (512.00 MiB taken by the CUDA context), meta device, 2 steps:"; lines[0] != want {
		t.Errorf("title %q, want %q", lines[0], want)
	}
	table := lines[2:]
	if len(table) != 2+len(rows) || table[0] != "| fix | peak allocated | peak reserved | fits | needs (allocated) |" {
		t.Errorf("%d table lines for %d rows:\n%s", len(table), len(rows), b.String())
	}
	for i, r := range rows {
		if !strings.HasPrefix(table[2+i], "| "+r.Fix+" | ") {
			t.Errorf("row %d is %q, want fix %q", i, table[2+i], r.Fix)
		}
	}
	cfg.Hidden = 0
	var fe *train.FieldError
	if _, err := Measure(context.Background(), cfg, false); !errors.As(err, &fe) {
		t.Errorf("hidden 0: %v", err)
	}
}

// TestCheckBugs holds each recording's checks to what the bug does: the fixed loop passes both checks, a
// leak fails both, memory held across iterations passes and fails with --max-held 0.
func TestCheckBugs(t *testing.T) {
	cfg := train.DefaultMLP()
	cfg.Steps = 6
	rows, err := CheckBugs(context.Background(), cfg, 2, "test")
	if err != nil || len(rows) != len(train.Bugs)+1 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	want := map[string][2]bool{"": {true, true}, train.BugRetainGraph: {false, false}, train.BugTensorLossSum: {true, false}}
	for _, r := range rows {
		if w, ok := want[r.Bug]; ok && (r.Check.Pass != w[0] || r.Strict.Pass != w[1]) {
			t.Errorf("bug %q: check %v, --max-held 0 %v; want %v", r.Bug, r.Check.Pass, r.Strict.Pass, w)
		}
	}
	var b strings.Builder
	WriteBugs(&b, cfg, 2, rows, false)
	if !strings.HasPrefix(b.String(), "mlp, batch 64, meta device, 6 steps, warm-up 2, each recording checked as oomdbg check checks it:\n\n") {
		t.Errorf("title:\n%s", b.String())
	}
}
