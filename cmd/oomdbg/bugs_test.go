package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestBugsCommand: the table says, for the fixed loop and each bug, what oomdbg check says of a recording
// of it, and what the leak patterns are: the growing ones fail, the ones that hold memory pass and fail
// with --max-held 0, the fixed loop finds nothing. Each row's exit codes are those of oomdbg run and
// oomdbg check on the same configuration.
func TestBugsCommand(t *testing.T) {
	code, stdout, stderr := runCmd("bugs", "--markdown", "--steps", "6")
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(stdout, "\n") {
		if cells := strings.Split(strings.Trim(line, "| "), " | "); len(cells) == 8 && cells[0] != "bug" {
			rows[cells[0]] = cells
		}
	}
	type want struct {
		check, strict, verdict, amount, keeps, gradients string
	}
	wants := map[string]want{
		"none":              {"0 pass", "0 pass", "no leak", "0 B per iteration", "-", "-"},
		"eval-no-grad":      {"1 fail", "1 fail", "leak (retained autograd graph)", "+74.00 KiB per iteration", "eval_outputs[4]", "-"},
		"retain-graph":      {"1 fail", "1 fail", "leak (retained autograd graph)", "+75.50 KiB per iteration", "loss_history[4]", "-"},
		"stash-activations": {"1 fail", "1 fail", "leak (stashed outputs)", "+64.00 KiB per iteration", "activation_stash[8]", "-"},
		"tensor-loss-sum":   {"0 pass", "1 fail", "held across iterations", "512 B held", "total_loss", "-"},
		"no-zero-grad":      {"0 pass", "1 fail", "held across iterations", "85.50 KiB held", "net.0.weight > net.0.weight.grad", "never cleared, 85.50 KiB"},
		"module-attribute":  {"0 pass", "1 fail", "held across iterations", "66.00 KiB held", "net.0.intermediate", "-"},
	}
	if len(rows) != len(train.Bugs)+1 {
		t.Fatalf("%d rows, want the fixed loop and %d bugs:\n%s", len(rows), len(train.Bugs), stdout)
	}
	dir := t.TempDir()
	for bug, w := range wants {
		t.Run(bug, func(t *testing.T) {
			got := rows[bug]
			if got == nil {
				t.Fatalf("no row:\n%s", stdout)
			}
			if got[1] != train.DescribeBug(strings.TrimPrefix(bug, "none")) {
				t.Errorf("the loop %q", got[1])
			}
			if fmt.Sprint(got[2:]) != fmt.Sprint([]string{w.check, w.strict, w.verdict, w.amount, w.keeps, w.gradients}) {
				t.Errorf("row %q\nwant %q", got[2:], []string{w.check, w.strict, w.verdict, w.amount, w.keeps, w.gradients})
			}
			file := filepath.Join(dir, bug+".oomdbg")
			args := []string{"run", "--steps", "6", "-o", file}
			if bug != "none" {
				args = append(args, "--bug", bug)
			}
			// run ends with check's leak verdict, and exits 1 when check does.
			if code, _, stderr := runCmd(args...); code != map[string]int{"0 pass": exitOK, "1 fail": exitProblem}[got[2]] {
				t.Fatalf("run: exit %d, but check's cell is %s: %s", code, got[2], stderr)
			}
			for flags, cell := range map[string]string{"": got[2], "--max-held 0": got[3]} {
				code, out, _ := runCmd(append([]string{"check", file}, strings.Fields(flags)...)...)
				if want := map[string]int{"0 pass": exitOK, "1 fail": exitProblem}[cell]; code != want {
					t.Errorf("oomdbg check %s: exit %d, the table says %s:\n%s", flags, code, cell, out)
				}
			}
		})
	}
}

// TestREADMELeakPatterns: the README's leak-pattern tables are what the commands it names print.
func TestREADMELeakPatterns(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"bugs", "--markdown"}, {"bugs", "--preset", "tiny", "--markdown"}} {
		if !strings.Contains(string(readme), "`oomdbg "+strings.Join(args, " ")+"`") {
			t.Errorf("the README does not name oomdbg %s", strings.Join(args, " "))
		}
		code, stdout, stderr := runCmd(args...)
		if code != exitOK {
			t.Fatalf("oomdbg %s: exit %d: %s", strings.Join(args, " "), code, stderr)
		}
		_, table, _ := strings.Cut(stdout, "\n\n")
		if !strings.Contains(string(readme), table) {
			t.Errorf("the README lacks the table of oomdbg %s (regenerate it):\n%s", strings.Join(args, " "), table)
		}
	}
}
