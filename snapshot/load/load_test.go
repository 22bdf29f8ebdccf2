package load

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
		"pytorch pickle":   {data: pickled, format: FormatPyTorch, source: torch.Source, events: 19}, // with the iteration the optimizer's frames end
		"pytorch json":     {data: jsoned, format: FormatPyTorch, source: torch.Source, events: 26},
		"text":             {data: []byte("step,loss\n1,2.5\n"), format: FormatUnknown, wantErr: ErrUnknownFormat},
		"empty":            {data: []byte{}, format: FormatUnknown, wantErr: ErrEmpty},
		"magic cut short":  {data: native[:5], format: FormatNative, wantErr: snapshot.ErrTruncated},
		"json after space": {data: append(bytes.Repeat([]byte(" \n"), 40), jsoned...), format: FormatPyTorch, source: torch.Source, events: 26},
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
				if got := Sniff(tc.data[:min(sniffBytes, len(tc.data))]); got != tc.format {
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
			if s.Meta.Source != tc.source || s.Events.Len() != tc.events {
				t.Errorf("source %q with %d events, want %q with %d", s.Meta.Source, s.Events.Len(), tc.source, tc.events)
			}
		})
	}
}

// TestFIFO reads snapshots through a named pipe and standard input: one open, so the bytes looked at to tell
// the format are the snapshot's first bytes, not lost to a second open.
func TestFIFO(t *testing.T) {
	native := nativeFile(t)
	pickled, err := os.ReadFile(filepath.Join("..", "torch", "testdata", "snapshots", "g1.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"oomdbg": native, "pytorch": pickled} {
		t.Run(name, func(t *testing.T) {
			fifo := filepath.Join(t.TempDir(), "snap")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Skip("no FIFOs here:", err)
			}
			go func() {
				f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
				if err != nil {
					return
				}
				f.Write(data)
				f.Close()
			}()
			s, err := File(fifo)
			if err != nil || s.Events.Len() == 0 {
				t.Fatalf("read %v, %v", s, err)
			}
		})
		t.Run(name+" on standard input", func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			stdin := os.Stdin
			os.Stdin = r
			t.Cleanup(func() { os.Stdin = stdin; r.Close() })
			go func() { w.Write(data); w.Close() }()
			s, err := File("-")
			if err != nil || s.Events.Len() == 0 {
				t.Fatalf("read %v, %v", s, err)
			}
		})
	}
}

// TestBudget refuses a snapshot whose events would not fit the memory budget, with a *MemoryError, and loads
// it within a budget that fits.
func TestBudget(t *testing.T) {
	var buf bytes.Buffer
	w, err := snapshot.NewWriter(&buf, snapshot.Meta{Tool: "oomdbg", Source: "oomdbg", TimeUnit: "ns"}, snapshot.WithChunkEvents(100))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		e := snapshot.Event{Time: int64(i), Action: snapshot.ActionAnnotation}
		if err := w.Write(&e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(nil); err != nil {
		t.Fatal(err)
	}
	native := filepath.Join(t.TempDir(), "a.oomdbg")
	if err := os.WriteFile(native, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	pickled := filepath.Join("..", "torch", "testdata", "snapshots", "g1.pickle")
	info, err := os.Stat(pickled)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		path   string
		budget Budget
		fits   bool
	}{
		"native fits":          {native, Budget{Memory: 1000 * 400, PerEvent: 400}, true},
		"native too many":      {native, Budget{Memory: 999 * 400, PerEvent: 400}, false},
		"native default cost":  {native, Budget{Memory: 500 * DefaultPerEvent}, false},
		"pytorch fits":         {pickled, Budget{Memory: 1 << 30}, true},
		"pytorch file too big": {pickled, Budget{Memory: info.Size()}, false},
		"pytorch events":       {pickled, Budget{Memory: 1 << 30, PerEvent: 1 << 28}, false},
		"unlimited":            {native, Budget{}, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s, err := File(tc.path, WithBudget(tc.budget))
			if tc.fits {
				if err != nil || s.Events.Len() == 0 {
					t.Fatalf("read %v, %v", s, err)
				}
				return
			}
			var me *MemoryError
			if !errors.As(err, &me) || !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("err = %v, want a *MemoryError naming the file", err)
			}
		})
	}
}

// TestFollowWaitsForHeader opens a file before its writer has written anything: following, Open waits for the
// header instead of calling the empty file unknown.
func TestFollowWaitsForHeader(t *testing.T) {
	path := filepath.Join(t.TempDir(), "growing.oomdbg")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	native := nativeFile(t)
	go func() {
		time.Sleep(300 * time.Millisecond)
		os.WriteFile(path, native, 0o600)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	in, err := Open(path, WithFollow(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if in.Format != FormatNative {
		t.Fatalf("format %v, want oomdbg", in.Format)
	}
	if _, err := File(path + ".missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// TestPipeHeaderOnly opens a pipe whose writer has written a header and is still recording: Open tells the
// format from what arrived, without waiting for more.
func TestPipeHeaderOnly(t *testing.T) {
	native := nativeFile(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	stdin := os.Stdin
	os.Stdin = r
	defer func() { os.Stdin = stdin }()
	if _, err := w.Write(native[:40]); err != nil {
		t.Fatal(err)
	}
	opened := make(chan error, 1)
	go func() {
		in, err := Open("-")
		if err == nil && in.Format != FormatNative {
			err = fmt.Errorf("format %v", in.Format)
		}
		opened <- err
	}()
	select {
	case err := <-opened:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Open waited for more than the header")
	}
	w.Close()
}
