package triage

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// rankReport is a report with what CompareRanks reads: a peak, its categories and scopes, an OOM or not.
func rankReport(rank int, peak int64, byCat map[string]int64, scopes []Share, oom bool) *Report {
	r := &Report{Source: Source{Workload: json.RawMessage(`{"parallel":{"gpus":4,"strategy":"zero2","rank":` + string(rune('0'+rank)) + `}}`)},
		Peak: Peak{Allocated: peak, Phase: "backward", Iteration: 1, Alive: Alive{ByCategory: byCat}}, scopes: scopes}
	if oom {
		r.OOM = &OOM{Phase: "optimizer", Iteration: 0}
	}
	return r
}

func TestCompareRanksNamesTheRankThatRunsOut(t *testing.T) {
	t.Parallel()
	cat := func(grad int64) map[string]int64 {
		return map[string]int64{"parameter": 100, "gradient": grad, "activation": 50}
	}
	reports := []*Report{
		rankReport(0, 1000, cat(10), []Share{{Name: "blocks.0", Bytes: 10}}, false),
		rankReport(1, 1200, cat(30), []Share{{Name: "blocks.0", Bytes: 30}}, false),
		rankReport(2, 1100, cat(20), nil, true),
		nil,
	}
	files := []string{"r0.oomdbg", "r1.oomdbg", "r2.oomdbg", "r3.oomdbg"}
	tab := CompareRanks(files, reports, []error{nil, nil, nil, errors.New("truncated")})
	if tab.Worst != 2 || !strings.Contains(tab.Why, "rank 2 ran out of memory in iteration 0, optimizer; 1 of 3 ranks did") {
		t.Errorf("worst %d: %s", tab.Worst, tab.Why)
	}
	if tab.Typical != 2 { // peaks 1000, 1100, 1200: the median is rank 2's
		t.Errorf("typical %d", tab.Typical)
	}
	if tab.Unreadable() != 1 || tab.Ranks[3].Error != "truncated" || tab.Ranks[3].Rank != -1 { // "r3" names no rank for sure
		t.Errorf("the unreadable file: %+v", tab.Ranks[3])
	}

	// Without an OOM the highest peak is the worst, compared with the median.
	reports[2].OOM = nil
	tab = CompareRanks(files[:3], reports[:3], make([]error, 3))
	if tab.Worst != 1 || tab.Typical != 2 {
		t.Fatalf("worst %d, typical %d", tab.Worst, tab.Typical)
	}
	if !strings.Contains(tab.Why, "rank 1 peaks highest") || !strings.Contains(tab.Why, "100 B more than the median rank (rank 2)") {
		t.Errorf("why: %s", tab.Why)
	}
	want := map[string]int64{"gradient": 10, "blocks.0": 30}
	if len(tab.Differences) != len(want) {
		t.Errorf("differences %+v, want %v", tab.Differences, want)
	}
	for _, d := range tab.Differences {
		if want[d.Name] != d.Delta() {
			t.Errorf("difference %s %+d, want %+d", d.Name, d.Delta(), want[d.Name])
		}
	}
	var text, md, js bytes.Buffer
	if err := tab.WriteText(&text); err != nil || !strings.Contains(text.String(), "*1") {
		t.Errorf("text: %v\n%s", err, text.String())
	}
	if err := tab.WriteMarkdown(&md); err != nil || !strings.Contains(md.String(), "| **1** |") {
		t.Errorf("markdown: %v\n%s", err, md.String())
	}
	if err := tab.WriteJSON(&js); err != nil || !json.Valid(js.Bytes()) || !strings.Contains(js.String(), `"format": "oomdbg-ranks/1"`) {
		t.Errorf("json: %v\n%s", err, js.String())
	}
}

func TestRankFromName(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]int{"snapshot_rank3.pickle": 3, "rank-12.oomdbg": 12, "dump_7.pickle": 7, "RANK_0.pkl": 0,
		"run.oomdbg": -1, "/a/b/memory.rank5.pickle": 5} {
		if got := rankFromName(name); got != want {
			t.Errorf("rankFromName(%q) = %d, want %d", name, got, want)
		}
	}
}
