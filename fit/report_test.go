package fit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestReport holds fit's report to the search it sums up: the JSON document lists the plans found, each with
// the workload's flags and then its own, and the text shows the same plans with the run line of each.
func TestReport(t *testing.T) {
	cfg, err := train.PresetConfig("gpt2-small")
	if err != nil {
		t.Fatal(err)
	}
	cfg.GPUMemory = 8 << 30
	gpu, err := fit.LookupGPU(fit.DefaultGPU)
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"--preset=gpt2-small", "--gpu-mem=8GiB"}
	rep, err := fit.Search(context.Background(), cfg, fit.Request{GPU: gpu, Top: 2, Margin: fit.DefaultMargin, Base: base})
	if err != nil {
		t.Fatal(err)
	}
	var js, text, md bytes.Buffer
	for w, write := range map[*bytes.Buffer]func(*bytes.Buffer) error{
		&js: func(b *bytes.Buffer) error { return rep.WriteJSON(b) }, &text: func(b *bytes.Buffer) error { return rep.WriteText(b) },
		&md: func(b *bytes.Buffer) error { return rep.WriteMarkdown(b) },
	} {
		if err := write(w); err != nil {
			t.Fatal(err)
		}
	}
	var doc fit.ReportJSON
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.MaxBatch != rep.Batch.MaxBatch || len(doc.Plans) != len(rep.Plans.Fitting) || len(doc.Plans) == 0 {
		t.Fatalf("max batch %d, %d plans; the search found %d and %d", doc.MaxBatch, len(doc.Plans), rep.Batch.MaxBatch, len(rep.Plans.Fitting))
	}
	for i, p := range doc.Plans {
		if p.Plan != rep.Plans.Fitting[i].Name() || !strings.HasPrefix(p.Flags, strings.Join(base, " ")+" ") {
			t.Errorf("plan %d: %q, flags %q", i, p.Plan, p.Flags)
		}
		if !strings.Contains(text.String(), "oomdbg run "+p.Flags+"\n") || !strings.Contains(md.String(), "| "+p.Plan+" |") {
			t.Errorf("plan %d (%s) is missing from the text or the markdown", i, p.Plan)
		}
	}
	cfg.Batch = 0
	if _, err := fit.Search(context.Background(), cfg, fit.Request{GPU: gpu}); err == nil {
		t.Error("a search of batch 0 found something")
	}
}
