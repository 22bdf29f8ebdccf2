package triage

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/internal/units"
)

// The ranks of a data-parallel job side by side: each rank's snapshot (oomdbg's, or the per-rank dumps of
// a PyTorch job) reported alone, then compared.

// jobRank is what a recording says of the job it is a rank of (oomdbg's workload configuration), read
// without the runtime's types.
type jobRank struct {
	GPUs     int    `json:"gpus"`
	Strategy string `json:"strategy"`
	Rank     int    `json:"rank"`
	Offload  string `json:"offload"`
	// TP, PP and CP are the model's split (0: none), from the workload's "split".
	TP, PP, CP int `json:"-"`
}

// rankOf returns the job a recorded workload is a rank of; ok is false for a single GPU or an imported
// snapshot.
func rankOf(workload json.RawMessage) (jobRank, bool) {
	var w struct {
		Parallel *jobRank `json:"parallel"`
		Split    struct {
			TP int `json:"tp"`
			PP int `json:"pp"`
			CP int `json:"cp"`
		} `json:"split"`
	}
	if len(workload) == 0 || json.Unmarshal(workload, &w) != nil || w.Parallel == nil || w.Parallel.Strategy == "" || w.Parallel.Strategy == "none" {
		return jobRank{}, false
	}
	jr := *w.Parallel
	jr.TP, jr.PP, jr.CP = w.Split.TP, w.Split.PP, w.Split.CP
	return jr, true
}

// place says where the rank sits in a split job, as Megatron orders the ranks (TP innermost, then CP, DP
// and PP): its pipeline stage and its tensor- and context-parallel ranks, each where there are several
// ("stage 2 of 8, cp rank 1 of 4"; short, "s2 c1"); "" for a job that splits nothing or sizes that do not
// divide its GPUs.
func (j jobRank) place(short bool) string {
	tp, pp, cp, world := max(j.TP, 1), max(j.PP, 1), max(j.CP, 1), max(j.GPUs, 1)
	if tp*pp*cp == 1 || world%(tp*pp*cp) != 0 {
		return ""
	}
	var parts []string
	add := func(long, abbr string, i, n int) {
		if n < 2 {
			return
		}
		if short {
			parts = append(parts, fmt.Sprintf("%s%d", abbr, i))
		} else {
			parts = append(parts, fmt.Sprintf("%s %d of %d", long, i, n))
		}
	}
	add("stage", "s", j.Rank/(world/pp), pp)
	add("tp rank", "t", j.Rank%tp, tp)
	add("cp rank", "c", j.Rank/tp%cp, cp)
	if short {
		return strings.Join(parts, " ")
	}
	return strings.Join(parts, ", ")
}

// rankInName finds a rank in a file name as launchers write them: rank3, rank_3, rank-3, or a trailing
// number (snapshot_3.pickle).
var rankInName = regexp.MustCompile(`(?i)(?:rank[_-]?(\d+))|(?:[_-](\d+)$)`)

func rankFromName(file string) int {
	base := strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	m := rankInName.FindStringSubmatch(base)
	if m == nil {
		return -1
	}
	for _, g := range m[1:] {
		if n, err := strconv.Atoi(g); err == nil {
			return n
		}
	}
	return -1
}

