package export

import (
	"bufio"
	"io"
	"math"
	"strconv"
	"unicode/utf8"
)

// jsonEncoder writes the torch document as JSON, which memory_viz reads as readily as a pickle (it tries
// JSON.parse first). JSON has no references, so shared values are written out every time. Each top-level key,
// trace entry, segment and annotation starts a line, which keeps the file line-oriented for diffs and grep.
type jsonEncoder struct {
	w     *bufio.Writer
	buf   []byte
	stack []jsonLevel
	err   error
}

type jsonLevel struct {
	dict  bool
	items int
}

// jsonLineDepth is the deepest list whose items start a line: device_traces' per-device lists.
const jsonLineDepth = 3

func newJSONEncoder(w io.Writer) *jsonEncoder {
	return &jsonEncoder{w: bufio.NewWriterSize(w, 64<<10), buf: make([]byte, 0, 256)}
}

// emit hands the buffered bytes to the writer once they are worth a call.
func (e *jsonEncoder) emit() {
	if len(e.buf) < 4096 || e.err != nil {
		return
	}
	_, e.err = e.w.Write(e.buf)
	e.buf = e.buf[:0]
}

// item writes the separator before a value that is a list item.
func (e *jsonEncoder) item() {
	n := len(e.stack)
	if n == 0 {
		return
	}
	l := &e.stack[n-1]
	if l.dict {
		return // the key wrote the separator
	}
	if l.items > 0 {
		e.buf = append(e.buf, ',')
	}
	if n <= jsonLineDepth && n >= 2 {
		e.buf = append(e.buf, '\n')
	}
	l.items++
}

func (e *jsonEncoder) beginDict() {
	e.item()
	e.buf = append(e.buf, '{')
	e.stack = append(e.stack, jsonLevel{dict: true})
}

func (e *jsonEncoder) endDict() {
	if len(e.stack) == 1 {
		e.buf = append(e.buf, '\n')
	}
	e.stack = e.stack[:len(e.stack)-1]
	e.buf = append(e.buf, '}')
	e.emit()
}

func (e *jsonEncoder) beginList() {
	e.item()
	e.buf = append(e.buf, '[')
	e.stack = append(e.stack, jsonLevel{})
}

func (e *jsonEncoder) endList() {
	e.stack = e.stack[:len(e.stack)-1]
	e.buf = append(e.buf, ']')
	e.emit()
}

func (e *jsonEncoder) key(k string) {
	l := &e.stack[len(e.stack)-1]
	if l.items > 0 {
		e.buf = append(e.buf, ',')
	}
	if len(e.stack) == 1 {
		e.buf = append(e.buf, '\n')
	}
	l.items++
	e.buf = appendJSONString(e.buf, k)
	e.buf = append(e.buf, ':')
}

func (e *jsonEncoder) str(s string) {
	e.item()
	e.buf = appendJSONString(e.buf, s)
}

func (e *jsonEncoder) int(v int64) {
	e.item()
	e.buf = strconv.AppendInt(e.buf, v, 10)
}

func (e *jsonEncoder) uint(v uint64) {
	e.item()
	e.buf = strconv.AppendUint(e.buf, v, 10)
}

func (e *jsonEncoder) float(f float64) {
	e.item()
	if math.IsNaN(f) || math.IsInf(f, 0) {
		e.buf = append(e.buf, "null"...) // JSON has no NaN or infinity
		return
	}
	e.buf = strconv.AppendFloat(e.buf, f, 'g', -1, 64)
	if f == math.Trunc(f) && math.Abs(f) < 1e21 {
		e.buf = append(e.buf, ".0"...) // stays a float for Python's json
	}
}

func (e *jsonEncoder) bool(b bool) {
	e.item()
	e.buf = strconv.AppendBool(e.buf, b)
}

func (e *jsonEncoder) none() {
	e.item()
	e.buf = append(e.buf, "null"...)
}

func (e *jsonEncoder) intPair(a, b int64) {
	e.item()
	e.buf = append(e.buf, '[')
	e.buf = strconv.AppendInt(e.buf, a, 10)
	e.buf = append(e.buf, ',')
	e.buf = strconv.AppendInt(e.buf, b, 10)
	e.buf = append(e.buf, ']')
}

func (e *jsonEncoder) shared(refKind, uint32) bool { return false }

func (e *jsonEncoder) close() error {
	e.buf = append(e.buf, '\n')
	if e.err == nil {
		_, e.err = e.w.Write(e.buf)
	}
	if e.err == nil {
		e.err = e.w.Flush()
	}
	return e.err
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string. Bytes that are not UTF-8 become U+FFFD; <, > and & stay as they
// are (this is data, not HTML).
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		// U+2028 and U+2029 are valid JSON but end lines in JavaScript source; escape them as encoding/json does.
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
