package tensor

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/charmbracelet/x/exp/golden" // registers -update, which regenerates the doc
)

// policyDoc is the page the policy table is generated into, between two markers.
var policyDoc = filepath.Join("..", "..", "docs", "autocast.md")

const (
	policyBegin = "<!-- The table is generated from workloads/tensor.AutocastPolicy: go test ./workloads/tensor -run TestAutocastPolicyDoc -update -->\n"
	policyEnd   = "<!-- end of the generated table -->\n"
)

var policyCasts = map[CastPolicy]string{
	NotListed:        "not listed: runs in its inputs' dtypes",
	LowerPrecisionFP: "lower_precision_fp: inputs cast to fp16/bf16",
	FP32:             "fp32: inputs cast to fp32",
	FP32SetOptDType:  "fp32_set_opt_dtype: dtype=fp32 when not given",
	Promote:          "promote: inputs cast to the widest dtype",
}

// policyTable renders AutocastPolicy as a markdown table.
func policyTable() string {
	var b strings.Builder
	b.WriteString("| op | oomdbg | CUDA autocast | output | saved for backward (dtype) | notes | follows |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range AutocastPolicy {
		var saved []string
		for i, s := range r.Saved {
			cell := fmt.Sprintf("%s %s", s.Slot, s.DType)
			if i == 0 || r.Saved[i-1].Node != s.Node {
				cell = fmt.Sprintf("`%s`: %s", s.Node, cell)
			}
			saved = append(saved, cell)
		}
		if len(saved) == 0 {
			saved = []string{"nothing"}
		}
		fmt.Fprintf(&b, "| `%s` | `tensor.%s` | %s | %s | %s | %s | %s |\n", r.Op, r.Func, policyCasts[r.Policy], r.Output,
			strings.Join(saved, ", "), r.Note, r.Source)
	}
	return b.String()
}

// TestAutocastPolicyDoc checks that docs/autocast.md holds the table AutocastPolicy renders, the table
// TestAutocastPolicyIsWhatTheOpsDo holds the ops to; -update rewrites it.
func TestAutocastPolicyDoc(t *testing.T) {
	doc, err := os.ReadFile(policyDoc)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := bytes.Cut(doc, []byte(policyBegin))
	_, after, ok2 := bytes.Cut(rest, []byte(policyEnd))
	if !ok || !ok2 {
		t.Fatalf("%s lacks the markers %q and %q", policyDoc, policyBegin, policyEnd)
	}
	want := policyTable()
	if f := flag.Lookup("update"); f != nil && f.Value.String() == "true" {
		out := append(append(append(append(before, policyBegin...), want...), policyEnd...), after...)
		if err := os.WriteFile(policyDoc, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got, _, _ := bytes.Cut(rest, []byte(policyEnd)); string(got) != want {
		t.Errorf("%s is not the table workloads/tensor.AutocastPolicy renders; regenerate it with\n"+
			"  go test ./workloads/tensor -run TestAutocastPolicyDoc -update\nwant:\n%s", policyDoc, want)
	}
}
