package torch

import (
	"math"
	"strconv"

	"github.com/oomdbg/oomdbg/internal/pickle"
)

// itoa formats an index in a field's path.
func itoa(i int) string { return strconv.Itoa(i) }

// optInt reads an optional integer field.
func (im *importer) optInt(d pickle.Value, key string, path func() string) (int64, bool, error) {
	v, ok := im.get(d, key)
	if !ok {
		return 0, false, nil
	}
	n, err := im.toInt(v, field{path, key})
	return n, err == nil, err
}

// optString reads an optional string field ("" when absent or None).
func (im *importer) optString(d pickle.Value, key string, path func() string) (string, error) {
	v, _ := im.get(d, key)
	return im.toString(v, field{path, key})
}

// optBool reads an optional bool field.
func (im *importer) optBool(d pickle.Value, key string, path func() string) (bool, error) {
	v, _ := im.get(d, key)
	return toBool(v, field{path, key})
}

// checkDevice accepts a CUDA device ordinal that fits an event.
func checkDevice(n int64, f field) (int, error) {
	if n < 0 || n > math.MaxInt16 {
		return 0, schemaErr(f.String(), "device %d out of range", n)
	}
	return int(n), nil
}

// field names the path of a field: path().key, built only when an error needs it.
type field struct {
	path func() string
	key  string
}

func (f field) String() string { return f.path() + "." + f.key }

// toInt converts a present field to an integer.
func (im *importer) toInt(v pickle.Value, f field) (int64, error) {
	n, ok := im.asInt(v)
	if !ok {
		if x, isInt := im.doc.BigInt(v); isInt {
			digits := x.String()
			if len(digits) > 40 {
				digits = "of " + itoa(len(digits)) + " digits"
			}
			return 0, schemaErr(f.String(), "int %s out of range (a snapshot's ints lie in -2^63 to 2^64-1)", digits)
		}
		return 0, wantErr(f.String(), "int", v)
	}
	return n, nil
}

// toSize converts a present field to a non-negative integer.
func (im *importer) toSize(v pickle.Value, f field) (int64, error) {
	n, err := im.toInt(v, f)
	if err == nil && n < 0 {
		err = schemaErr(f.String(), "want a size, got %d", n)
	}
	return n, err
}

// toString converts a present field to a string; None is "".
func (im *importer) toString(v pickle.Value, f field) (string, error) {
	if v.IsNone() {
		return "", nil
	}
	s, ok := im.doc.Str(v)
	if !ok {
		return "", wantErr(f.String(), "str", v)
	}
	return s, nil
}

// toBool converts a present field to a bool; None is false.
func toBool(v pickle.Value, f field) (bool, error) {
	if v.IsNone() {
		return false, nil
	}
	b, ok := v.Bool()
	if !ok {
		return false, wantErr(f.String(), "bool", v)
	}
	return b, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
