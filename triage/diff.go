package triage

import (
	"cmp"
	"fmt"
	"io"
	"slices"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
)

// Comparison is what changed between two runs: the peaks, the OOM, the leak verdict, the highest peak of
// each phase, and the bytes by category and by scope at the peak.
type Comparison struct {
	A, B       *Report
	Phases     []Change // by phase, in phase order, over the iterations both runs reached
	Categories []Change // at the peak, categories that hold bytes in either run
	Scopes     []Change // at the peak, largest changes first
	// Reached is the last iteration both runs reached (-1: setup only), and Uneven says, when one run
	// stopped before the other (an OOM in its first iteration against a run that finished), what each
	// reached and that the phases are compared over what both did; "" when they reached the same.
	Reached int32
	Uneven  string
}

// Change is one quantity in both runs. NotInA and NotInB say a run never reached it (a phase after an OOM):
// its 0 is no measurement.
type Change struct {
	Name           string
	A, B           int64
	NotInA, NotInB bool
}

// Delta is B - A.
func (c Change) Delta() int64 { return c.B - c.A }

// maxScopes is how many scopes a comparison lists.
const maxScopes = 10

// Diff compares run a with run b.
func Diff(a, b *Report) *Comparison {
	c := &Comparison{A: a, B: b}
	c.Reached = min(lastIteration(a), lastIteration(b))
	c.Uneven = uneven(a, b, c.Reached)
	pa, pb := phasePeaks(a, c.Reached), phasePeaks(b, c.Reached)
	for p := range snapshot.NumPhases {
		name := snapshot.Phase(p).String()
		va, oka := pa[name]
		vb, okb := pb[name]
		if oka || okb {
			c.Phases = append(c.Phases, Change{Name: name, A: va, B: vb, NotInA: !oka, NotInB: !okb})
		}
	}
	for cat := range snapshot.NumCategories {
		name := snapshot.Category(cat).String()
		if va, vb := a.Peak.ByCategory[name], b.Peak.ByCategory[name]; va != 0 || vb != 0 {
			c.Categories = append(c.Categories, Change{Name: name, A: va, B: vb})
		}
	}
	scopes := map[string]*Change{}
	var order []string
	for _, run := range []struct {
		shares []Share
		b      bool
	}{{a.scopes, false}, {b.scopes, true}} {
		for _, s := range run.shares {
			ch, ok := scopes[s.Name]
			if !ok {
				ch = &Change{Name: s.Name}
				scopes[s.Name] = ch
				order = append(order, s.Name)
			}
			if run.b {
				ch.B = s.Bytes
			} else {
				ch.A = s.Bytes
			}
		}
	}
	for _, name := range order {
		if ch := scopes[name]; ch.Delta() != 0 {
			c.Scopes = append(c.Scopes, *ch)
		}
	}
	slices.SortStableFunc(c.Scopes, func(x, y Change) int {
		if d := cmp.Compare(abs(y.Delta()), abs(x.Delta())); d != 0 {
			return d
		}
		return cmp.Compare(x.Name, y.Name)
	})
	c.Scopes = head(c.Scopes, maxScopes)
	return c
}

// phasePeaks is the highest peak of each phase over the iterations up to last.
func phasePeaks(r *Report, last int32) map[string]int64 {
	m := map[string]int64{}
	for _, it := range r.Iterations {
		if it.Iteration > last {
			continue
		}
		for _, p := range it.Phases {
			m[p.Name] = max(m[p.Name], p.PeakAllocated)
		}
	}
	return m
}

// lastIteration is the last iteration a run reached, the one it ran out of memory in included; -1 for
// setup only.
func lastIteration(r *Report) int32 {
	last := int32(-1)
	for _, it := range r.Iterations {
		last = max(last, it.Iteration)
	}
	return last
}

// uneven says what each run reached when one stopped before the other, and over what the phases are
// compared; "" when both reached the same iteration.
func uneven(a, b *Report, reached int32) string {
	la, lb := lastIteration(a), lastIteration(b)
	if la == lb {
		return ""
	}
	ran := func(tag string, r *Report, last int32) string {
		s := fmt.Sprintf("%s ran to iteration %d", tag, last)
		if o := r.OOM; o != nil {
			s = fmt.Sprintf("%s ran out of memory in %s, and never reached iteration %d", tag, where(o.Iteration, o.Phase), o.Iteration+1)
		}
		return s + fmt.Sprintf(" (%d complete)", r.Leaks.Iterations)
	}
	over := "setup"
	if reached >= 0 {
		over = fmt.Sprintf("setup and iterations 0 to %d", reached)
		if reached == 0 {
			over = "setup and iteration 0"
		}
	}
	return fmt.Sprintf("%s; %s. The phases are compared over what both reached: %s", ran("a", a, la), ran("b", b, lb), over)
}

func oomLine(r *Report) string {
	if r.OOM == nil {
		return "none"
	}
	return where(r.OOM.Iteration, r.OOM.Phase)
}

