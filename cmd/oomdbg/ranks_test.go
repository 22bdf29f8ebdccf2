package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

// tinyJob records the tiny GPT as a ZeRO-2 job of gpus ranks, every rank whose memory differs, into path
// (path's name with .rankN for each), and returns the files written.
func tinyJob(t *testing.T, gpus, path string) []string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCmd("run", "--preset", "tiny", "--steps", "2", "--gpus", gpus, "--dp", "zero2", "--ranks", "uneven", "-o", path)
	if code != exitOK {
		t.Fatalf("run --ranks uneven: exit %d: %s", code, stderr)
	}
	files, _ := filepath.Glob(strings.TrimSuffix(path, ".oomdbg") + ".rank*.oomdbg")
	return files
}

// TestRunRanksReplacesAnEarlierJob records a job of 4 ranks, then one of 2 into the same name: the earlier
// job's ranks 2 and 3 go (with a line that says so), so job.rank*.oomdbg names the new job's ranks alone. A
// rank's name that is not a regular file is in the way, and the job refuses to start.
func TestRunRanksReplacesAnEarlierJob(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "job.oomdbg")
	if got := tinyJob(t, "4", path); len(got) != 4 {
		t.Fatalf("the first job wrote %v, want 4 ranks", got)
	}
	code, _, stderr := runCmd("run", "--preset", "tiny", "--steps", "2", "--gpus", "2", "--dp", "zero2", "--ranks", "uneven", "-o", path)
	want := "oomdbg: removed " + filepath.Join(dir, "job.rank2.oomdbg") + ", " + filepath.Join(dir, "job.rank3.oomdbg") + ", the rank files of an earlier job\n"
	if code != exitOK || stderr != want {
		t.Fatalf("exit %d, stderr %q; want %q", code, stderr, want)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "job.rank*.oomdbg"))
	if len(files) != 2 {
		t.Fatalf("left %v, want the 2 ranks of the second job", files)
	}
	var jobs []string
	for _, f := range files {
		s, err := snapshot.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(s.Meta.Workload), `"gpus":2`) || s.Meta.Job == "" {
			t.Errorf("%s is not the second job's rank: job %q, %s", f, s.Meta.Job, s.Meta.Workload)
		}
		jobs = append(jobs, s.Meta.Job)
	}
	if jobs[0] != jobs[1] {
		t.Errorf("the ranks of one job carry the job identifiers %q", jobs)
	}
	if err := os.Symlink("elsewhere", filepath.Join(dir, "job.rank5.oomdbg")); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCmd("run", "--preset", "tiny", "--steps", "2", "--gpus", "2", "--dp", "zero2", "--ranks", "uneven", "-o", path)
	if code != exitUsage || !strings.Contains(stderr, "an earlier job's rank file is in the way: refusing to write "+filepath.Join(dir, "job.rank5.oomdbg")+": it is a symbolic link") {
		t.Errorf("a link under a rank's name: exit %d, stderr %q", code, stderr)
	}
}

// TestReportRanksOfTwoJobs reports files of two jobs together: the same configuration recorded twice, which
// only the job identifier in their headers tells apart, and a job of another strategy. The report warns,
// on stderr and in the table; the ranks of one job alone draw no warning.
func TestReportRanksOfTwoJobs(t *testing.T) {
	dir := t.TempDir()
	a := tinyJob(t, "2", filepath.Join(dir, "a", "job.oomdbg"))
	b := tinyJob(t, "2", filepath.Join(dir, "b", "job.oomdbg"))
	if code, _, stderr := runCmd("report", a[0], a[1]); code != exitOK || stderr != "" {
		t.Errorf("one job's ranks: exit %d, stderr %q", code, stderr)
	}
	code, stdout, stderr := runCmd("report", a[0], b[1])
	want := "the files are of 2 jobs: " + a[0] + " (zero2 on 2 GPUs, recorded "
	if code != exitOK || !strings.HasPrefix(stderr, "oomdbg: warning: "+want) || !strings.Contains(stdout, "\nwarning: "+want) {
		t.Errorf("two runs of one configuration: exit %d, stderr %q\n%s", code, stderr, stdout)
	}
	code, stdout, stderr = runCmd("report", a[0], a[1], b[1], "--format", "json")
	var tab struct{ Warnings []string }
	if code != exitOK || json.Unmarshal([]byte(stdout), &tab) != nil || len(tab.Warnings) != 2 ||
		!strings.HasPrefix(tab.Warnings[0], "the files are of 2 jobs: ") || tab.Warnings[1] != "2 files are rank 1: "+a[1]+", "+b[1] {
		t.Errorf("JSON warnings %q (exit %d, stderr %q)", tab.Warnings, code, stderr)
	}
}

// TestReportRanksCutShort reports a job one of whose rank files is cut short: its row says so, with the
// file's own warning, it is not counted among the ranks that did not run out of memory, and it is left
// out of the peaks compared.
func TestReportRanksCutShort(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for _, rank := range []string{"0", "1", "2"} {
		path := filepath.Join(dir, "job.rank"+rank+".oomdbg")
		code, _, stderr := runCmd("run", "--preset", "tiny", "--steps", "2", "--gpus", "3", "--dp", "zero2", "--optimizer", "adamw",
			"--rank", rank, "--gpu-mem", "30MiB", "--context-reserve", "1MiB", "-o", path)
		if code != exitProblem {
			t.Fatalf("rank %s: exit %d, want its OOM: %s", rank, code, stderr)
		}
		files = append(files, path)
	}
	data, err := os.ReadFile(files[2])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(files[2], data[:len(data)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	cut, err := snapshot.ReadFile(files[2])
	if err != nil || cut.Warning == nil || slices.ContainsFunc(cut.Events.Slice(0, cut.Events.Len()), func(e snapshot.Event) bool { return e.Action == snapshot.ActionOOM }) {
		t.Fatalf("the cut file: %v, warning %v; want one cut short before its OOM", err, cut.Warning)
	}
	code, stdout, stderr := runCmd("report", files[0], files[1], files[2], "--format", "json")
	var tab struct {
		Why   string
		Worst int
		Ranks []struct {
			OOM      bool
			CutShort string `json:"cut_short"`
		}
	}
	if json.Unmarshal([]byte(stdout), &tab) != nil || len(tab.Ranks) != 3 {
		t.Fatalf("exit %d: %s\n%s", code, stderr, stdout)
	}
	if code != exitProblem || stderr != "oomdbg: 2 of the 2 ranks read to the end ran out of memory ("+files[0]+", "+files[1]+")\n" {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
	if tab.Ranks[2].CutShort != cut.Warning.Error() || tab.Ranks[0].CutShort != "" || tab.Ranks[1].CutShort != "" {
		t.Errorf("cut_short %q, %q, %q; want the cut file's own warning %q on its row alone", tab.Ranks[0].CutShort,
			tab.Ranks[1].CutShort, tab.Ranks[2].CutShort, cut.Warning)
	}
	if !strings.HasSuffix(tab.Why, "; 2 of 2 ranks did, and rank 2's file is cut short before it could tell") || tab.Worst == 2 {
		t.Errorf("why %q (worst %d): want the complete ranks counted, and the cut one said to be cut short", tab.Why, tab.Worst)
	}
	if _, text, _ := runCmd("report", files[0], files[1], files[2]); !regexp.MustCompile(`  cut short +` + regexp.QuoteMeta(files[2]) + "\n").MatchString(text) {
		t.Errorf("the text table does not say the file is cut short:\n%s", text)
	}
}
