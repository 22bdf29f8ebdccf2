package versions

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// MaxRequirements bounds a requirements file: a pip freeze of a large environment is a few tens of KiB.
const MaxRequirements = 1 << 20

// maxLine bounds one line of it.
const maxLine = 64 << 10

// RequirementsError is a requirements file that cannot be read: the line and what is wrong with it.
type RequirementsError struct {
	Line int
	Err  error
}

func (e *RequirementsError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }
func (e *RequirementsError) Unwrap() error { return e.Err }

// ParseRequirements reads the versions of the libraries from a pip freeze (pip's requirements format):
// name==version lines, with extras (torch[cuda]==2.3.1), environment markers, local labels (+cu121),
// comments and blank lines. Other packages are skipped. A library pinned by other means is refused with its
// line, since its version is unknown: installed from a URL or a local path (-e, name @ url), pinned by a
// range (>=), or brought in by -r or -c from another file. A library listed twice is refused too.
func ParseRequirements(r io.Reader) (Set, error) {
	var s Set
	sc := bufio.NewScanner(io.LimitReader(r, MaxRequirements+1))
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	read, n := 0, 0
	for sc.Scan() {
		n++
		line := sc.Text()
		read += len(line) + 1
		if read > MaxRequirements {
			return Set{}, &RequirementsError{n, fmt.Errorf("the file is longer than %d bytes: not a pip freeze", MaxRequirements)}
		}
		if err := s.requirement(line); err != nil {
			return Set{}, &RequirementsError{n, err}
		}
	}
	if err := sc.Err(); err != nil {
		if err == bufio.ErrTooLong {
			return Set{}, &RequirementsError{n + 1, fmt.Errorf("a line longer than %d bytes: not a pip freeze", maxLine)}
		}
		return Set{}, err
	}
	return s, nil
}

// requirement reads one line of a requirements file into s.
func (s *Set) requirement(line string) error {
	if i := strings.Index(line, " #"); i >= 0 || strings.HasPrefix(strings.TrimSpace(line), "#") {
		if i < 0 {
			i = 0
		}
		line = line[:i]
	}
	line = strings.TrimSpace(line)
	if line == "" {
		return nil
	}
	if strings.HasPrefix(line, "-") {
		return s.option(line)
	}
	spec, _, _ := strings.Cut(line, ";") // an environment marker: the freeze was taken where it held
	spec = strings.TrimSpace(spec)
	name, rest := splitName(spec)
	l, ours := ParseLibrary(name)
	if !ours {
		return nil
	}
	rest = strings.TrimSpace(rest)
	switch {
	case strings.HasPrefix(rest, "@"):
		return fmt.Errorf("%s is installed from %s: its version is unknown (give it with --versions %s=X.Y.Z)", l, strings.TrimSpace(rest[1:]), l)
	case strings.HasPrefix(rest, "==="):
		rest = rest[3:]
	case strings.HasPrefix(rest, "=="):
		rest = rest[2:]
	case rest == "":
		return fmt.Errorf("%s has no version: pin it (%s==X.Y.Z), or give it with --versions", l, l)
	default:
		return fmt.Errorf("%s is not pinned (%s): a range names no release; give one with ==", l, rest)
	}
	if strings.ContainsAny(rest, ",*") {
		return fmt.Errorf("%s is not pinned to one release (%s)", l, strings.TrimSpace(rest))
	}
	v, err := ParseVersion(rest)
	if err != nil {
		return fmt.Errorf("%s: %w", l, err)
	}
	if s.has[l] {
		return fmt.Errorf("%s listed twice", l)
	}
	*s = s.With(l, v)
	return nil
}

// option reads a line starting with "-": pip's options. An editable install of one of the libraries and
// an included file are refused; index and other options are skipped.
func (s *Set) option(line string) error {
	opt, arg, _ := strings.Cut(line, " ")
	arg = strings.TrimSpace(arg)
	switch {
	case opt == "-e" || opt == "--editable" || strings.HasPrefix(opt, "--editable="):
		if arg == "" {
			arg = strings.TrimPrefix(opt, "--editable=")
		}
		if _, egg, ok := strings.Cut(arg, "#egg="); ok {
			if l, ours := ParseLibrary(strings.SplitN(egg, "&", 2)[0]); ours {
				return fmt.Errorf("%s is an editable install (%s): its version is unknown (give it with --versions %s=X.Y.Z)", l, arg, l)
			}
			return nil
		}
		for _, l := range Libraries {
			if strings.Contains(strings.ToLower(arg), l.String()) {
				return fmt.Errorf("an editable install (%s) may be %s: its version is unknown (give it with --versions)", arg, l)
			}
		}
		return nil
	case opt == "-r" || opt == "-c" || opt == "--requirement" || opt == "--constraint" ||
		strings.HasPrefix(opt, "-r") || strings.HasPrefix(opt, "--requirement="):
		return fmt.Errorf("%s includes another file: give a pip freeze of the environment (pip freeze > requirements.txt)", line)
	}
	return nil
}

// splitName splits a requirement into its name (without extras) and what follows it.
func splitName(spec string) (name, rest string) {
	i := strings.IndexFunc(spec, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	})
	if i < 0 {
		return spec, ""
	}
	name, rest = spec[:i], spec[i:]
	if strings.HasPrefix(rest, "[") {
		if j := strings.Index(rest, "]"); j >= 0 {
			rest = rest[j+1:]
		}
	}
	return name, rest
}
