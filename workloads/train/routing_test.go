package train

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRoutingSettings checks --routing's forms, its JSON (a file's loads stored, its path never reopened)
// and the one-line errors for what it refuses.
func TestRoutingSettings(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "loads.txt")
	os.WriteFile(file, []byte("5 1 1 1\n\n2,2,2,2\n"), 0o644)
	for in, want := range map[string]string{"": "uniform", "uniform": "uniform", "skewed:1.5": "skewed:1.5", "file:" + file: "file:" + file} {
		r, err := ParseRouting(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if r.String() != want {
			t.Errorf("%q reads as %q", in, r)
		}
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var back Routing
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		if back.String() != r.String() || (r.file != nil && len(back.file.Loads) != 2) {
			t.Errorf("%s reads back as %v", data, back)
		}
	}
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	for in, want := range map[string]string{
		"zipf":                                   `unknown routing "zipf"`,
		"skewed:-1":                              "0 <= ALPHA",
		"uniform:2":                              "unknown routing",
		"file:" + filepath.Join(dir, "none.txt"): "no such file",
		"file:" + write("neg.txt", "1 -1"):       `"-1" is not a load`,
		"file:" + write("ragged.txt", "1 1\n1"):  "line 2 has 1 loads",
		"file:" + write("zero.txt", "0 0 0"):     "no expert has a load",
		"file:" + write("empty.txt", "\n\n"):     "no loads",
	} {
		_, err := ParseRouting(in)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v, want one line containing %q", in, err, want)
		}
	}
	var r Routing
	if err := json.Unmarshal([]byte(`"file:/etc/passwd"`), &r); err == nil {
		t.Error("a stored configuration opened a routing file")
	}
	cfg, _ := PresetConfig("mixtral-8x7b")
	cfg.Routing, _ = ParseRouting("file:" + file)
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "gives 4 experts' loads, the model has 8") {
		t.Errorf("loads of 4 experts for 8: %v", err)
	}
}
