package main

import (
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// shownDefault is a default a command's --help shows for a flag: value, and whether it is the default of
// the command's own model alone (conditional: "(default 16 for gpt2-medium; ...)", "(default "mlp"; with
// --preset ..., theirs)").
type shownDefault struct {
	flag, value string
	conditional bool
}

// helpFlagLine is a flag's line in --help; its default is in the last parentheses.
var helpFlagLine = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)\b.*\(default (.*)\)$`)

// shownDefaults reads the defaults the --help of the command at path shows: "(default X)", and "(default X
// for MODEL; ...)". A default told in words, "(default: ...)", says what no single value can.
func shownDefaults(t *testing.T, path ...string) []shownDefault {
	t.Helper()
	code, help, stderr := runCmd(append(path, "--help")...)
	if code != exitOK {
		t.Fatalf("%v --help: exit %d: %s", path, code, stderr)
	}
	var out []shownDefault
	for _, line := range strings.Split(help, "\n") {
		m := helpFlagLine.FindStringSubmatch(line)
		if m == nil || strings.HasPrefix(m[2], ":") {
			continue
		}
		d := shownDefault{flag: m[1], value: m[2]}
		if v, _, ok := strings.Cut(d.value, ";"); ok {
			d.value, d.conditional = v, true
			d.value, _, _ = strings.Cut(d.value, " for ")
		}
		if u, err := strconv.Unquote(d.value); err == nil {
			d.value = u
		}
		out = append(out, d)
	}
	return out
}

// configOf parses args with a fresh command made by newCmd and returns the configuration the command would
// run: the workload's flags, whatever the command does with them next.
func configOf(t *testing.T, newCmd func() *cobra.Command, args []string) (train.Config, error) {
	t.Helper()
	cmd := newCmd()
	if err := cmd.ParseFlags(args); err != nil {
		return train.Config{}, err
	}
	p, ok := cmd.Flags().Lookup("preset").Value.(presetValue)
	if !ok {
		t.Fatalf("%s has no workload flags", cmd.Name())
	}
	return p.f.config()
}

// TestHelpShowsTheRealDefaults holds what every command's --help shows as a flag's default against what the
// command does without the flag: giving the default shown must change nothing. For the workload flags of
// run, bugs, fixes and fit that is the configuration the command would run, from every model a user can
// start from (no model flag, each preset, --model); a default shown for one model is held for that one.
// For the other flags it is the command's whole output, run twice on one input.
func TestHelpShowsTheRealDefaults(t *testing.T) {
	sources := [][]string{nil, {"--model", "mlp"}, {"--model", "gpt"}, {"--model", "llama"}}
	for _, p := range train.PresetNames() {
		sources = append(sources, []string{"--preset", p})
	}
	workload := map[string]func() *cobra.Command{"run": newRunCmd, "bugs": newBugsCmd, "fixes": newFixesCmd, "fit": newFitCmd}
	dir := testFiles(t)
	tmp := t.TempDir()
	t.Chdir(tmp) // run and record write their default outputs here
	f := func(name string) string { return dir + "/" + name }
	// One invocation of each command, on which each flag's shown default is given and not.
	invocations := map[string][]string{
		"report": {f("attribute.oomdbg")}, "check": {f("attribute.oomdbg")}, "diff": {f("fixed.oomdbg"), f("leak.oomdbg")},
		"replay": {"../../snapshot/torch/testdata/snapshots/g3.pickle"}, "whatif": {f("fixed.oomdbg"), "--checkpoint", "all"},
		"export": {f("fixed.oomdbg"), "--format", "svg", "-o", tmp + "/x.svg"}, "fit": nil, "layouts": nil, "bugs": {"--steps", "4"},
		"run": {"--steps", "2"}, "fixes": {"--preset", "tiny"}, "record": {"--", "true"},
	}
	// The size of a recording varies with its times by a few bytes: not what a default decides.
	volatile := regexp.MustCompile(`\(\d+(\.\d+)? (B|KiB|MiB)\)`)
	for _, c := range newRootCmd().Commands() {
		name := c.Name()
		if name == "help" || name == "completion" {
			continue
		}
		for _, d := range shownDefaults(t, name) {
			t.Run(name+" --"+d.flag, func(t *testing.T) {
				if newCmd, ok := workload[name]; ok && newCmd().Flags().Lookup("preset").Value.(presetValue).f.copies[d.flag] != nil {
					for _, src := range sources {
						if d.conditional && src != nil {
							continue // a default for one model, held for that model alone
						}
						want, wantErr := configOf(t, newCmd, src)
						got, gotErr := configOf(t, newCmd, append(append([]string(nil), src...), "--"+d.flag+"="+d.value))
						if !reflect.DeepEqual(got, want) || (gotErr == nil) != (wantErr == nil) {
							t.Errorf("%s %v --%s=%s (the default shown) runs another configuration than without it (%v, %v)",
								name, src, d.flag, d.value, gotErr, wantErr)
						}
					}
					return
				}
				args, ok := invocations[name]
				if !ok {
					t.Fatalf("--help of %s shows a default for --%s, and the test has no invocation to hold it against", name, d.flag)
				}
				if name == "record" { // its flags come before the job's command
					args = append([]string{"--" + d.flag + "=" + d.value}, args...)
				}
				code1, out1, err1 := runCmd(append([]string{name}, invocations[name]...)...)
				if name != "record" {
					args = append(append([]string(nil), args...), "--"+d.flag+"="+d.value)
				}
				code2, out2, err2 := runCmd(append([]string{name}, args...)...)
				out1, out2 = volatile.ReplaceAllString(out1, "(N)"), volatile.ReplaceAllString(out2, "(N)")
				if code1 != code2 || out1 != out2 || err1 != err2 {
					t.Errorf("oomdbg %s --%s=%s (the default shown) does not do what oomdbg %s does:\nexit %d, %d\nstdout:\n%s\n---\n%s\nstderr:\n%s\n---\n%s",
						name, d.flag, d.value, name, code1, code2, out1, out2, err1, err2)
				}
			})
		}
	}
}
