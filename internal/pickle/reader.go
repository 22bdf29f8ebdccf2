package pickle

import (
	"fmt"
	"io"
)

// Reading a stream. The decoder reads its input through data: all of it when decoding a slice, else a window
// onto the stream that need slides and refills. Only step's readers ask for bytes beyond the window; run's
// inline cases decode what the window holds and leave the rest to step.

// window is the size of the buffer a stream is read through: two of CPython's 64 KiB frames, so checking a
// frame never grows it. It starts at firstWindow, so a small pickle costs a small buffer, and doubles with
// each refill.
const (
	window      = 128 << 10
	firstWindow = 4 << 10
)

// frameAhead is the longest FRAME whose bytes a stream decode reads ahead to check they are all there. Python
// writes frames of 64 KiB plus at most one opcode; a longer one is refused rather than held.
const frameAhead = 1 << 20

// need makes the next n bytes of input available at data[pos:], reading the stream for them. It fails when
// the input ends (or reaches MaxInput, or a read fails) before them, or when holding them would pass
// MaxMemory.
func (d *decoder) need(n int) error {
	if n <= len(d.data)-d.pos {
		return nil
	}
	for !d.eof && len(d.data)-d.pos < n {
		if len(d.data) == cap(d.data) {
			if err := d.makeRoom(n); err != nil {
				return err
			}
		}
		d.readSome()
	}
	if n <= len(d.data)-d.pos {
		return nil
	}
	return d.short()
}

// short is the cause when the input has no more bytes to give.
func (d *decoder) short() error {
	switch {
	case d.over:
		return fmt.Errorf("%w: the pickle goes on past Limits.MaxInput (%d bytes)", ErrLimit, d.lim.MaxInput)
	case d.rerr != nil:
		return fmt.Errorf("reading input: %w", d.rerr)
	}
	return errTruncated
}

// makeRoom makes room at the end of the window by dropping what was decoded before the current opcode and,
// when the rest fills more than half of it or n does not fit, by moving to a window twice the size. A window
// grown for a long string or frame shrinks back once it is decoded.
func (d *decoder) makeRoom(n int) error {
	rest := d.data[d.at:]
	want := d.pos - d.at + n // bytes from the opcode's start to the last one needed
	size := cap(d.data)
	switch {
	case len(rest) > size/2 || want > size || size < window:
		size *= 2 // so a long string or frame gets buffers no larger than twice the bytes actually read
	case size > 4*window && want <= window/2:
		size = window
	}
	if size == cap(d.data) {
		copy(d.data[:cap(d.data)], rest)
	} else {
		if err := d.mem.swap(int64(cap(d.data)), int64(size)); err != nil {
			return err
		}
		d.data = append(make([]byte, 0, size), rest...)
	}
	d.data = d.data[:len(rest)]
	d.base += int64(d.at)
	d.pos -= d.at
	d.at = 0
	return nil
}

// readSome reads once from the stream into the free end of the window, up to one byte past MaxInput: enough
// to tell an input that ends at the limit from one that goes on.
func (d *decoder) readSome() {
	room := d.data[len(d.data):cap(d.data)]
	if left := d.lim.MaxInput + 1 - d.base - int64(len(d.data)); int64(len(room)) > left {
		room = room[:left]
	}
	k, err := d.r.Read(room)
	if k < 0 || k > len(room) {
		k, err = 0, fmt.Errorf("the reader returned %d bytes for a buffer of %d", k, len(room))
	}
	d.data = d.data[:len(d.data)+k]
	if end := d.base + int64(len(d.data)); end > d.lim.MaxInput {
		d.data = d.data[:len(d.data)-int(end-d.lim.MaxInput)]
		d.over, d.eof = true, true
		return
	}
	switch {
	case err == io.EOF:
		d.eof = true
	case err != nil:
		d.rerr, d.eof = err, true
	case k == 0:
		d.zeros++
		if d.zeros >= 100 { // as bufio gives up on a reader that returns nothing, again and again
			d.rerr, d.eof = io.ErrNoProgress, true
		}
	default:
		d.zeros = 0
	}
}
