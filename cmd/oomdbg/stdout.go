package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// checkedWriter is a command's standard output for writers that do not return their errors (the tables
// of fit, fixes and bugs): the first write that fails (a full disk, /dev/full) is kept, the writes after it
// are dropped, and Err makes it the command's error, so that a lost answer is not an exit 0.
type checkedWriter struct {
	w   io.Writer
	err error
}

func (c *checkedWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.err = err
	return n, err
}

// Err returns the first write's failure as one line, nil when every write went through.
func (c *checkedWriter) Err() error {
	if c.err == nil {
		return nil
	}
	err := c.err
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Errorf("cannot write standard output: %w", err)
}
