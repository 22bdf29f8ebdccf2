package headroom

import (
	"strings"
	"testing"
)

// The default workload's card: 24 GiB less the 512 MiB the CUDA context takes.
const usable = 24<<30 - 512<<20

// TestLimitIsTheUsableMemoryLessTheMargin holds Limit to the rule's formula worked by hand: 23.5 GiB is
// 25,232,932,864 bytes, and 95% of it 23,971,286,220.8.
func TestLimitIsTheUsableMemoryLessTheMargin(t *testing.T) {
	for _, c := range []struct {
		margin float64
		want   int64
	}{
		{0.05, 23971286220},
		{0, 25232932864},
		{0.10, 22709639577},
		{-1, 25232932864}, // outside [0, 1): none
		{1, 25232932864},
	} {
		if got := Limit(usable, c.margin); got != c.want {
			t.Errorf("Limit(%d, %v) = %d, want %d", int64(usable), c.margin, got, c.want)
		}
	}
}

// TestJudgeCallsAPeakInsideTheMarginTight: a run that ran on the card but leaves less than the margin does
// not fit, and says how little it left; one within the limit fits; an OOM is an OOM whatever its peak.
func TestJudgeCallsAPeakInsideTheMarginTight(t *testing.T) {
	const MiB = 1 << 20
	for _, c := range []struct {
		name   string
		peak   int64
		oom    bool
		usable int64
		want   string
		says   []string
	}{
		// 10 MiB left of 23.50 GiB: the plan the fixes pane once applied.
		{"10 MiB left", usable - 10*MiB, false, usable, Tight, []string{"tight", "10.00 MiB", "23.50 GiB", "5%"}},
		{"at the limit", 23971286220, false, usable, Fits, []string{"fits", "0 B under the 22.32 GiB limit", "95%"}},
		{"a byte over", 23971286221, false, usable, Tight, []string{"tight"}},
		{"well under", 16 << 30, false, usable, Fits, []string{"fits", "6.32 GiB under"}},
		{"ran out", 1 << 30, true, usable, OOM, []string{"out of memory"}},
		{"no capacity", 1 << 30, false, 0, Unknown, []string{"unknown"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := Judge(c.peak, c.oom, c.usable, DefaultMargin)
			if v.Word != c.want {
				t.Fatalf("verdict %q, want %q (%+v)", v.Word, c.want, v)
			}
			if v.Fits() != (c.want == Fits) {
				t.Errorf("Fits() = %v for %q", v.Fits(), v.Word)
			}
			for _, s := range c.says {
				if !strings.Contains(v.String(), s) {
					t.Errorf("%q does not say %q", v.String(), s)
				}
			}
		})
	}
}

func TestRuleStatesTheMargin(t *testing.T) {
	got := Rule(usable, DefaultMargin)
	for _, s := range []string{"22.32 GiB", "95%", "23.50 GiB", "5% margin"} {
		if !strings.Contains(got, s) {
			t.Errorf("%q does not say %q", got, s)
		}
	}
	if got := Percent(0.025); got != "2.5%" {
		t.Errorf("Percent(0.025) = %q", got)
	}
}
