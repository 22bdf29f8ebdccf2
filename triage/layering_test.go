package triage_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestLayering checks the analysis packages' dependencies (DESIGN.md §2): the snapshot package needs only
// the standard library and zstd; leaks and triage build on it and never import the TUI libraries or the
// workload runtime (fixes are measured through a Measurer the command line provides).
func TestLayering(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	tests := map[string]struct {
		pkg     string
		allowed []string // packages it may use; one ending in "/" allows every package under it
	}{
		"snapshot": {"github.com/oomdbg/oomdbg/snapshot", []string{"github.com/klauspost/compress", "github.com/klauspost/compress/"}},
		"leaks":    {"github.com/oomdbg/oomdbg/leaks", []string{"github.com/oomdbg/oomdbg/snapshot", "github.com/oomdbg/oomdbg/internal/units", "github.com/klauspost/compress", "github.com/klauspost/compress/"}},
		"triage": {"github.com/oomdbg/oomdbg/triage", []string{"github.com/oomdbg/oomdbg/snapshot", "github.com/oomdbg/oomdbg/leaks",
			"github.com/oomdbg/oomdbg/internal/units", "github.com/klauspost/compress", "github.com/klauspost/compress/"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", tc.pkg).Output()
			if err != nil {
				t.Skipf("go list: %v", err)
			}
			for _, dep := range strings.Fields(string(out)) {
				if dep == tc.pkg {
					continue
				}
				ok := false
				for _, p := range tc.allowed {
					ok = ok || dep == p || strings.HasSuffix(p, "/") && strings.HasPrefix(dep, p)
				}
				if !ok {
					t.Errorf("%s imports %s", tc.pkg, dep)
				}
			}
		})
	}
}
