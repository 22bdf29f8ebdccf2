package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// publishedRow is a row of testdata/published.json: a measurement another project published, and the flags
// of oomdbg run that reproduce its configuration.
type publishedRow struct {
	Source        string  `json:"source"`
	URL           string  `json:"url"`
	Configuration string  `json:"configuration"`
	Statistic     string  `json:"statistic"` // peak or context
	GiB           float64 `json:"gib"`       // context: the card
	Published     float64 `json:"published"`
	Flags         string  `json:"flags"`
	Explanation   string  `json:"explanation"`
}

// runPublished runs the row's flags (plus more) on the meta device and returns the result.
func runPublished(t *testing.T, flags string, more ...string) *train.Result {
	t.Helper()
	args := append(strings.Fields(flags), more...)
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	f := addConfigFlags(fs, train.DefaultMLP()).addHFConfig()
	if err := fs.Parse(args); err != nil {
		t.Fatalf("run %s: %v", strings.Join(args, " "), err)
	}
	cfg, err := f.config()
	if err != nil {
		t.Fatalf("run %s: %v", strings.Join(args, " "), err)
	}
	res, _, err := train.Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("run %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// reservedLine fits a line, least squares, through the peak reserved memory of the flags' run at 2,048 to
// 32,768 tokens in steps of 2,048, on a card large enough for the allocator to keep what it caches: bytes at
// no tokens and bytes a token. The published context lengths are such a line read at each card's size (they
// grow by the same 404.7 tokens a GB from 16 to 80 GB, which no search of real OOMs gives: near the limit the
// caching allocator's fragmentation makes the boundary step back and forth), so oomdbg's are read off its
// own line the same way.
func reservedLine(t *testing.T, flags string) (intercept, slope float64) {
	t.Helper()
	var n, sx, sy, sxx, sxy float64
	for seq := 2048; seq <= 32768; seq += 2048 {
		res := runPublished(t, flags, "--seq", fmt.Sprint(seq), "--gpu-mem", "200GiB")
		if res.OOM != nil {
			t.Fatalf("%d tokens ran out of 200 GiB", seq)
		}
		x, y := float64(seq), float64(res.PeakReserved)
		n, sx, sy, sxx, sxy = n+1, sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	slope = (n*sxy - sx*sy) / (n*sxx - sx*sx)
	return (sy - slope*sx) / n, slope
}

// TestPublishedMeasurements recomputes docs/finetuning.md's table of published measurements from the frozen
// inputs of testdata/published.json: each row's oomdbg figure and its error, none beyond 15%, any beyond 10%
// explained in the row; the table in docs/finetuning.md is what this prints.
func TestPublishedMeasurements(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Llama 7B and 8B at up to 30,000 tokens")
	}
	data, err := os.ReadFile(filepath.Join("testdata", "published.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Rows []publishedRow `json:"rows"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var lines []string
	lineOf := map[string][2]float64{} // by flags: reservedLine's intercept and slope
	for _, r := range doc.Rows {
		var got float64
		var cells [3]string
		switch r.Statistic {
		case "peak":
			res := runPublished(t, r.Flags)
			if res.OOM != nil {
				t.Fatalf("%s: OOM", r.Configuration)
			}
			got = float64(res.PeakAllocated) / 1e9
			cells = [3]string{"max_memory_allocated", fmt.Sprintf("%.2f GB", r.Published), fmt.Sprintf("%.2f GB", got)}
		case "context":
			l, ok := lineOf[r.Flags]
			if !ok {
				a, b := reservedLine(t, r.Flags)
				l = [2]float64{a, b}
				lineOf[r.Flags] = l
				t.Logf("peak reserved: %.3f GiB + %.4f MiB a token", a/(1<<30), b/(1<<20))
			}
			got = math.Floor((r.GiB*(1<<30) - l[0]) / l[1])
			cells = [3]string{fmt.Sprintf("longest context: peak max_memory_reserved at most %g GiB", r.GiB),
				fmt.Sprintf("%.0f", r.Published), fmt.Sprintf("%.0f", got)}
		default:
			t.Fatalf("unknown statistic %q", r.Statistic)
		}
		e := got/r.Published - 1
		switch {
		case math.Abs(e) > 0.15:
			t.Errorf("%s (%s): oomdbg %.4g, published %.4g: %+.1f%%, beyond 15%%", r.Configuration, cells[0], got, r.Published, 100*e)
		case math.Abs(e) > 0.10 && r.Explanation == "":
			t.Errorf("%s (%s): %+.1f%% with no explanation", r.Configuration, cells[0], 100*e)
		case math.Abs(e) <= 0.10 && r.Explanation != "":
			t.Errorf("%s (%s): %+.1f%%, within 10%%, still explained: drop the explanation", r.Configuration, cells[0], 100*e)
		}
		lines = append(lines, fmt.Sprintf("| [%s](%s) | %s | %s | %s | %s | %+.1f%% |", r.Source, r.URL, r.Configuration,
			cells[0], cells[1], cells[2], 100*e))
	}
	table := strings.Join(lines, "\n")
	t.Logf("the table:\n%s", table)
	docs, err := os.ReadFile(filepath.Join("..", "..", "docs", "finetuning.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(docs), table) {
		t.Errorf("docs/finetuning.md lacks the table this test computes (regenerate it from the log)")
	}
}
