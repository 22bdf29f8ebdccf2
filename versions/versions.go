// Package versions is the set of library versions a training run assumes (torch, transformers,
// bitsandbytes, peft, accelerate) and the table of the memory behaviours that changed across their
// releases, each keyed by the release that changed it and cited (behaviours.go). A run's versions come from
// --versions torch=2.3.1,... or a pip freeze (--versions-from), parsed once into a Set; the simulated
// PyTorch asks the Set, never a version number, what a behaviour is (Set.MatMul4BitKeepsInput, ...).
// docs/versions.md is generated from the table (go generate ./versions).
package versions

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

//go:generate go run ./internal/gendoc -o ../docs/versions.md

// Library is one of the libraries whose version changes what a run keeps in memory.
type Library uint8

// The libraries, in the order a Set prints them.
const (
	Torch Library = iota
	Transformers
	Bitsandbytes
	PEFT
	Accelerate
	numLibraries
)

// Libraries lists every library.
var Libraries = []Library{Torch, Transformers, Bitsandbytes, PEFT, Accelerate}

var libraryNames = [numLibraries]string{"torch", "transformers", "bitsandbytes", "peft", "accelerate"}

// String returns the library's name on PyPI.
func (l Library) String() string {
	if l < numLibraries {
		return libraryNames[l]
	}
	return "library(" + strconv.Itoa(int(l)) + ")"
}

// ParseLibrary returns the library named s (its PyPI name, normalised as PEP 503 does: case, "-", "_" and
// "." alike).
func ParseLibrary(s string) (Library, bool) {
	n := normalise(s)
	for i, name := range libraryNames {
		if name == n {
			return Library(i), true
		}
	}
	return 0, false
}

// normalise is PEP 503's name normalisation: lower case, runs of "-", "_" and "." as one "-".
func normalise(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	var b strings.Builder
	dash := false
	for _, r := range s {
		if r == '-' || r == '_' || r == '.' {
			dash = true
			continue
		}
		if dash && b.Len() > 0 {
			b.WriteByte('-')
		}
		dash = false
		b.WriteRune(r)
	}
	return b.String()
}

// Version is a release number: major.minor.patch, and whether it is a pre-release of it (rc, dev, a, b),
// which orders before the release as PEP 440 orders it. A local label (+cu121) is dropped: it names a build,
// not a release.
type Version struct {
	Major, Minor, Patch int
	Pre                 bool
}

// V returns the release major.minor.patch.
func V(major, minor, patch int) Version { return Version{Major: major, Minor: minor, Patch: patch} }

// maxComponent bounds each number of a version: no release of these libraries is near it, and it keeps
// every version printable and comparable.
const maxComponent = 1 << 20

// ParseVersion reads a release number: "2.3.1", "4.46", "2.3.1+cu121", "4.49.0.dev0", "1.0.0rc1" (PEP 440's
// releases, pre-releases and local labels; epochs and post-releases are refused: none of these libraries
// publishes them).
func ParseVersion(s string) (Version, error) {
	orig := s
	s, _, _ = strings.Cut(strings.TrimSpace(s), "+")
	s = strings.TrimPrefix(s, "v")
	var v Version
	var parts []int
	for i := 0; ; i++ {
		j := 0
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == 0 || j > 7 {
			return Version{}, fmt.Errorf("version %q: want numbers like 2.3.1", orig)
		}
		n, _ := strconv.Atoi(s[:j])
		if n > maxComponent {
			return Version{}, fmt.Errorf("version %q: %d is not a release number", orig, n)
		}
		parts = append(parts, n)
		s = s[j:]
		if len(parts) == 4 || !strings.HasPrefix(s, ".") || len(s) > 1 && (s[1] < '0' || s[1] > '9') {
			break
		}
		s = s[1:]
	}
	if len(parts) > 3 {
		return Version{}, fmt.Errorf("version %q: more than three numbers", orig)
	}
	for len(parts) < 3 {
		parts = append(parts, 0)
	}
	v.Major, v.Minor, v.Patch = parts[0], parts[1], parts[2]
	if s != "" {
		if !preRelease(s) {
			return Version{}, fmt.Errorf("version %q: %q is not a pre-release suffix (rc1, .dev0, a1, b2)", orig, s)
		}
		v.Pre = true
	}
	return v, nil
}

// preRelease reports whether s is a PEP 440 pre-release or development suffix: [.-_](a|b|rc|alpha|beta|
// dev|pre|c)N.
func preRelease(s string) bool {
	s = strings.TrimLeft(strings.ToLower(s), ".-_")
	for _, p := range []string{"alpha", "beta", "dev", "pre", "rc", "a", "b", "c"} {
		if rest, ok := strings.CutPrefix(s, p); ok {
			rest = strings.TrimLeft(rest, ".-_")
			if len(rest) > 7 {
				return false
			}
			for _, r := range rest {
				if r < '0' || r > '9' {
					return false
				}
			}
			return true
		}
	}
	return false
}

