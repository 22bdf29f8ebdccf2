package export

import (
	"bytes"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// totals sums a profile's inuse_objects and inuse_space.
func totals(p *profile.Profile) (objects, bytes int64) {
	for _, s := range p.Sample {
		objects += s.Value[0]
		bytes += s.Value[1]
	}
	return objects, bytes
}

// TestPprofLiveSet checks the profile at the peak of every snapshot against the Timeline: it is valid, it
// survives pprof's own encoder and parser, and its samples add up to the allocated bytes and the live blocks.
func TestPprofLiveSet(t *testing.T) {
	for name, s := range snapshots(t) {
		t.Run(name, func(t *testing.T) {
			tl := timeline.New(s)
			peak := tl.Peak(timeline.Allocated)
			p, err := PprofProfile(tl, peak.Seq)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.CheckValid(); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := p.Write(&buf); err != nil {
				t.Fatal(err)
			}
			parsed, err := profile.Parse(&buf)
			if err != nil {
				t.Fatal(err)
			}
			live := tl.LiveAt(peak.Seq, nil)
			for what, q := range map[string]*profile.Profile{"built": p, "parsed": parsed} {
				objects, bytes := totals(q)
				if bytes != peak.Bytes || objects != int64(len(live)) {
					t.Errorf("%s: %d bytes in %d objects, want %d in %d", what, bytes, objects, peak.Bytes, len(live))
				}
			}
			if got := parsed.SampleType; len(got) != 2 || got[0].Type != "inuse_objects" || got[0].Unit != "count" ||
				got[1].Type != "inuse_space" || got[1].Unit != "bytes" || parsed.DefaultSampleType != "inuse_space" {
				t.Errorf("sample types %v, default %q", got, parsed.DefaultSampleType)
			}
			for _, sm := range parsed.Sample {
				if len(sm.Label["phase"]) != 1 || len(sm.Label["category"]) != 1 || len(sm.NumLabel["iteration"]) != 1 || len(sm.Location) == 0 {
					t.Fatalf("sample without its tags or stack: labels %v, num labels %v, %d locations", sm.Label, sm.NumLabel, len(sm.Location))
				}
			}
		})
	}
}

// TestPprofFixtureSample pins one sample of the fixture's peak: the 8 MiB output that autograd saved.
func TestPprofFixtureSample(t *testing.T) {
	tl := timeline.New(fixture())
	p, err := PprofProfile(tl, tl.Peak(timeline.Allocated).Seq)
	if err != nil {
		t.Fatal(err)
	}
	var found *profile.Sample
	for _, s := range p.Sample {
		if slices.Equal(s.Label["tensor"], []string{"f32[16,32,4096] fc.out"}) {
			found = s
		}
	}
	if found == nil {
		t.Fatal("no sample for fc.out at the peak")
	}
	var frames []string
	for _, l := range found.Location {
		for _, ln := range l.Line {
			frames = append(frames, ln.Function.Name+" "+ln.Function.Filename+":"+strconv.FormatInt(ln.Line, 10))
		}
	}
	want := []string{"github.com/example/nn.(*Linear).Forward /src/nn/linear.go:31", "github.com/example/train.Step /src/train/step.go:40", "main.main /src/main.go:12"}
	if !slices.Equal(frames, want) {
		t.Errorf("frames %q, want %q", frames, want)
	}
	labels := map[string][]string{"phase": {"forward"}, "category": {"activation"}, "scope": {"fc"}, "tensor": {"f32[16,32,4096] fc.out"}}
	for k, v := range labels {
		if !slices.Equal(found.Label[k], v) {
			t.Errorf("label %s = %q, want %q", k, found.Label[k], v)
		}
	}
	if !slices.Equal(found.NumLabel["iteration"], []int64{0}) || !slices.Equal(found.Value, []int64{1, 8 * mib}) {
		t.Errorf("iteration %v, values %v", found.NumLabel["iteration"], found.Value)
	}
}

// TestPprofAt resolves every kind of --at on the fixture and checks the profile holds the bytes allocated
// after that event.
func TestPprofAt(t *testing.T) {
	s := fixture()
	tl := timeline.New(s)
	tests := map[string]struct {
		at   string
		want int // the event
	}{
		"peak":            {"peak", tl.Peak(timeline.Allocated).Seq},
		"oom":             {"oom", 36},
		"end":             {"end", s.Events.Len() - 1},
		"iteration end 0": {"iteration-end:0", 29},
		"an event":        {"13", 13},
		"the first event": {"0", 0},
		"iteration end 1": {"iteration-end:1", s.Events.Len() - 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			at, err := ParseAt(tc.at)
			if err != nil {
				t.Fatal(err)
			}
			if at.String() != tc.at {
				t.Errorf("ParseAt(%q).String() = %q", tc.at, at.String())
			}
			seq, err := at.Resolve(tl)
			if err != nil || seq != tc.want {
				t.Fatalf("Resolve = %d, %v; want %d", seq, err, tc.want)
			}
			p, err := PprofProfile(tl, seq)
			if err != nil {
				t.Fatal(err)
			}
			if _, b := totals(p); b != tl.Allocated(seq) {
				t.Errorf("%d bytes, want %d", b, tl.Allocated(seq))
			}
		})
	}
	for _, bad := range []string{"", "top", "-3", "iteration-end:", "iteration-end:x", "iteration-end:-2", "1e3"} {
		if _, err := ParseAt(bad); err == nil {
			t.Errorf("ParseAt(%q) accepted it", bad)
		}
	}
	for _, missing := range []string{"iteration-end:7", "9999"} {
		at, _ := ParseAt(missing)
		if _, err := at.Resolve(tl); err == nil {
			t.Errorf("Resolve(%q) found an event", missing)
		}
	}
	noOOM := timeline.New(recorded(t, "tiny"))
	if _, err := (At{Kind: AtOOM}).Resolve(noOOM); err == nil {
		t.Error("resolved an OOM in a run without one")
	}
}