func leakLine(r *Report) string {
	switch r.Leaks.Verdict {
	case "leak":
		return "leak, " + units.FormatSize(r.Leaks.LeakPerIteration) + " per iteration"
	case "fragmentation":
		return "fragmentation, reserved " + units.FormatChange(r.Leaks.ReservedGrowthPerIteration) + " per iteration"
	case "held":
		return leaks.Held.Describe() + ", " + units.FormatSize(r.Leaks.HeldBytes)
	case "no_leak":
		return "no leak"
	}
	return "inconclusive"
}

// changeText prints a change and its ratio: "-520.00 KiB (-51%)".
func changeText(a, b int64) string {
	if a == b {
		return "="
	}
	s := units.FormatChange(b - a)
	if a > 0 {
		s += fmt.Sprintf(" (%+d%%)", ((b-a)*100)/a)
	}
	return s
}

// cells are a change's row: its name, both runs' bytes ("not reached" for a run that never got there) and
// the change, none where a run has no figure.
func (ch Change) cells() []string {
	a, b, change := units.FormatSize(ch.A), units.FormatSize(ch.B), changeText(ch.A, ch.B)
	if ch.NotInA {
		a, change = "not reached", ""
	}
	if ch.NotInB {
		b, change = "not reached", ""
	}
	return []string{ch.Name, a, b, change}
}

// phasesOver says over what iterations the phases are compared.
func (c *Comparison) phasesOver() string {
	if c.Uneven == "" {
		return "over all iterations"
	}
	if c.Reached < 0 {
		return "in setup, which both reached"
	}
	return fmt.Sprintf("over setup and iterations up to %d, which both reached", c.Reached)
}

func name(r *Report) string {
	if r.Source.File != "" {
		return r.Source.File
	}
	return "snapshot"
}

func (c *Comparison) rows() (summary [][]string) {
	a, b := c.A, c.B
	return [][]string{
		{"peak allocated", units.FormatSize(a.Peak.Allocated), units.FormatSize(b.Peak.Allocated), changeText(a.Peak.Allocated, b.Peak.Allocated)},
		{"peak reserved", units.FormatSize(a.Peak.Reserved), units.FormatSize(b.Peak.Reserved), changeText(a.Peak.Reserved, b.Peak.Reserved)},
		{"peak in", where(a.Peak.Iteration, a.Peak.Phase), where(b.Peak.Iteration, b.Peak.Phase), ""},
		{"out of memory", oomLine(a), oomLine(b), ""},
		{"leaks", leakLine(a), leakLine(b), ""},
	}
}

// WriteText writes the comparison for a terminal.
func (c *Comparison) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "oomdbg diff: %s -> %s\n", name(c.A), name(c.B))
	for _, r := range []struct {
		tag string
		rep *Report
	}{{"a", c.A}, {"b", c.B}} {
		if r.rep.Source.WorkloadSummary != "" {
			fmt.Fprintf(ew, "  %s  %s\n", r.tag, r.rep.Source.WorkloadSummary)
		}
	}
	fmt.Fprintln(ew)
	t := newTable("", "", ">a", ">b", "change")
	for _, row := range c.rows() {
		t.row(row...)
	}
	t.write(ew)
	if c.Uneven != "" {
		fmt.Fprintf(ew, "\nNOT ALIKE: %s.\n", c.Uneven)
	}
	section := func(title string, changes []Change, empty string) {
		fmt.Fprintf(ew, "\n%s\n", title)
		if len(changes) == 0 {
			fmt.Fprintf(ew, "  %s\n", empty)
			return
		}
		t := newTable("  ", "", ">a", ">b", "change")
		for _, ch := range changes {
			t.row(ch.cells()...)
		}
		t.writeRows(ew)
	}
	section("PHASES (highest peak inside the phase, "+c.phasesOver()+")", c.Phases, "no phases")
	section("CATEGORIES AT THE PEAK", c.Categories, "nothing allocated")
	section("SCOPES AT THE PEAK (largest changes)", c.Scopes, "no scope changed")
	return ew.err
}

// WriteMarkdown writes the comparison as markdown tables.
func (c *Comparison) WriteMarkdown(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "## oomdbg diff: %s -> %s\n\n", code(name(c.A)), code(name(c.B)))
	for _, r := range []struct {
		tag string
		rep *Report
	}{{"a", c.A}, {"b", c.B}} {
		if r.rep.Source.WorkloadSummary != "" {
			fmt.Fprintf(ew, "- **%s**: %s\n", r.tag, r.rep.Source.WorkloadSummary)
		}
	}
	fmt.Fprintln(ew)
	mdTable(ew, []string{"", ">a", ">b", "change"}, c.rows())
	if c.Uneven != "" {
		fmt.Fprintf(ew, "\n**Not alike**: %s.\n", c.Uneven)
	}
	section := func(title string, changes []Change) {
		if len(changes) == 0 {
			return
		}
		fmt.Fprintf(ew, "\n### %s\n\n", title)
		var rows [][]string
		for _, ch := range changes {
			cells := ch.cells()
			cells[0] = code(cells[0])
			rows = append(rows, cells)
		}
		mdTable(ew, []string{"", ">a", ">b", "change"}, rows)
	}
	section("Phases (highest peak inside the phase, "+c.phasesOver()+")", c.Phases)
	section("Categories at the peak", c.Categories)
	section("Scopes at the peak (largest changes)", c.Scopes)
	return ew.err
}
