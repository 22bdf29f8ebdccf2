package train

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Variable-length sequences. Real text is not cut into blocks of one length: each sample has its own number of
// tokens, and a padding collator pads a batch to one length before it goes to the device. SeqDist is where
// each sample's length comes from (--seq-dist), Padding how a batch is padded (--padding), and
// Config.SortByLength whether the sampler groups samples of similar length into a batch (--sort-by-length).
// The loop draws every micro-batch's lengths from a lengthSampler and hands the model a (batch, T) input, so
// every activation of that step has T in its shape, as in PyTorch with dynamic padding.

// SeqDist is the distribution of sample lengths in tokens (--seq-dist): fixed (every sample is Config.Seq
// long: the zero value, and what runs did before lengths varied), uniform:MIN:MAX, lognormal:MEDIAN:SIGMA:MAX
// (the long tail of real text, cut at MAX), or file:PATH (the lengths of a real dataset, one per line, drawn
// with replacement). Lengths longer than Config.Seq, the model's context, are cut to it, as a tokenizer with
// truncation does.
type SeqDist struct {
	kind          seqDistKind
	min, max      int     // uniform: MIN and MAX; lognormal: MAX
	median, sigma float64 // lognormal
	file          *LengthFile
}

type seqDistKind uint8

const (
	seqFixed seqDistKind = iota
	seqUniform
	seqLognormal
	seqFile
)

// Bounds on what a SeqDist holds.
const (
	// MaxSeqLength is the longest sample length a distribution may name: 16M tokens, past any context.
	MaxSeqLength = 1 << 24
	// MaxLengthFileBytes is the most a file:PATH may hold: 64 MiB, tens of millions of lengths.
	MaxLengthFileBytes = 64 << 20
	// MaxDistinctLengths is the most distinct lengths a file may hold. A recording stores them with their
	// counts in its metadata (at most 1 MiB), so that it says exactly how to reproduce the run without the
	// file.
	MaxDistinctLengths = 16384
	// maxSigma bounds the lognormal's sigma: e^(3*10) is past any length already.
	maxSigma = 10
)

// UniformSeq draws lengths uniformly from [lo, hi].
func UniformSeq(lo, hi int) SeqDist { return SeqDist{kind: seqUniform, min: lo, max: hi} }

// LognormalSeq draws lengths from a lognormal distribution of the given median and sigma (of the log), cut to
// [1, hi].
func LognormalSeq(median, sigma float64, hi int) SeqDist {
	return SeqDist{kind: seqLognormal, median: median, sigma: sigma, max: hi}
}

// FileSeq draws lengths from a file's, with replacement.
func FileSeq(f *LengthFile) SeqDist { return SeqDist{kind: seqFile, file: f} }

// ParseSeqDist reads a --seq-dist setting: fixed, uniform:MIN:MAX, lognormal:MEDIAN:SIGMA:MAX or file:PATH
// ("" is fixed). A file is read here, once, and bounded: at most MaxLengthFileBytes and MaxDistinctLengths
// distinct lengths.
func ParseSeqDist(s string) (SeqDist, error) {
	if path, ok := strings.CutPrefix(s, "file:"); ok {
		f, err := ReadLengthFile(path)
		if err != nil {
			return SeqDist{}, err
		}
		return FileSeq(f), nil
	}
	return parseSeqDistWords(s)
}