// RankRow is one rank's line of a RankTable.
type RankRow struct {
	File string `json:"file"`
	// Rank is the rank the recording says it is, or the number in the file's name; -1 when neither tells.
	Rank int `json:"rank"`
	// Place is where the rank sits in a split job (its pipeline stage, its TP and CP ranks); "" otherwise.
	// ShortPlace says it in a few characters, for a narrow column.
	Place         string `json:"place"`
	ShortPlace    string `json:"-"`
	PeakAllocated int64  `json:"peak_allocated"`
	PeakPhase     string `json:"peak_phase"`
	PeakIteration int32  `json:"peak_iteration"`
	PeakReserved  int64  `json:"peak_reserved"`
	OOM           bool   `json:"oom"`
	OOMPhase      string `json:"oom_phase"`
	OOMIteration  int32  `json:"oom_iteration"`
	ModelStates   int64  `json:"model_states"`
	Activations   int64  `json:"activations_at_peak"`
	HostAllocated int64  `json:"host_peak_allocated"`
	Capacity      int64  `json:"capacity"`
	Error         string `json:"error"` // a file that could not be read; its figures are zero
	// CutShort says where the file was cut short (a rank killed, or still writing): its figures are those
	// of what it holds, and its OOM, if it had one later, is not among them. "" for a complete file.
	CutShort string `json:"cut_short"`
	report   *Report
}

// RankTable compares the ranks of a job.
type RankTable struct {
	Format string    `json:"format"`
	Ranks  []RankRow `json:"ranks"`
	// Worst is the index in Ranks of the rank that ran out of memory first (the lowest rank among those that
	// did), else of the one whose peak is highest; Typical the rank of the median peak, what Worst is
	// compared with. -1 without readable ranks.
	Worst   int `json:"worst"`
	Typical int `json:"typical"`
	// Why says in a line why Worst is the worst, and Differences what differs between it and Typical at
	// their peaks: categories and module scopes, largest first.
	Why         string   `json:"why"`
	Differences []Change `json:"differences"`
	// Warnings say what makes the comparison doubtful: files of more than one job, two files of one rank.
	Warnings []string `json:"warnings"`
}

// RankFormat is the JSON format name of a RankTable.
const RankFormat = "oomdbg-ranks/1"

