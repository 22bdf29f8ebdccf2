package app

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/triage"
)

// job is what a snapshot's header says of the job it is a rank of: enough to tell two jobs apart.
type job struct {
	key  string // the same for every rank of one job; "" when the header does not tell
	what string // the job in a few words: "zero2 on 4 GPUs, recorded 2026-12-07 04:04:08"
}

// jobOf reads the job from a snapshot's metadata: its job identifier (oomdbg run --ranks writes one), else,
// for oomdbg's recordings, the training's configuration, which a job's ranks share: the workload less the
// rank and the card it ran on. PyTorch's snapshots say nothing of a job.
func jobOf(m snapshot.Meta) job {
	var w struct {
		Parallel map[string]json.RawMessage `json:"parallel"`
	}
	var j job
	if len(m.Workload) > 0 && json.Unmarshal(m.Workload, &w) == nil && w.Parallel != nil {
		var strategy string
		var gpus int
		json.Unmarshal(w.Parallel["strategy"], &strategy)
		json.Unmarshal(w.Parallel["gpus"], &gpus)
		j.what = fmt.Sprintf("%s on %d GPUs", strategy, gpus)
	}
	if !m.Created.IsZero() {
		j.what = strings.TrimPrefix(j.what+", recorded "+m.Created.Format("2006-01-02 15:04:05"), ", ")
	}
	switch {
	case m.Job != "":
		j.key = "job " + m.Job
	case m.Source == "oomdbg" && len(m.Workload) > 0:
		j.key = "workload " + workloadLessRank(m.Workload)
	}
	return j
}

// workloadLessRank is a workload configuration without its parallel.rank and its card (a rank may run on
// a card of its own), in a canonical form.
func workloadLessRank(workload json.RawMessage) string {
	var w map[string]any
	if json.Unmarshal(workload, &w) != nil {
		return string(workload)
	}
	if p, ok := w["parallel"].(map[string]any); ok {
		delete(p, "rank")
	}
	delete(w, "gpu_memory")
	delete(w, "context_reserve")
	delete(w, "device")
	var b bytes.Buffer
	json.NewEncoder(&b).Encode(w) // maps encode with sorted keys
	return b.String()
}

// jobWarnings says what makes a comparison of ranks doubtful: files of more than one job (told apart by
// their headers), and more than one file of a rank.
func jobWarnings(t *triage.RankTable, jobs []job) []string {
	var warnings []string
	var keys []string
	byKey := map[string][]string{}
	what := map[string]string{}
	for i, j := range jobs {
		if j.key == "" {
			continue
		}
		if _, seen := byKey[j.key]; !seen {
			keys = append(keys, j.key)
			what[j.key] = j.what
		}
		byKey[j.key] = append(byKey[j.key], t.Ranks[i].File)
	}
	if len(keys) > 1 {
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s (%s)", listFiles(byKey[k]), what[k]))
		}
		warnings = append(warnings, fmt.Sprintf("the files are of %d jobs: %s; compare the ranks of one job", len(keys), strings.Join(parts, "; ")))
	}
	byRank := map[int][]string{}
	var ranks []int
	for _, r := range t.Ranks {
		if r.Error != "" || r.Rank < 0 {
			continue
		}
		if len(byRank[r.Rank]) == 0 {
			ranks = append(ranks, r.Rank)
		}
		byRank[r.Rank] = append(byRank[r.Rank], r.File)
	}
	slices.Sort(ranks)
	for _, r := range ranks {
		if files := byRank[r]; len(files) > 1 {
			warnings = append(warnings, fmt.Sprintf("%d files are rank %d: %s", len(files), r, listFiles(files)))
		}
	}
	return warnings
}
