package leakstest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEExampleBuildsAndRuns takes the Go example of the README's leak checks as it is written, puts it
// in a module of its own that requires oomdbg (this checkout), and runs it with go test: it compiles as a
// user would paste it, and passes on the fixed loop.
func TestREADMEExampleBuildsAndRuns(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "Leak checks in Go tests")
	m := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(after)
	if !ok || m == nil {
		t.Fatal("the README has no Go example after \"Leak checks in Go tests\"")
	}
	example := m[1]
	mod := t.TempDir()
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(read("go.mod"))
	files := map[string]string{
		"go.mod": "module example.com/training\n\ngo " + string(goVersion[1]) + "\n\nrequire github.com/oomdbg/oomdbg v0.0.0\n\n" +
			"replace github.com/oomdbg/oomdbg => " + root + "\n",
		"go.sum":          string(read("go.sum")),
		"example_test.go": example,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(mod, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Everything it needs is in the module cache already: nothing is fetched.
	cmd := exec.Command("go", "test", "-count=1", "-run", "TestTrainingDoesNotLeak", "-v", ".")
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestTrainingDoesNotLeak") {
		t.Fatalf("the README's example, as written: %v\n%s\n%s", err, out, example)
	}
}