// CompareRanks puts the reports of a job's ranks side by side. reports[i] is files[i]'s, or nil when errs[i]
// says why it could not be read.
func CompareRanks(files []string, reports []*Report, errs []error) *RankTable {
	t := &RankTable{Format: RankFormat, Worst: -1, Typical: -1, Differences: []Change{}, Warnings: []string{}}
	for i, f := range files {
		row := RankRow{File: f, Rank: rankFromName(f), report: reports[i]}
		if errs[i] != nil || reports[i] == nil {
			row.Error = fmt.Sprint(errs[i])
			t.Ranks = append(t.Ranks, row)
			continue
		}
		r := reports[i]
		if jr, ok := rankOf(r.Source.Workload); ok {
			row.Rank, row.Place, row.ShortPlace = jr.Rank, jr.place(false), jr.place(true)
		}
		if !r.Source.Complete && r.Source.Warning != "" {
			row.CutShort = r.Source.Warning
		}
		row.PeakAllocated, row.PeakPhase, row.PeakIteration = r.Peak.Allocated, r.Peak.Phase, r.Peak.Iteration
		row.PeakReserved, row.ModelStates, row.Activations = r.Peak.Reserved, r.ModelStates.Bytes, r.Peak.ByCategory["activation"]
		if r.OOM != nil {
			row.OOM, row.OOMPhase, row.OOMIteration = true, r.OOM.Phase, r.OOM.Iteration
		}
		if r.Host != nil {
			row.HostAllocated = r.Host.PeakAllocated
		}
		for _, d := range r.Devices {
			if d.Index == 0 {
				row.Capacity = d.Capacity
			}
		}
		t.Ranks = append(t.Ranks, row)
	}
	// The peaks compared are those of complete files: a file cut short holds part of its rank's run. A file
	// cut short that ran out of memory has told what matters most, and counts among the ranks that did.
	var ok, cut, complete []int
	for i, r := range t.Ranks {
		switch {
		case r.Error != "":
		case r.CutShort != "" && !r.OOM:
			cut = append(cut, i)
		default:
			complete = append(complete, i)
		}
		if r.Error == "" {
			ok = append(ok, i)
		}
	}
	if len(ok) == 0 {
		return t
	}
	if len(complete) > 0 {
		ok = complete
	}
	byPeak := slices.Clone(ok)
	slices.SortStableFunc(byPeak, func(a, b int) int { return cmp.Compare(t.Ranks[a].PeakAllocated, t.Ranks[b].PeakAllocated) })
	t.Typical = byPeak[len(byPeak)/2]
	t.Worst = byPeak[len(byPeak)-1]
	for _, i := range byPeak { // of ranks tied at the highest peak, the first
		if t.Ranks[i].PeakAllocated == t.Ranks[t.Worst].PeakAllocated {
			t.Worst = i
			break
		}
	}
	var ooms []int
	for _, i := range ok {
		if t.Ranks[i].OOM {
			ooms = append(ooms, i)
		}
	}
	w := &t.Ranks[t.Worst]
	switch {
	case len(ooms) > 0:
		t.Worst = slices.MinFunc(ooms, func(a, b int) int { return cmp.Compare(t.Ranks[a].Rank, t.Ranks[b].Rank) })
		w = &t.Ranks[t.Worst]
		t.Why = fmt.Sprintf("%s ran out of memory in %s; %d of %d ranks did", w.name(), where(w.OOMIteration, w.OOMPhase), len(ooms), len(ok))
		if len(cut) > 0 && len(complete) > 0 {
			t.Why += fmt.Sprintf(", and %s cut short before %s could tell", t.names(cut), map[bool]string{true: "it", false: "they"}[len(cut) == 1])
		}
	case len(cut) > 0 && len(complete) > 0:
		t.Why = fmt.Sprintf("%s peaks highest of the complete files, at %s in %s; %s cut short", w.name(), units.FormatSize(w.PeakAllocated),
			where(w.PeakIteration, w.PeakPhase), t.names(cut))
	case len(ok) == 1:
		t.Why = fmt.Sprintf("%s is the only rank read", w.name())
	case w.PeakAllocated == t.Ranks[t.Typical].PeakAllocated && t.Ranks[byPeak[0]].PeakAllocated == w.PeakAllocated:
		t.Why = fmt.Sprintf("every rank peaks at %s, in %s", units.FormatSize(w.PeakAllocated), where(w.PeakIteration, w.PeakPhase))
		t.Typical = t.Worst
	default:
		ty := t.Ranks[t.Typical]
		t.Why = fmt.Sprintf("%s peaks highest, at %s in %s: %s more than the median rank (%s)", w.name(), units.FormatSize(w.PeakAllocated),
			where(w.PeakIteration, w.PeakPhase), units.FormatSize(w.PeakAllocated-ty.PeakAllocated), ty.name())
	}
	if t.Worst != t.Typical {
		d := Diff(t.Ranks[t.Typical].report, w.report)
		for _, c := range append(d.Categories, d.Scopes...) {
			if c.Delta() != 0 {
				t.Differences = append(t.Differences, c)
			}
		}
		slices.SortStableFunc(t.Differences, func(a, b Change) int { return cmp.Compare(abs(b.Delta()), abs(a.Delta())) })
		t.Differences = t.Differences[:min(len(t.Differences), 8)]
	}
	return t
}

// Unreadable returns how many files could not be read.
func (t *RankTable) Unreadable() int {
	n := 0
	for _, r := range t.Ranks {
		if r.Error != "" {
			n++
		}
	}
	return n
}

// names names the ranks of the rows at indices is, whose files were cut short: "rank 3's file is", "the files of ranks 3 and
// 5 are".
func (t *RankTable) names(is []int) string {
	if len(is) == 1 {
		return t.Ranks[is[0]].name() + "'s file is"
	}
	var names []string
	for _, i := range is {
		names = append(names, t.Ranks[i].name())
	}
	return "the files of " + strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1] + " are"
}

