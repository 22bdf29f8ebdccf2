package versions

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestParseVersions(t *testing.T) {
	s, err := Parse("torch=2.3.1,transformers=4.43.3,bitsandbytes=0.42.0,peft=0.11.1,accelerate=0.33.0")
	if err != nil {
		t.Fatal(err)
	}
	for l, want := range map[Library]Version{Torch: V(2, 3, 1), Transformers: V(4, 43, 3), Bitsandbytes: V(0, 42, 0), PEFT: V(0, 11, 1), Accelerate: V(0, 33, 0)} {
		if got := s.Of(l); got != want || !s.Given(l) {
			t.Errorf("%s: %v (given %v), want %v", l, got, s.Given(l), want)
		}
	}
	sub, err := Parse(" Bitsandbytes = 0.43.1+cu121 ")
	if err != nil {
		t.Fatal(err)
	}
	if sub.Of(Bitsandbytes) != V(0, 43, 1) || sub.Given(Torch) || sub.Of(Torch) != Default[Torch] {
		t.Errorf("a subset: %v", sub.Describe())
	}
	if back, err := Parse(s.String()); err != nil || back != s {
		t.Errorf("%q reads back as %v, %v", s.String(), back, err)
	}
	for _, bad := range []string{"tensorflow=2.1", "torch", "torch=", "torch=two", "torch=2.3.1,torch=2.4.0", "torch=2.3.1.4.5",
		"torch=99999999.0", "torch=2.3.x", "=2.3"} {
		_, err := Parse(bad)
		if err == nil {
			t.Errorf("%q: no error", bad)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error spans lines: %v", bad, err)
		}
	}
}

