package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestREADMEFamilies: the README's tables of Mixtral-8x7B on one and on eight 80 GiB cards and of Gemma-3-12B
// on 24 GiB, and the plans fit finds for it, are what the commands it names print. (Qwen3-30B-A3B's tables,
// of the same commands, take minutes: LoRA on its 18,432 experts' projections.)
func TestREADMEFamilies(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"fixes", "--preset", "mixtral-8x7b", "--gpu-mem", "80GiB", "--markdown"},
		{"fixes", "--preset", "mixtral-8x7b", "--gpu-mem", "80GiB", "--gpus", "8", "--checkpoint", "all", "--markdown"},
		{"fixes", "--preset", "gemma-3-12b", "--markdown"},
		{"fit", "--preset", "gemma-3-12b", "--allow", "lora,qlora"},
	} {
		name := strings.Join(args, " ")
		if !strings.Contains(string(readme), "`oomdbg "+name+"`") {
			t.Errorf("the README does not name oomdbg %s", name)
		}
		code, stdout, stderr := runCmd(args...)
		if code != exitOK {
			t.Fatalf("oomdbg %s: exit %d: %s", name, code, stderr)
		}
		var rows []string
		for _, l := range strings.Split(stdout, "\n") {
			if strings.HasPrefix(l, "|") || args[0] == "fit" && (strings.HasPrefix(l, "1  ") || strings.HasPrefix(l, "2  ")) {
				rows = append(rows, l)
			}
		}
		if len(rows) == 0 || !strings.Contains(string(readme), strings.Join(rows, "\n")) {
			t.Errorf("the README lacks the table of oomdbg %s (regenerate it):\n%s", name, strings.Join(rows, "\n"))
		}
	}
}
