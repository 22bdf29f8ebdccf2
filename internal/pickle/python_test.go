package pickle

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPythonPickles decodes every pickle testdata/gen.py made with Python's pickle.dumps (protocols 2 to 5)
// and compares the result, sharing included, with what Python's pickle.loads made of the same bytes.
func TestPythonPickles(t *testing.T) {
	files, err := filepath.Glob("testdata/python/*.pickle")
	if err != nil || len(files) < 70 {
		t.Fatalf("expected the pickles of testdata/gen.py, found %d (%v)", len(files), err)
	}
	protocols := map[byte]int{}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".pickle")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			truthJSON, err := os.ReadFile(strings.TrimSuffix(file, ".pickle") + ".json")
			if err != nil {
				t.Fatal(err)
			}
			var truth struct {
				Render  json.RawMessage
				Refused string
				Offset  int64
				Cycle   bool
			}
			if err := json.Unmarshal(truthJSON, &truth); err != nil {
				t.Fatal(err)
			}
			if data[0] == opProto {
				protocols[data[1]]++
			}
			v, err := Decode(data)
			var de *DecodeError
			switch {
			case truth.Refused != "":
				if !errors.Is(err, ErrRefused) || !errors.As(err, &de) || de.Op != truth.Refused || de.Offset != truth.Offset {
					t.Fatalf("got %v; want %s refused at offset %d", err, truth.Refused, truth.Offset)
				}
			case truth.Cycle:
				if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "self-referencing") {
					t.Fatalf("got %v, %v; want the self-reference refused", v, err)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				got, err := json.Marshal(render(v, map[any]int{}))
				if err != nil {
					t.Fatal(err)
				}
				want, err := canonicalJSON(truth.Render)
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != want {
					t.Errorf("decode differs from Python's\n got: %.2000s\nwant: %.2000s", got, want)
				}
			}
		})
	}
	for p := byte(2); p <= 5; p++ {
		if protocols[p] < 10 {
			t.Errorf("only %d pickles of protocol %d in testdata/python", protocols[p], p)
		}
	}
}