func TestVersionOrder(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"0.43.1", "0.43.2", -1}, {"0.43.2", "0.43.2", 0}, {"4.49.0.dev0", "4.49.0", -1}, {"4.49.0rc1", "4.48.3", 1},
		{"2.0", "2.0.0", 0}, {"1.13.1+cpu", "2.0.0", -1}, {"v0.30.0", "0.29.3", 1},
	} {
		a, err1 := ParseVersion(c.a)
		b, err2 := ParseVersion(c.b)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s, %s: %v, %v", c.a, c.b, err1, err2)
		}
		if got := a.Compare(b); got != c.want {
			t.Errorf("%s vs %s: %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestParseRequirements(t *testing.T) {
	freeze := `# a pip freeze
accelerate==0.33.0
aiohttp==3.9.5
bitsandbytes==0.42.0 ; platform_system == "Linux"
-e git+https://github.com/me/mytool@abc#egg=mytool
--extra-index-url https://download.pytorch.org/whl/cu121
PEFT==0.11.1   # adapters
torch[cuda]==2.3.1+cu121
Transformers===4.43.3
trl @ git+https://github.com/huggingface/trl@main
`
	s, err := ParseRequirements(strings.NewReader(freeze))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.String(), "torch=2.3.1,transformers=4.43.3,bitsandbytes=0.42.0,peft=0.11.1,accelerate=0.33.0"; got != want {
		t.Errorf("read %q, want %q", got, want)
	}
	for name, bad := range map[string]string{
		"a url":         "torch @ https://download.pytorch.org/whl/torch-2.3.1.whl",
		"editable":      "-e git+https://github.com/huggingface/transformers@main#egg=transformers",
		"a range":       "bitsandbytes>=0.43",
		"not pinned":    "peft",
		"included file": "-r base.txt",
		"twice":         "torch==2.3.1\ntorch==2.4.0",
		"bad version":   "accelerate==latest",
		"long line":     "x==" + strings.Repeat("1", maxLine+10),
		"wildcard":      "torch==2.3.*",
	} {
		_, err := ParseRequirements(strings.NewReader(bad))
		var re *RequirementsError
		switch {
		case err == nil:
			t.Errorf("%s: no error", name)
		case !errors.As(err, &re) || re.Line < 1:
			t.Errorf("%s: %v has no line", name, err)
		case strings.Contains(err.Error(), "\n"):
			t.Errorf("%s: error spans lines: %v", name, err)
		}
	}
	if _, err := ParseRequirements(strings.NewReader(strings.Repeat("a==1\n", MaxRequirements/5+10))); err == nil {
		t.Error("a file past MaxRequirements read")
	}
}

func FuzzParseRequirements(f *testing.F) {
	f.Add("torch==2.3.1\n")
	f.Add("-e .#egg=peft\n")
	f.Add("bitsandbytes===0.43.1rc1 ; x\n")
	f.Fuzz(func(t *testing.T, s string) {
		set, err := ParseRequirements(strings.NewReader(s))
		if err != nil {
			return
		}
		if back, err := Parse(set.String()); err != nil || back != set {
			t.Errorf("%q: read %q, which reads back as %v, %v", s, set.String(), back.String(), err)
		}
	})
}

func TestSetJSON(t *testing.T) {
	s, _ := Parse("torch=1.13.1,bitsandbytes=0.43.1")
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"bitsandbytes":"0.43.1","torch":"1.13.1"}` {
		t.Errorf("JSON %s", b)
	}
	var back Set
	if err := json.Unmarshal(b, &back); err != nil || back != s {
		t.Errorf("read back %v, %v", back.String(), err)
	}
	if err := json.Unmarshal([]byte(`{"jax":"0.4"}`), &back); err == nil {
		t.Error("an unknown library in JSON read")
	}
}

// TestBehaviourBoundaries holds each row to its citation's release: the release before it has the old
// behaviour, the release itself the new one (the releases named here are read off the libraries' tags:
// bitsandbytes 0.43.1 still has ctx.tensors = (A, B), 0.43.2 has (None, B); accelerate's upcast is in
// v0.30.0 and not in v0.29.3; peft's autocast_adapter_dtype first in v0.12.0).
func TestBehaviourBoundaries(t *testing.T) {
	at := func(s string) Set {
		set, err := Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	checks := []struct {
		set  string
		got  bool
		want bool
	}{
		{"bitsandbytes=0.43.1", at("bitsandbytes=0.43.1").MatMul4BitKeepsInput(), true},
		{"bitsandbytes=0.43.2", at("bitsandbytes=0.43.2").MatMul4BitKeepsInput(), false},
		{"bitsandbytes=0.41.0", at("bitsandbytes=0.41.0").MatMul4BitKeepsInput(), true},
		{"accelerate=0.29.3", at("accelerate=0.29.3").FSDPUpcastsParameters(), false},
		{"accelerate=0.30.0", at("accelerate=0.30.0").FSDPUpcastsParameters(), true},
		{"torch=1.13.1", at("torch=1.13.1").MeanKeepsInput(), true},
		{"torch=2.0.0", at("torch=2.0.0").MeanKeepsInput(), false},
		{"peft=0.11.1", at("peft=0.11.1").AdaptersFloat32(), false},
		{"peft=0.12.0", at("peft=0.12.0").AdaptersFloat32(), true},
		{"transformers=4.45.2", at("transformers=4.45.2").NumItemsInBatch(), false},
		{"transformers=4.46.0", at("transformers=4.46.0").NumItemsInBatch(), true},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.set, c.got, c.want)
		}
	}
	for set, want := range map[string]LossGeneration{"transformers=4.43.3": LossInModel, "transformers=4.45.2": LossInModel,
		"transformers=4.46.0": LossShiftLogits, "transformers=4.48.3": LossShiftLogits, "transformers=4.49.0": LossShiftLabels,
		"": LossShiftLabels} {
		if got := at(set).CausalLMLoss(); got != want {
			t.Errorf("%s: loss %v, want %v", set, got, want)
		}
	}
	if (Set{}).MatMul4BitKeepsInput() || (Set{}).MeanKeepsInput() || !(Set{}).AdaptersFloat32() {
		t.Errorf("the default set %s has an old behaviour", Set{}.Describe())
	}
}

// TestFSDPUpcastRule is the rule FSDP consults: accelerate's prepare_model upcasts only under mixed
// precision and only from 0.30.0.
func TestFSDPUpcastRule(t *testing.T) {
	old, _ := Parse("accelerate=0.29.3")
	if old.FSDPUpcastsParameters() || !(Set{}).FSDPUpcastsParameters() {
		t.Error("accelerate's upcast is keyed wrong")
	}
	if FSDPUpcastsParameters.Changed != V(0, 30, 0) || FSDPUpcastsParameters.Library != Accelerate {
		t.Errorf("the row is %v", FSDPUpcastsParameters)
	}
}

// TestBehavioursAreComplete checks every row: cited, with a URL, and with a test that exists in the
// repository under that name.
func TestBehavioursAreComplete(t *testing.T) {
	root := ".."
	ids := map[string]bool{}
	for _, b := range Behaviours {
		if b.ID == "" || ids[b.ID] || b.Before == "" || b.After == "" || b.File == "" || b.Commit == "" ||
			!strings.HasPrefix(b.URL, "https://github.com/") || b.Changed == (Version{}) {
			t.Errorf("row %q is incomplete or repeated", b.ID)
		}
		ids[b.ID] = true
		pkg, name, ok := strings.Cut(b.Test, " ")
		if !ok {
			t.Errorf("%s: test %q is not \"package TestName\"", b.ID, b.Test)
			continue
		}
		if !testExists(t, filepath.Join(root, pkg), name) {
			t.Errorf("%s: no func %s in %s", b.ID, name, pkg)
		}
	}
}

func testExists(t *testing.T, dir, name string) bool {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
	re := regexp.MustCompile(`(?m)^func ` + regexp.QuoteMeta(name) + `\(`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && re.Match(b) {
			return true
		}
	}
	return false
}

// TestDocIsCurrent fails when docs/versions.md is not what the table generates (go generate ./versions).
func TestDocIsCurrent(t *testing.T) {
	var b bytes.Buffer
	if err := WriteDoc(&b); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../docs/versions.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, b.Bytes()) {
		t.Error("docs/versions.md is stale: run go generate ./versions")
	}
}
