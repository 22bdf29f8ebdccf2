package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"testing"

	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// rankFiles writes n copies of one recording, as the ranks of a job, and returns their paths.
func rankFiles(t *testing.T, n int) []string {
	t.Helper()
	dir := t.TempDir()
	_, data := record(t, dir, 3)
	files := make([]string, n)
	for i := range files {
		files[i] = filepath.Join(dir, fmt.Sprintf("job.rank%d.oomdbg", i))
		if err := os.WriteFile(files[i], data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

// TestRankTableMemoryDoesNotGrowWithTheRanks: a report of a job keeps, of each rank, what its row needs, so
// that the heap it holds when done grows by a few kilobytes a rank, not by a whole report (46 KB for these
// small recordings, 85 KB for a GPT's): 1,000 ranks under --max-memory 16MiB held 141 MB.
func TestRankTableMemoryDoesNotGrowWithTheRanks(t *testing.T) {
	var lim hostmem.Limit
	if err := lim.Set("64MiB"); err != nil {
		t.Fatal(err)
	}
	// gc collects twice: what sync.Pools (the decompressors') drop survives the first collection as their
	// victims, a megabyte or two that some runs hold and others do not.
	gc := func() { runtime.GC(); runtime.GC() }
	// held is the least heap a table of files holds over three tries: a try that a buffer outlives by chance
	// measures that buffer too, never less than the table.
	held := func(files []string) int64 {
		least := int64(math.MaxInt64)
		for range 3 {
			gc()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			tab, _ := ReportRanks(context.Background(), files, &lim, 0, leaks.DefaultWarmup)
			gc()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(tab)
			least = min(least, int64(after.HeapAlloc)-int64(before.HeapAlloc))
		}
		return least
	}
	few, many := rankFiles(t, 20), rankFiles(t, 220)
	held(few) // the first analysis allocates what every later one shares
	a, b := held(few), held(many)
	perRank := (b - a) / 200
	t.Logf("%d bytes held with 20 ranks, %d with 220: %d a rank", a, b, perRank)
	if perRank > 16<<10 {
		t.Errorf("the table holds %d bytes more for each rank; want a row's few kilobytes", perRank)
	}
}

// TestRankTableFromRowsIsTheWholeReports: the table built from what ForRanks keeps, with the two ranks it
// compares read whole, is the one whole reports give, row for row, down to the differences it lists.
func TestRankTableFromRowsIsTheWholeReports(t *testing.T) {
	files := rankFiles(t, 5)
	cfg := train.DefaultMLP() // rank 3 trains a wider model: the rank that differs
	cfg.Steps, cfg.Hidden = 3, 2*cfg.Hidden
	var stdout, stderr bytes.Buffer
	if err := Record(context.Background(), cfg, Recording{Path: files[3], Version: "test"}, &stdout, &stderr); err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	var lim hostmem.Limit
	if err := lim.Set("256MiB"); err != nil {
		t.Fatal(err)
	}
	whole := make([]*triage.Report, len(files))
	errs := make([]error, len(files))
	for i, f := range files {
		s, err := load.File(f)
		if err != nil {
			t.Fatal(err)
		}
		whole[i] = triage.Analyze(context.Background(), timeline.New(s), triage.Options{File: f,
			Leaks: []leaks.Option{leaks.Warmup(leaks.DefaultWarmup)}})
	}
	want := triage.CompareRanks(files, whole, errs)
	got, _ := ReportRanks(context.Background(), files, &lim, 0, leaks.DefaultWarmup)
	g, _ := json.Marshal(got.Ranks)
	w, _ := json.Marshal(want.Ranks)
	if !bytes.Equal(g, w) {
		t.Errorf("rows\n got %s\nwant %s", g, w)
	}
	if got.Worst != want.Worst || got.Typical != want.Typical || got.Why != want.Why || !reflect.DeepEqual(got.Differences, want.Differences) {
		t.Errorf("comparison\n got %d %d %q %+v\nwant %d %d %q %+v", got.Worst, got.Typical, got.Why, got.Differences,
			want.Worst, want.Typical, want.Why, want.Differences)
	}
	if len(want.Differences) == 0 {
		t.Error("the ranks compared do not differ: the test compares nothing")
	}
}
