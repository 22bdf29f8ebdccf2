// Package words parses the settings users spell as words (--amp bf16, --dp zero2) into small integer types,
// and prints them back: one rule for every such setting, so that each accepts and refuses alike.
package words

import (
	"fmt"
	"strconv"
	"strings"
)

// Parse returns the index of s in names, the first being the default ("" too). The error names what is
// parsed and lists the names.
func Parse(names []string, what, s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	for i, n := range names {
		if n == s {
			return i, nil
		}
	}
	return 0, fmt.Errorf("unknown %s %q (want %s or %s)", what, s, strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
}

// Name returns names[i], or what(i) for an index out of range (a value made in code).
func Name(names []string, i int, what string) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return what + "(" + strconv.Itoa(i) + ")"
}

// Into sets *v to parse(text), leaving it as it was on error: an UnmarshalText.
func Into[T any](v *T, parse func(string) (T, error), text []byte) error {
	p, err := parse(string(text))
	if err != nil {
		return err
	}
	*v = p
	return nil
}