// parseSeqDistWords parses every form but file:PATH.
func parseSeqDistWords(s string) (SeqDist, error) {
	kind, args, _ := strings.Cut(s, ":")
	fields := strings.Split(args, ":")
	bad := func(want string) (SeqDist, error) {
		return SeqDist{}, fmt.Errorf("seq-dist %q: want %s", s, want)
	}
	switch kind {
	case "", "fixed":
		if args != "" || strings.Contains(s, ":") {
			return bad("fixed, with no parameters")
		}
		return SeqDist{}, nil
	case "uniform":
		const want = "uniform:MIN:MAX with 1 <= MIN <= MAX <= 16777216"
		if len(fields) != 2 {
			return bad(want)
		}
		lo, err1 := strconv.Atoi(fields[0])
		hi, err2 := strconv.Atoi(fields[1])
		if err1 != nil || err2 != nil || lo < 1 || hi < lo || hi > MaxSeqLength {
			return bad(want)
		}
		return UniformSeq(lo, hi), nil
	case "lognormal":
		const want = "lognormal:MEDIAN:SIGMA:MAX with MEDIAN > 0, 0 <= SIGMA <= 10 and 1 <= MAX <= 16777216"
		if len(fields) != 3 {
			return bad(want)
		}
		median, err1 := strconv.ParseFloat(fields[0], 64)
		sigma, err2 := strconv.ParseFloat(fields[1], 64)
		hi, err3 := strconv.Atoi(fields[2])
		if err1 != nil || err2 != nil || err3 != nil || !(median > 0) || math.IsInf(median, 0) ||
			!(sigma >= 0 && sigma <= maxSigma) || hi < 1 || hi > MaxSeqLength {
			return bad(want)
		}
		return LognormalSeq(median, sigma, hi), nil
	}
	return SeqDist{}, fmt.Errorf("unknown seq-dist %q (want fixed, uniform:MIN:MAX, lognormal:MEDIAN:SIGMA:MAX or file:PATH)", s)
}

func (d SeqDist) String() string {
	switch d.kind {
	case seqUniform:
		return fmt.Sprintf("uniform:%d:%d", d.min, d.max)
	case seqLognormal:
		return "lognormal:" + strconv.FormatFloat(d.median, 'g', -1, 64) + ":" + strconv.FormatFloat(d.sigma, 'g', -1, 64) + ":" + strconv.Itoa(d.max)
	case seqFile:
		return "file:" + d.file.Path
	}
	return "fixed"
}

// IsZero reports whether d is fixed, so that a Config's JSON leaves it out as it always did.
func (d SeqDist) IsZero() bool { return d.kind == seqFixed }

// Fixed reports whether every sample is Config.Seq long.
func (d SeqDist) Fixed() bool { return d.kind == seqFixed }

// Max returns the longest length d draws before truncation to the context (0 for fixed: the context).
func (d SeqDist) Max() int {
	switch d.kind {
	case seqUniform, seqLognormal:
		return d.max
	case seqFile:
		return d.file.Max()
	}
	return 0
}

// MarshalText writes the setting as it is given on the command line.
func (d SeqDist) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads the setting as given on the command line; file:PATH reads the file.
func (d *SeqDist) UnmarshalText(text []byte) error { return parseInto(d, ParseSeqDist, text) }

// seqDistJSON is a file distribution in a Config's JSON: the path it was read from, for people, and the
// lengths with their counts, for the run.
type seqDistJSON struct {
	File   string     `json:"file"`
	Counts [][2]int64 `json:"counts"`
}

