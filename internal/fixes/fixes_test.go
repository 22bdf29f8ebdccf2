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
	if n := len(table); n > 2 && table[n-1] == "Fits: peak reserved within 22.32 GiB, 95% of the 23.50 GiB the allocator can use (a 5% margin; tight: no OOM, but inside it)." && table[n-2] == "" {
		table = table[:n-2]
	} else {
		t.Errorf("the table does not end with the rule its fits column follows:\n%s", b.String())
	}
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

// TestFitsFollowsTheHeadroomRule: a fix that ran on the card but leaves less than 5% of the 23.50 GiB the
// allocator can use is tight, not a fit (README.md's "bf16 + flash + checkpoint every 2nd block": 23.49 GiB
// reserved); one within 95% of it fits; an OOM is an OOM.
func TestFitsFollowsTheHeadroomRule(t *testing.T) {
	cfg := train.DefaultMLP() // 24 GiB, 512 MiB of it the CUDA context
	for _, c := range []struct {
		reserved int64
		oom      bool
		want     string
	}{
		{24<<30 - 512<<20 - 10<<20, false, "tight: 10.00 MiB left"},
		{21 << 30, false, "yes"},
		{23971286220, false, "yes"},                  // 95% of 23.50 GiB, to the byte
		{23971286221, false, "tight: 1.17 GiB left"}, // 1,261,646,643 bytes: 1.17499 GiB
		{22 << 30, true, "OOM"},
	} {
		r := train.SweepRow{PeakReserved: c.reserved}
		if c.oom {
			r.OOM = &train.OOM{}
		}
		if got := Fits(cfg, r); got != c.want {
			t.Errorf("peak reserved %d, OOM %v: %q, want %q", c.reserved, c.oom, got, c.want)
		}
	}
}
