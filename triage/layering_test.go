package triage_test

import (
	"os/exec"
	"slices"
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
	// The rule by which a run fits a device, and the margin it keeps: every verdict's.
	"internal/headroom": {"internal/units"},
	"internal/table":    nil,
	// Where run and export write: it asks whether a file is a terminal (x/term, below).
	"internal/outfile": nil,
	// --max-memory: what this machine gives a command, as a load budget.
	"internal/hostmem": {"snapshot/load", "snapshot", "snapshot/torch", "internal/"},
	// The words of the knobs a user turns, spoken by every layer.
	"knob": {"internal/words"},
	// The library versions a run assumes and what each release changed, consulted by the runtime.
	"versions":                 nil,
	"versions/internal/gendoc": {"versions"},
	"snapshot":                 {"internal/torchrules"},
	"snapshot/timeline":        {"snapshot", "internal/addrmap", "internal/torchrules"},
	"snapshot/torch":           {"snapshot", "internal/pickle", "internal/periodic", "internal/torchrules"},
	"snapshot/load":            {"snapshot", "snapshot/torch", "internal/pickle", "internal/periodic", "internal/torchrules", "internal/units"},
	"snapshot/export":          {"knob", "snapshot", "snapshot/timeline", "internal/"},
	"snapshot/snapshottest":    {"snapshot", "internal/torchrules"},
	"tracer":                   {"snapshot", "internal/torchrules"},
	"tracer/nvml":              {"internal/nvmlib", "internal/units"},
	"leaks":                    {"snapshot", "snapshot/timeline", "internal/addrmap", "internal/torchrules", "internal/units"},
	"triage":                   {"snapshot", "snapshot/timeline", "leaks", "internal/addrmap", "internal/headroom", "internal/torchrules", "internal/units"},
	"allocator":                {"internal/torchrules"},
	"allocator/replay":         {"allocator", "snapshot", "snapshot/torch", "internal/"},
	// A fix on a trace: the trace transformed, then replayed.
	"whatif/transform": {"knob", "snapshot", "internal/"},
	"whatif":           {"knob", "whatif/transform", "allocator/replay", "allocator", "snapshot", "snapshot/torch", "internal/"},
	// The simulated PyTorch: the package itself holds only its documentation.
	"workloads":        nil,
	"workloads/device": {"allocator", "internal/torchrules"},
	// The runtime tags what it allocates with snapshot's vocabulary (phases, categories).
	"workloads/tensor": {"versions", "workloads/device", "allocator", "snapshot", "internal/torchrules"},
	"workloads/nn":     {"versions", "workloads/tensor", "workloads/device", "allocator", "snapshot", "internal/torchrules"},
	"workloads/optim":  {"knob", "versions", "workloads/nn", "workloads/tensor", "workloads/device", "allocator", "snapshot", "internal/"},
	// A data-parallel rank wraps a model's parameters, gradients and optimizer.
	"workloads/dist": {"knob", "versions", "workloads/nn", "workloads/optim", "workloads/tensor", "workloads/device", "allocator", "snapshot", "internal/"},
	// Model-parallel layouts (TP, SP, PP, CP) as formulas on shapes: nothing of the runtime.
	"workloads/dist/layout": nil,
	"workloads/train":       {"knob", "versions", "workloads/", "allocator", "tracer", "snapshot", "internal/"},
	// The trainers' configuration files (torchtune, LitGPT, axolotl, TrainingArguments) read into a run.
	"workloads/train/frameworks": {"knob", "versions", "workloads/", "allocator", "tracer", "snapshot", "internal/"},
	"leaks/leakstest":            {"knob", "versions", "leaks", "workloads/", "allocator", "tracer", "snapshot", "snapshot/timeline", "internal/"},
	"tui":                        {"knob", "versions", "snapshot/", "snapshot", "triage", "leaks", "tracer", "tracer/nvml", "internal/", "workloads/", "allocator/", "allocator", "whatif/", "whatif"},
	// Drives the TUI's model in tests, as a user types.
	"tui/tuitest": {"tui", "knob", "versions", "snapshot/", "snapshot", "triage", "leaks", "tracer", "tracer/nvml", "internal/", "workloads/", "allocator/", "allocator", "whatif/", "whatif"},
	// The planner drives the training workload on the meta device.
	"fit": {"knob", "versions", "workloads/", "allocator", "tracer", "snapshot", "internal/"},
	// The search of a job's model-parallel layouts: layout's formulas judged by the headroom rule and
	// ranked with the planner's GPU peaks.
	"fit/layouts": {"fit", "knob", "versions", "workloads/", "allocator", "tracer", "snapshot", "internal/"},
	// The runtime behind the TUI and the report: it serves the TUI's Backend and triage's Measurer and
	// Replayer with the workloads, the planner and the allocator's replay.
	"internal/backend": {"tui", "fit", "triage", "leaks", "knob", "versions", "snapshot", "snapshot/", "tracer", "tracer/", "workloads/",
		"allocator", "allocator/", "whatif", "whatif/", "internal/"},
	// The tables of oomdbg fixes and oomdbg bugs: workloads re-run, and checked as oomdbg check checks them.
	"internal/fixes": {"knob", "versions", "triage", "leaks", "workloads/", "allocator", "tracer", "snapshot", "snapshot/timeline", "internal/"},
	// What the commands do beyond their flags: everything but the TUI and the command line itself.
	"internal/app": {"knob", "versions", "snapshot", "snapshot/", "triage", "leaks", "tracer", "tracer/nvml", "workloads/", "allocator", "allocator/", "whatif", "whatif/", "internal/"},
	"cmd/oomdbg":   {""},
	// A config.json reader: a workload's shape, nothing of the runtime.
	"workloads/nn/hfconfig": nil,
	// oomdbg record: runs a job and lists its dumps; what they hold is snapshot/torch's to read.
	"recorder": nil,
}

// presentation lists the libraries only the TUI and the command line may use.
var presentation = []string{"charm.land/", "github.com/charmbracelet/", "github.com/NimbleMarkets/", "github.com/spf13/"}

// frontends are the packages that may use them: the TUI, the command line, and the backend that speaks the
// TUI's types (and so depends on them through package tui).
var frontends = []string{"tui", "tui/tuitest", "cmd/oomdbg", "internal/backend"}

// terminal is the package below the TUI that may ask x/term whether a file is a terminal (x/term draws
// nothing), and so may the packages that use it.
const terminal = "internal/outfile"

// driver lists the command line's own packages, which the "internal/" of other packages' rules does not
// reach: only the command line, and the packages named with them, may import them.
var driver = map[string][]string{"internal/app": {"cmd/oomdbg"}, "internal/fixes": {"cmd/oomdbg", "internal/backend"}}

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
				if users, ok := driver[own]; !allows(allowed, own) || ok && !slices.Contains(users, pkg) {
					t.Errorf("%s depends on %s", pkg, own)
				}
				continue
			}
			if pkg == "snapshot" && !strings.HasPrefix(dep, "github.com/klauspost/compress") {
				t.Errorf("snapshot depends on %s: it may use only the standard library and zstd", dep)
			}
			if !slices.Contains(frontends, pkg) && allows(presentation, dep) && !(dep == "github.com/charmbracelet/x/term" && (pkg == terminal || slices.Contains(deps, module+terminal))) {
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
