package triage_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/oomdbg/oomdbg/"

// layers lists, for every package of the module, the packages of the module it may depend on, directly or
// not (a name ending in "/" allows the tree under it). It is the table of README.md's "What is here" read
// as rules: data (snapshot) at the bottom, analysis (leaks, triage) on it, the workload runtime beside
// them, the TUI and the command line on top. A package missing here fails the test until it is placed.
var layers = map[string][]string{
	"internal/addrmap":           nil,
	"internal/cputime":           nil,
	"internal/nvmlib":            nil,
	"internal/optimrules":        nil,
	"internal/periodic":          nil,
	"internal/nvmlib/nvmlibtest": {"internal/nvmlib"},
	"internal/pickle":            nil,
	"internal/torchrules":        nil,
	"internal/torchtest":         nil,
	"internal/units":             nil,
	"internal/words":             nil,
	"snapshot":                   {"internal/torchrules"},
	"snapshot/timeline":          {"snapshot", "internal/addrmap", "internal/torchrules"},
	"snapshot/torch":             {"snapshot", "internal/pickle", "internal/periodic", "internal/torchrules"},
	"snapshot/load":              {"snapshot", "snapshot/torch", "internal/pickle", "internal/periodic", "internal/torchrules", "internal/units"},
	"snapshot/export":            {"snapshot", "snapshot/timeline", "internal/addrmap", "internal/torchrules", "internal/units"},
	"snapshot/snapshottest":      {"snapshot", "internal/torchrules"},
	"snapshot/transform":         {"snapshot", "internal/"},
	"tracer":                     {"snapshot", "internal/torchrules"},
	"tracer/nvml":                {"internal/nvmlib", "internal/units"},
	"leaks":                      {"snapshot", "snapshot/timeline", "internal/addrmap", "internal/torchrules", "internal/units"},
	"triage":                     {"snapshot", "snapshot/timeline", "leaks", "internal/addrmap", "internal/torchrules", "internal/units"},
	"workloads/alloc":            {"internal/torchrules"},
	"workloads/alloc/replay":     {"workloads/alloc", "snapshot", "snapshot/torch", "internal/"},
	// A fix on a trace: the trace transformed, then replayed.
	"workloads/alloc/replay/whatif": {"workloads/alloc/replay", "workloads/alloc", "snapshot/transform", "snapshot",
		"snapshot/torch", "internal/"},
	"workloads/device": {"workloads/alloc", "internal/torchrules"},
	// The runtime tags what it allocates with snapshot's vocabulary (phases, categories).
	"workloads/tensor": {"workloads/device", "workloads/alloc", "snapshot", "internal/torchrules"},
	"workloads/nn":     {"workloads/tensor", "workloads/device", "workloads/alloc", "snapshot", "internal/torchrules"},
	"workloads/optim":  {"workloads/nn", "workloads/tensor", "workloads/device", "workloads/alloc", "snapshot", "internal/optimrules", "internal/torchrules"},
	// A data-parallel rank wraps a model's parameters, gradients and optimizer.
	"workloads/dist":  {"workloads/nn", "workloads/optim", "workloads/tensor", "workloads/device", "workloads/alloc", "snapshot", "internal/"},
	"workloads/train": {"workloads/", "tracer", "snapshot", "internal/"},
	"leaks/leakstest": {"leaks", "workloads/", "tracer", "snapshot", "snapshot/timeline", "internal/"},
	"tui":             {"snapshot/", "snapshot", "triage", "leaks", "tracer", "tracer/nvml", "internal/", "workloads/"},
	// The planner drives the training workload on the meta device.
	"fit":        {"workloads/", "tracer", "snapshot", "internal/"},
	"cmd/oomdbg": {""},
	// A config.json reader: a workload's shape, nothing of the runtime.
	"workloads/nn/hfconfig": nil,
	// oomdbg record: runs a job and lists its dumps; what they hold is snapshot/torch's to read.
	"recorder": nil,
}

// presentation lists the libraries only the TUI and the command line may use.
var presentation = []string{"charm.land/", "github.com/charmbracelet/", "github.com/NimbleMarkets/", "github.com/spf13/"}

// TestLayering checks every package's dependencies against layers: no package reaches up or sideways, the
// analysis and data packages never use the TUI libraries, and snapshot needs nothing beyond the standard
// library, zstd and the allocator's rules.
func TestLayering(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err) // the check must run: a layering test that skips checks nothing
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		deps := strings.Fields(line)
		pkg, ok := strings.CutPrefix(deps[0], module)
		if !ok {
			t.Fatalf("go list printed %q", line)
		}
		allowed, ok := layers[pkg]
		if !ok {
			t.Errorf("package %s has no place in the layers table", pkg)
			continue
		}
		seen++
		for _, dep := range deps[1:] {
			if std := !strings.Contains(strings.SplitN(dep, "/", 2)[0], "."); std {
				continue
			}
			if own, ok := strings.CutPrefix(dep, module); ok {
				if !allows(allowed, own) {
					t.Errorf("%s depends on %s", pkg, own)
				}
				continue
			}
			if pkg == "snapshot" && !strings.HasPrefix(dep, "github.com/klauspost/compress") {
				t.Errorf("snapshot depends on %s: it may use only the standard library and zstd", dep)
			}
			if pkg != "tui" && pkg != "cmd/oomdbg" && allows(presentation, dep) {
				t.Errorf("%s depends on %s, a presentation library", pkg, dep)
			}
		}
	}
	if seen < len(layers) {
		t.Errorf("go list reported %d of the %d packages in the layers table", seen, len(layers))
	}
}

func allows(allowed []string, dep string) bool {
	for _, p := range allowed {
		if dep == p || strings.HasSuffix(p, "/") && strings.HasPrefix(dep, p) || p == "" {
			return true
		}
	}
	return false
}