// String prints the version as it was released ("2.3.1"), a pre-release with "rc".
func (v Version) String() string {
	s := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	if v.Pre {
		s += "rc"
	}
	return s
}

// Compare orders versions: -1, 0 or 1 as v is before, the same as or after w.
func (v Version) Compare(w Version) int {
	for _, d := range [...]int{v.Major - w.Major, v.Minor - w.Minor, v.Patch - w.Patch} {
		if d != 0 {
			return sign(d)
		}
	}
	switch {
	case v.Pre == w.Pre:
		return 0
	case v.Pre:
		return -1
	}
	return 1
}

// Before reports whether v is an earlier release than w.
func (v Version) Before(w Version) bool { return v.Compare(w) < 0 }

func sign(d int) int {
	if d < 0 {
		return -1
	}
	return 1
}

// Set is the version of each library a run assumes; a library not given has the default's (Default).
// Its zero value is the default set.
type Set struct {
	given [numLibraries]Version
	has   [numLibraries]bool
}

// Default is the recent set a run assumes where nothing is given: torch 2.6.0, transformers 4.51.3,
// bitsandbytes 0.45.5, peft 0.15.2, accelerate 1.6.0 (the releases of April 2025, whose sources the
// runtime's modules follow).
var Default = [numLibraries]Version{V(2, 6, 0), V(4, 51, 3), V(0, 45, 5), V(0, 15, 2), V(1, 6, 0)}

// Of returns the version of l the set assumes: the one given, else the default's.
func (s Set) Of(l Library) Version {
	if s.has[l] {
		return s.given[l]
	}
	return Default[l]
}

// Given reports whether l's version was given (not the default's).
func (s Set) Given(l Library) bool { return s.has[l] }

// With returns the set with l at v.
func (s Set) With(l Library, v Version) Set {
	s.given[l], s.has[l] = v, true
	return s
}

// IsZero reports whether no version was given.
func (s Set) IsZero() bool { return s.has == [numLibraries]bool{} }

// Parse reads --versions: comma-separated library=version pairs, any subset of the libraries, each at most
// once ("" is the default set).
func Parse(text string) (Set, error) {
	var s Set
	if strings.TrimSpace(text) == "" {
		return s, nil
	}
	for _, pair := range strings.Split(text, ",") {
		name, ver, ok := strings.Cut(pair, "=")
		if !ok {
			return Set{}, fmt.Errorf("versions: %q is not library=version (e.g. torch=2.3.1)", strings.TrimSpace(pair))
		}
		l, ok := ParseLibrary(name)
		if !ok {
			return Set{}, fmt.Errorf("versions: unknown library %q (want some of %s)", strings.TrimSpace(name), strings.Join(libraryNames[:], ", "))
		}
		if s.has[l] {
			return Set{}, fmt.Errorf("versions: %s given twice", l)
		}
		v, err := ParseVersion(ver)
		if err != nil {
			return Set{}, fmt.Errorf("versions: %s: %w", l, err)
		}
		s = s.With(l, v)
	}
	return s, nil
}

// String prints the versions given, in --versions' form ("torch=2.3.1,bitsandbytes=0.42.0").
func (s Set) String() string {
	var parts []string
	for _, l := range Libraries {
		if s.has[l] {
			parts = append(parts, l.String()+"="+s.given[l].String())
		}
	}
	return strings.Join(parts, ",")
}

// Describe prints every library's version, the defaults marked: what a report says a run assumed.
func (s Set) Describe() string {
	var parts []string
	for _, l := range Libraries {
		p := l.String() + " " + s.Of(l).String()
		if !s.has[l] {
			p += " (default)"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

// MarshalText prints the set as String does.
func (s Set) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads the set as Parse does.
func (s *Set) UnmarshalText(text []byte) error {
	p, err := Parse(string(text))
	if err != nil {
		return err
	}
	*s = p
	return nil
}

// versionsJSON is how a snapshot's configuration stores a set: an object of the versions given.
func (s Set) MarshalJSON() ([]byte, error) {
	m := map[string]string{}
	for _, l := range Libraries {
		if s.has[l] {
			m[l.String()] = s.given[l].String()
		}
	}
	return json.Marshal(m)
}

// UnmarshalJSON reads an object of library names to versions (or the --versions string).
func (s *Set) UnmarshalJSON(data []byte) error {
	var text string
	if json.Unmarshal(data, &text) == nil {
		return s.UnmarshalText([]byte(text))
	}
	var m map[string]string
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("versions: %w", err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var pairs []string
	for _, k := range keys {
		pairs = append(pairs, k+"="+m[k])
	}
	return s.UnmarshalText([]byte(strings.Join(pairs, ",")))
}