// goTool runs `go tool pprof` with args and returns its output; it skips when go is not on PATH.
func goTool(t *testing.T, args ...string) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH: skipping the check with go tool pprof")
	}
	out, err := exec.Command(gobin, append([]string{"tool", "pprof"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func writeProfile(t *testing.T, s *snapshot.Snapshot, at string) string {
	t.Helper()
	a, err := ParseAt(at)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := Write(&buf, s, FormatPprof, Options{At: &a}); err != nil {
		t.Fatal(err)
	}
	return writeTemp(t, strings.NewReplacer(":", "-").Replace(at)+".pb.gz", buf.Bytes())
}

// TestPprofGoTool has the real pprof read the export: the top table, the tags, and the leak recipe, a diff of
// the ends of two iterations of a leaking run, which must show the leaked activations and nothing of the
// steady state.
func TestPprofGoTool(t *testing.T) {
	fx := writeProfile(t, fixture(), "peak")
	top := goTool(t, "-top", fx)
	for _, want := range []string{"Type: inuse_space", "github.com/example/nn.(*Linear).Forward", "8MB"} {
		if !strings.Contains(top, want) {
			t.Errorf("go tool pprof -top does not show %q:\n%s", want, top)
		}
	}
	tags := goTool(t, "-tags", fx)
	for _, want := range []string{"category:", "activation", "phase:", "forward", "iteration:", "scope:", "tensor:"} {
		if !strings.Contains(tags, want) {
			t.Errorf("go tool pprof -tags does not show %q:\n%s", want, tags)
		}
	}

	leak := recorded(t, "leak")
	a, b := writeProfile(t, leak, "iteration-end:1"), writeProfile(t, leak, "iteration-end:4")
	diff := goTool(t, "-top", "-diff_base", a, b)
	if !strings.Contains(diff, "tensor.") || strings.Contains(diff, "Showing nodes accounting for 0, 0%") {
		t.Errorf("the diff of a leaking run shows no growth:\n%s", diff)
	}
	steady := recorded(t, "tiny")
	a, b = writeProfile(t, steady, "iteration-end:1"), writeProfile(t, steady, "iteration-end:2")
	if diff := goTool(t, "-top", "-diff_base", a, b); !strings.Contains(diff, "accounting for 0, 0%") {
		t.Errorf("the diff of a steady run shows growth:\n%s", diff)
	}
}