// MarshalJSON writes the setting as its word, or for a file as the path and every distinct length with its
// count: a snapshot reproduces its run without the file.
func (d SeqDist) MarshalJSON() ([]byte, error) {
	if d.kind != seqFile {
		return json.Marshal(d.String())
	}
	out := seqDistJSON{File: d.file.Path, Counts: make([][2]int64, len(d.file.lengths))}
	for i, l := range d.file.lengths {
		out.Counts[i] = [2]int64{int64(l), d.file.counts[i]}
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads what MarshalJSON writes. A configuration read from JSON (a snapshot, perhaps someone
// else's) never makes oomdbg open a file: "file:PATH" as a word is refused, and the counts are checked as
// hostile input.
func (d *SeqDist) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		if strings.HasPrefix(s, "file:") {
			return fmt.Errorf("seq-dist %q: a stored configuration carries a file's lengths, not its path", s)
		}
		v, err := parseSeqDistWords(s)
		if err != nil {
			return err
		}
		*d = v
		return nil
	}
	var in seqDistJSON
	if err := json.Unmarshal(data, &in); err != nil {
		return fmt.Errorf("seq-dist: %w", err)
	}
	f, err := lengthFileFromCounts(in.File, in.Counts)
	if err != nil {
		return err
	}
	*d = FileSeq(f)
	return nil
}

// LengthFile is the lengths of a file:PATH distribution: each distinct length and how often it occurs.
type LengthFile struct {
	Path    string
	lengths []int32 // distinct, increasing
	counts  []int64
	cum     []int64 // cum[i]: samples of lengths[0..i]
}

// Samples returns how many lengths the file held.
func (f *LengthFile) Samples() int64 { return f.cum[len(f.cum)-1] }

// Max returns the file's longest length.
func (f *LengthFile) Max() int { return int(f.lengths[len(f.lengths)-1]) }

// draw returns the length of sample u, 0 <= u < Samples(): lengths in increasing order, each repeated its
// count.
func (f *LengthFile) draw(u int64) int {
	i, _ := slices.BinarySearch(f.cum, u+1)
	return int(f.lengths[i])
}

// ReadLengthFile reads a file of sample lengths: one positive integer per line (blank lines are skipped),
// such as the token counts of a dataset's samples. It reads at most MaxLengthFileBytes and refuses, in one
// line naming the file and the line, anything else.
func ReadLengthFile(path string) (*LengthFile, error) {
	what := "seq-dist file:" + path
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, unwrapPath(err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxLengthFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, unwrapPath(err))
	}
	if len(data) > MaxLengthFileBytes {
		return nil, fmt.Errorf("%s: larger than %d MiB; give the lengths of a sample of the dataset", what, MaxLengthFileBytes>>20)
	}
	return parseLengths(path, data)
}

// parseLengths reads the lengths of a file's contents.
func parseLengths(path string, data []byte) (*LengthFile, error) {
	what := "seq-dist file:" + path
	count := map[int32]int64{}
	line := 0
	for len(data) > 0 {
		var text []byte
		text, data, _ = bytes.Cut(data, []byte{'\n'})
		line++
		text = bytes.TrimSpace(text)
		if len(text) == 0 {
			continue
		}
		n, err := strconv.Atoi(string(text))
		if err != nil || n < 1 || n > MaxSeqLength {
			return nil, fmt.Errorf("%s line %d: %s is not a length (want one integer from 1 to %d per line)", what, line, quoteShort(text), MaxSeqLength)
		}
		if _, seen := count[int32(n)]; !seen && len(count) == MaxDistinctLengths {
			return nil, fmt.Errorf("%s line %d: more than %d distinct lengths; round them (e.g. to a multiple of 8)", what, line, MaxDistinctLengths)
		}
		count[int32(n)]++
	}
	if len(count) == 0 {
		return nil, fmt.Errorf("%s: holds no lengths (want one integer from 1 to %d per line)", what, MaxSeqLength)
	}
	lf := &LengthFile{Path: path}
	for l := range count {
		lf.lengths = append(lf.lengths, l)
	}
	slices.Sort(lf.lengths)
	for _, l := range lf.lengths {
		lf.counts = append(lf.counts, count[l])
	}
	lf.sum()
	return lf, nil
}

// unwrapPath drops the *PathError's own copy of the path, which the message already names.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// quoteShort quotes the start of a line for a message: a binary file's line can be megabytes.
func quoteShort(b []byte) string {
	const most = 24
	if len(b) > most {
		return strconv.Quote(string(b[:most])) + "…"
	}
	return strconv.Quote(string(b))
}

// lengthFileFromCounts rebuilds a LengthFile from its JSON form, checking it as MarshalJSON would write it.
func lengthFileFromCounts(path string, counts [][2]int64) (*LengthFile, error) {
	switch {
	case len(counts) == 0:
		return nil, errors.New("seq-dist file: no lengths")
	case len(counts) > MaxDistinctLengths:
		return nil, fmt.Errorf("seq-dist file: %d distinct lengths, more than %d", len(counts), MaxDistinctLengths)
	case len(path) > 4096:
		return nil, errors.New("seq-dist file: a path longer than 4096 bytes")
	}
	lf := &LengthFile{Path: path}
	prev := int64(0)
	for _, c := range counts {
		l, n := c[0], c[1]
		if l <= prev || l > MaxSeqLength || n < 1 || n > MaxLengthFileBytes {
			return nil, fmt.Errorf("seq-dist file: length %d with count %d: want increasing lengths from 1 to %d, each counted 1 to %d times",
				l, n, MaxSeqLength, MaxLengthFileBytes)
		}
		prev = l
		lf.lengths = append(lf.lengths, int32(l))
		lf.counts = append(lf.counts, n)
	}
	lf.sum()
	return lf, nil
}

