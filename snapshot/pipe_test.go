package snapshot_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/oomdbg/oomdbg/snapshot"
)

// TestPipe: a reader on the far end of a pipe gets each phase as soon as its marker is written, while the
// writer is still running.
func TestPipe(t *testing.T) {
	pr, pw := io.Pipe()
	proceed := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			defer pw.Close()
			w, err := snapshot.NewWriter(pw, testMeta(), snapshot.WithChunkAge(0))
			if err != nil {
				return err
			}
			for phase := snapshot.PhaseData; phase <= snapshot.PhaseOptimizer; phase++ {
				for i := range 10 {
					if err := w.Write(&snapshot.Event{Action: snapshot.ActionAlloc, Addr: uint64(i) << 12, Size: 4096, Phase: phase - 1}); err != nil {
						return err
					}
				}
				if err := w.Write(&snapshot.Event{Action: snapshot.ActionPhase, Phase: phase}); err != nil {
					return err
				}
				<-proceed // the reader must see this phase before the writer goes on
			}
			return w.Close(testFooter(44))
		}()
	}()

	// Without the flush at a marker the reader would wait for ever: fail instead.
	watchdog := time.AfterFunc(10*time.Second, func() {
		pr.CloseWithError(errors.New("no chunk for 10 s: the writer did not flush at the phase marker"))
	})
	defer watchdog.Stop()
	r, err := snapshot.NewReader(pr)
	if err != nil {
		t.Fatal(err)
	}
	for phase := snapshot.PhaseData; phase <= snapshot.PhaseOptimizer; phase++ {
		for i := range 11 {
			e, err := r.Next()
			if err != nil {
				t.Fatalf("phase %v, event %d: %v", phase, i, err)
			}
			if i == 10 && (e.Action != snapshot.ActionPhase || e.Phase != phase) {
				t.Fatalf("phase %v: chunk ends with %+v, want the marker", phase, e)
			}
		}
		proceed <- struct{}{}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last event: %v, want io.EOF", err)
	}
	if !reflect.DeepEqual(r.Footer(), testFooter(44)) || r.Warning() != nil {
		t.Fatalf("footer %v, warning %v", r.Footer(), r.Warning())
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPipeWriterDies: the writer's end closes without an end chunk, as when the recording is killed.
func TestPipeWriterDies(t *testing.T) {
	pr, pw := io.Pipe()
	go func() {
		w, _ := snapshot.NewWriter(pw, testMeta())
		w.Write(&snapshot.Event{Action: snapshot.ActionPhase, Phase: snapshot.PhaseForward})
		pw.Close()
	}()
	s, err := snapshot.Read(pr)
	if err != nil || s.Events.Len() != 1 || !errors.Is(s.Warning, snapshot.ErrTruncated) {
		t.Fatalf("err %v, %d events, warning %v", err, s.Events.Len(), s.Warning)
	}
}

// TestFollow tails a file that a writer appends to in steps, including a chunk written in two halves.
func TestFollow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "live.oomdbg")
	wf, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer wf.Close()
	// The writer goes through a pipe so the test can append its bytes to the file in halves.
	pr, pw := io.Pipe()
	go func() {
		w, _ := snapshot.NewWriter(pw, testMeta(), snapshot.WithChunkAge(0))
		for i := range 5 {
			w.Write(&snapshot.Event{Action: snapshot.ActionAlloc, Addr: uint64(i) << 20, Size: 1 << 20})
			w.Write(&snapshot.Event{Action: snapshot.ActionPhase, Phase: snapshot.Phase(1 + i)})
		}
		w.Close(testFooter(10))
		pw.Close()
	}()
	go func() {
		buf := make([]byte, 1<<16)
		for {
			n, err := pr.Read(buf)
			if n > 0 {
				half := n / 2
				wf.Write(buf[:half])
				time.Sleep(5 * time.Millisecond)
				wf.Write(buf[half:n])
				time.Sleep(5 * time.Millisecond)
			}
			if err != nil {
				return
			}
		}
	}()

	rf, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := snapshot.NewReader(rf, snapshot.WithFollow(ctx, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var events []snapshot.Event
	for {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, e)
	}
	if len(events) != 10 || r.Warning() != nil || !reflect.DeepEqual(r.Footer(), testFooter(10)) {
		t.Fatalf("%d events, warning %v, footer %v", len(events), r.Warning(), r.Footer())
	}
}

// TestFollowCancel: following a file that stops growing ends when the context does.
func TestFollowCancel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stalled.oomdbg")
	wf, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer wf.Close()
	w, err := snapshot.NewWriter(wf, testMeta())
	if err != nil {
		t.Fatal(err)
	}
	w.Write(&snapshot.Event{Action: snapshot.ActionIteration})
	rf, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	ctx, cancel := context.WithCancel(context.Background())
	watchdog := time.AfterFunc(10*time.Second, cancel) // the marker's chunk must arrive well before
	r, err := snapshot.NewReader(rf, snapshot.WithFollow(ctx, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); err != nil {
		t.Fatalf("the iteration marker: %v", err)
	}
	watchdog.Stop()
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := r.Next(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next = %v, want context.Canceled", err)
	}
}
