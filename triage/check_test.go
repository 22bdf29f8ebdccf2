package triage_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
)

// TestCheck holds check's verdict to the leak analysis it sums up: a leak fails without a limit and passes
// within one, a limit broken fails with its reason, and an OOM fails whatever else holds.
func TestCheck(t *testing.T) {
	tl := timeline.New(fixture(t, "gpt-retain-graph"))
	ptr := func(n int64) *int64 { return &n }
	for name, tc := range map[string]struct {
		lim    triage.CheckLimits
		oom    bool
		pass   bool
		reason string // a part of the reason
	}{
		"a leak":                  {pass: false, reason: "leak"},
		"within the growth limit": {lim: triage.CheckLimits{MaxGrowth: ptr(1 << 40)}, pass: true, reason: "within the limit of 1.00 TiB per iteration"},
		"over the peak limit":     {lim: triage.CheckLimits{MaxGrowth: ptr(1 << 40), MaxPeak: ptr(1)}, pass: false, reason: "peak"},
		"an OOM":                  {lim: triage.CheckLimits{MaxGrowth: ptr(1 << 40)}, oom: true, pass: false, reason: "oom: the run ran out of memory at event 7 (iteration 2, backward)"},
	} {
		t.Run(name, func(t *testing.T) {
			r := leaks.Analyze(tl, append([]leaks.Option{leaks.Warmup(leaks.DefaultWarmup)}, tc.lim.Options()...)...)
			c := triage.NewCheck("x.oomdbg", r, tc.lim)
			if tc.oom {
				c.FailOnOOM(&triage.FirstOOM{Seq: 7, Iteration: 2, Phase: snapshot.PhaseBackward})
			}
			if c.Pass != tc.pass || !strings.Contains(c.Reason, tc.reason) {
				t.Fatalf("pass %v, reason %q; want %v and %q", c.Pass, c.Reason, tc.pass, tc.reason)
			}
			var text, js bytes.Buffer
			if err := c.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			verdict := map[bool]string{true: "PASS: ", false: "FAIL: "}[tc.pass]
			if !strings.HasPrefix(text.String(), verdict+c.Reason+"\n") {
				t.Errorf("text starts %q", strings.SplitN(text.String(), "\n", 2)[0])
			}
			if err := c.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			var doc struct {
				Format   string
				Pass     bool
				Failures []string
			}
			if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
				t.Fatal(err)
			}
			if doc.Format != triage.CheckFormat || doc.Pass != tc.pass || tc.pass != (len(doc.Failures) == 0) {
				t.Errorf("JSON: %+v", doc)
			}
		})
	}
}