// name says which rank a row is.
func (r RankRow) name() string {
	if r.Rank >= 0 && r.Place != "" {
		return fmt.Sprintf("rank %d (%s)", r.Rank, r.Place)
	}
	if r.Rank >= 0 {
		return fmt.Sprintf("rank %d", r.Rank)
	}
	return filepath.Base(r.File)
}

// WriteText writes the table for a terminal.
func (t *RankTable) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	tw := newTable("  ", "rank", ">peak", "at", ">reserved", ">model states", ">activations", ">host", "OOM", "file")
	for i, r := range t.Ranks {
		mark := " "
		if i == t.Worst {
			mark = "*"
		}
		if r.Error != "" {
			tw.row(mark+r.rankCell(), "-", "unreadable", "", "", "", "", "", r.File+": "+r.Error)
			continue
		}
		tw.row(mark+r.rankCell(), units.FormatSize(r.PeakAllocated), where(r.PeakIteration, r.PeakPhase), units.FormatSize(r.PeakReserved),
			units.FormatSize(r.ModelStates), units.FormatSize(r.Activations), hostCell(r.HostAllocated), r.oomCell(), r.File)
	}
	tw.write(ew)
	if t.Why != "" {
		fmt.Fprintf(ew, "\n* %s\n", t.Why)
	}
	if len(t.Differences) > 0 {
		fmt.Fprintf(ew, "  at its peak, against %s's:\n", t.Ranks[t.Typical].name())
		for _, c := range t.Differences {
			fmt.Fprintf(ew, "    %+12s  %s\n", signed(c.Delta()), c.Name)
		}
	}
	for _, warning := range t.Warnings {
		fmt.Fprintf(ew, "\nwarning: %s\n", warning)
	}
	return ew.err
}

// WriteMarkdown writes the table as markdown.
func (t *RankTable) WriteMarkdown(w io.Writer) error {
	ew := &errWriter{w: w}
	var rows [][]string
	for i, r := range t.Ranks {
		name := r.rankCell()
		if i == t.Worst {
			name = "**" + name + "**"
		}
		if r.Error != "" {
			rows = append(rows, []string{name, "unreadable", "", "", "", "", "", "", cell(r.File + ": " + r.Error)})
			continue
		}
		rows = append(rows, []string{name, units.FormatSize(r.PeakAllocated), where(r.PeakIteration, r.PeakPhase), units.FormatSize(r.PeakReserved),
			units.FormatSize(r.ModelStates), units.FormatSize(r.Activations), hostCell(r.HostAllocated), r.oomCell(), code(r.File)})
	}
	mdTable(ew, []string{"rank", ">peak", "at", ">reserved", ">model states", ">activations", ">host", "OOM", "file"}, rows)
	if t.Why != "" {
		fmt.Fprintf(ew, "\n%s.\n", upperFirst(t.Why))
	}
	for _, c := range t.Differences {
		fmt.Fprintf(ew, "- %s %s\n", signed(c.Delta()), cell(c.Name))
	}
	for _, warning := range t.Warnings {
		fmt.Fprintf(ew, "\n**Warning:** %s\n", warning)
	}
	return ew.err
}

// WriteJSON writes the table as JSON ("oomdbg-ranks/1").
func (t *RankTable) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(t)
}

func (r RankRow) rankCell() string {
	if r.Rank >= 0 && r.Place != "" {
		return strconv.Itoa(r.Rank) + " (" + r.Place + ")"
	}
	if r.Rank >= 0 {
		return strconv.Itoa(r.Rank)
	}
	return "?"
}

func (r RankRow) oomCell() string {
	switch {
	case !r.OOM && r.CutShort != "":
		return "cut short"
	case !r.OOM:
		return "-"
	}
	return where(r.OOMIteration, r.OOMPhase)
}

func hostCell(b int64) string {
	if b == 0 {
		return "-"
	}
	return units.FormatSize(b)
}

func signed(b int64) string {
	if b >= 0 {
		return "+" + units.FormatSize(b)
	}
	return "-" + units.FormatSize(-b)
}
