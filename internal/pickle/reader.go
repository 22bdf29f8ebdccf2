package pickle

import (
	"fmt"
	"io"
	"io/fs"
)

// readAll reads r to the end, failing once more than limit bytes arrive. A file's size, when it has one, sizes
// the buffer up front so a large snapshot is read without regrowing.
func readAll(r io.Reader, limit int64) ([]byte, error) {
	var buf []byte
	if f, ok := r.(interface{ Stat() (fs.FileInfo, error) }); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 && fi.Size() <= limit {
			buf = make([]byte, 0, fi.Size()+1) // +1 to see EOF without growing
		}
	}
	lr := &io.LimitedReader{R: r, N: limit + 1}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return nil, &DecodeError{Offset: limit, Err: overLimit("input bytes", int64(len(buf)), "MaxInput", limit)}
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, &DecodeError{Offset: int64(len(buf)), Err: fmt.Errorf("reading input: %w", err)}
		}
	}
}