func (f *LengthFile) sum() {
	f.cum = make([]int64, len(f.counts))
	var total int64
	for i, n := range f.counts {
		total += n
		f.cum[i] = total
	}
}

// Padding is how a padding collator pads a batch (--padding): none pads each batch to its longest sample
// (dynamic padding, DataCollatorWithPadding's default: the zero value), max pads every batch to Config.Seq
// (padding="max_length"), multiple:N pads the longest sample up to a multiple of N (pad_to_multiple_of=N,
// kept within Config.Seq).
type Padding struct {
	multiple int // 0: none; -1: max; N > 0: multiple of N
}

// The padding settings without a parameter.
var (
	PaddingNone = Padding{}
	PaddingMax  = Padding{multiple: -1}
)

// MaxPadMultiple bounds multiple:N.
const MaxPadMultiple = 1 << 20

// PadToMultiple pads the longest sample of a batch up to a multiple of n (n > 0).
func PadToMultiple(n int) Padding { return Padding{multiple: n} }

// ParsePadding reads a --padding setting: none, max or multiple:N ("" is none).
func ParsePadding(s string) (Padding, error) {
	switch {
	case s == "" || s == "none":
		return PaddingNone, nil
	case s == "max":
		return PaddingMax, nil
	case strings.HasPrefix(s, "multiple:"):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "multiple:"))
		if err != nil || n < 1 || n > MaxPadMultiple {
			return PaddingNone, fmt.Errorf("padding %q: N must be an integer from 1 to %d", s, MaxPadMultiple)
		}
		return PadToMultiple(n), nil
	}
	return PaddingNone, fmt.Errorf("unknown padding %q (want none, max or multiple:N)", s)
}

func (p Padding) String() string {
	switch {
	case p.multiple < 0:
		return "max"
	case p.multiple > 0:
		return "multiple:" + strconv.Itoa(p.multiple)
	}
	return "none"
}

func (p Padding) MarshalText() ([]byte, error)     { return []byte(p.String()), nil }
func (p *Padding) UnmarshalText(text []byte) error { return parseInto(p, ParsePadding, text) }

// IsZero reports whether p is none, so that a Config's JSON leaves it out as it always did.
func (p Padding) IsZero() bool { return p.multiple == 0 }

// pad returns the length a batch whose longest sample is longest is padded to, within context.
func (p Padding) pad(longest, context int) int {
	switch {
	case p.multiple < 0:
		return context
	case p.multiple > 0:
		return min((longest+p.multiple-1)/p.multiple*p.multiple, context)
	}
	return longest
}

// validateLengths checks the length settings against the model: they apply to sequence models, and a
// distribution's MAX must fit the context (a file's lengths are cut to it instead, as a tokenizer does).
func (c *Config) validateLengths() error {
	if c.Model == "mlp" {
		if !c.SeqDist.Fixed() || !c.Padding.IsZero() || c.SortByLength {
			return fmt.Errorf("seq-dist, padding and sort-by-length apply to sequence models, not the mlp")
		}
		return nil
	}
	switch d := c.SeqDist; d.kind {
	case seqUniform, seqLognormal:
		if d.max > c.Seq {
			return fmt.Errorf("seq-dist %s: MAX %d is longer than the context, seq %d", d, d.max, c.Seq)
		}
	case seqFixed, seqFile:
	default:
		return fmt.Errorf("invalid seq-dist %s", d)
	}
	if m := c.Padding.multiple; m < -1 || m > MaxPadMultiple {
		return fmt.Errorf("invalid padding %s", c.Padding)
	}
	return nil
}
