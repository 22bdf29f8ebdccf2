package outfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCheckLeavesFIFOAlone holds that deciding where to write never opens a FIFO. A reader already waiting
// on it (`cat fifo > file &`) would be paired with that open and, when it closed, see an end of file and leave
// before the recording began, and the recording's own open would then wait for a reader forever.
func TestCheckLeavesFIFOAlone(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	// A non-blocking reader opens at once. Linux reports POLLHUP to it only once a writer has opened and
	// closed the FIFO, so the poll below sees any open Check made.
	r, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(r)
	o, err := Check(fifo, false, true)
	if err != nil || o.Kind != Stream {
		t.Fatalf("Check(FIFO) = %v, %v; want a stream", o.Kind, err)
	}
	fds := []unix.PollFd{{Fd: int32(r), Events: unix.POLLIN}}
	if _, err := unix.Poll(fds, 0); err != nil {
		t.Fatal(err)
	}
	if fds[0].Revents&unix.POLLHUP != 0 {
		t.Fatal("Check opened and closed the FIFO: a waiting reader would have seen an end of file")
	}
}

// TestStreamOpensAtFirstWrite holds that a stream leaves its target as it was until something is written:
// a run refused before its first byte clobbers nothing.
func TestStreamOpensAtFirstWrite(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "old.oomdbg")
	if err := os.WriteFile(old, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"new": filepath.Join(dir, "new.oomdbg"), "regular": old} {
		o, err := Check(path, false, true)
		if err != nil {
			t.Fatal(err)
		}
		_, closeFn, err := o.Stream(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := closeFn(); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(path); name == "new" && !errors.Is(err, os.ErrNotExist) || name == "regular" && string(b) != "old" {
			t.Errorf("%s: a stream never written to left %q, %v", name, b, err)
		}
	}
	o := Output{Path: "x", Target: filepath.Join(dir, "nodir", "x"), Kind: New}
	w, _, _ := o.Stream(nil)
	var oe *OpenError
	if _, err := w.Write([]byte("x")); !errors.As(err, &oe) || oe.Error() != "cannot write x: no such file or directory" {
		t.Errorf("writing into a missing directory: %v", err)
	}
}

// TestOneWriterAtATime: of two streams into one file, the second to write finds the file busy and leaves it
// alone, so the file ends as the first one's recording; once the first is closed, the file may be written
// again.
func TestOneWriterAtATime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.oomdbg")
	stream := func() (io.Writer, func() error) {
		o, err := Check(path, false, true)
		if err != nil {
			t.Fatal(err)
		}
		w, closeFn, err := o.Stream(nil)
		if err != nil {
			t.Fatal(err)
		}
		return w, closeFn
	}
	first, closeFirst := stream()
	if _, err := first.Write([]byte("first ")); err != nil {
		t.Fatal(err)
	}
	second, closeSecond := stream()
	if _, err := second.Write([]byte("second")); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second writer: %v, want ErrBusy", err)
	}
	closeSecond()
	if _, err := first.Write([]byte("recording")); err != nil {
		t.Fatal(err)
	}
	closeFirst()
	if b, _ := os.ReadFile(path); string(b) != "first recording" {
		t.Errorf("the file holds %q, want the first writer's alone", b)
	}
	third, closeThird := stream()
	if _, err := third.Write([]byte("third")); err != nil {
		t.Fatalf("once the first is done: %v", err)
	}
	closeThird()
	if b, _ := os.ReadFile(path); string(b) != "third" {
		t.Errorf("the file holds %q, want the third writer's recording alone", b)
	}
}
