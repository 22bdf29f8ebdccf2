package load

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// nativeFile writes a small oomdbg snapshot and returns its bytes.
func nativeFile(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := snapshot.NewWriter(&buf, snapshot.Meta{Tool: "oomdbg", Source: "oomdbg", TimeUnit: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range []snapshot.Event{
		{Time: 1, Action: snapshot.ActionSegmentAlloc, Addr: 1 << 21, Size: 2 << 20},
		{Time: 2, Action: snapshot.ActionAlloc, Addr: 1 << 21, Size: 100, BlockSize: 512},
	} {
		if err := w.Write(&e); err != nil {
			t.Fatal(i, err)
		}
	}
	if err := w.Close(&snapshot.Footer{}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestFile(t *testing.T) {
	pickled, err := os.ReadFile(filepath.Join("..", "torch", "testdata", "snapshots", "g1.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	jsoned, err := os.ReadFile(filepath.Join("..", "torch", "testdata", "snapshots", "g3.json"))
	if err != nil {
		t.Fatal(err)
	}
	native := nativeFile(t)
	tests := map[string]struct {
		data    []byte // nil: no file at all
		format  Format
		source  string // Meta.Source of the result
		events  int
		wantErr error
	}{
		"oomdbg snapshot":  {data: native, format: FormatNative, source: "oomdbg", events: 2},
		"oomdbg cut short": {data: native[:len(native)-10], format: FormatNative, source: "oomdbg", events: 2},
		"pytorch pickle":   {data: pickled, format: FormatPyTorch, source: torch.Source, events: 18},
		"pytorch json":     {data: jsoned, format: FormatPyTorch, source: torch.Source, events: 26},
		"text":             {data: []byte("step,loss\n1,2.5\n"), format: FormatUnknown, wantErr: ErrUnknownFormat},
		"empty":            {data: []byte{}, format: FormatUnknown, wantErr: ErrUnknownFormat},
		"damaged pickle":   {data: pickled[:100], format: FormatPyTorch, wantErr: torch.ErrTruncated},
		"missing":          {wantErr: fs.ErrNotExist},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "snap.bin")
			if tc.data != nil {
				if err := os.WriteFile(path, tc.data, 0o600); err != nil {
					t.Fatal(err)
				}
				if got := Sniff(tc.data[:min(16, len(tc.data))]); got != tc.format {
					t.Errorf("Sniff: %v, want %v", got, tc.format)
				}
			}
			s, err := File(path)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("error %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Meta.Source != tc.source || len(s.Events) != tc.events {
				t.Errorf("source %q with %d events, want %q with %d", s.Meta.Source, len(s.Events), tc.source, tc.events)
			}
		})
	}
}
