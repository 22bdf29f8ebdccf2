package train

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

func TestParseSeqDist(t *testing.T) {
	for _, s := range []string{"fixed", "uniform:1:1", "uniform:64:1024", "lognormal:300:0.6:1024", "lognormal:12.5:0:16"} {
		d, err := ParseSeqDist(s)
		if err != nil || d.String() != s {
			t.Errorf("%q: %v, %v", s, d, err)
		}
	}
	if d, err := ParseSeqDist(""); err != nil || !d.Fixed() {
		t.Errorf(`"" reads as %v, %v; want fixed`, d, err)
	}
	bad := map[string]string{
		"uniform:0:10":            "want uniform:MIN:MAX",
		"uniform:10:9":            "want uniform:MIN:MAX",
		"uniform:1:99999999":      "want uniform:MIN:MAX",
		"uniform:1":               "want uniform:MIN:MAX",
		"lognormal:0:1:10":        "want lognormal:MEDIAN:SIGMA:MAX",
		"lognormal:NaN:1:10":      "want lognormal:MEDIAN:SIGMA:MAX",
		"lognormal:10:-1:10":      "want lognormal:MEDIAN:SIGMA:MAX",
		"lognormal:10:Inf:10":     "want lognormal:MEDIAN:SIGMA:MAX",
		"lognormal:10:1:0":        "want lognormal:MEDIAN:SIGMA:MAX",
		"fixed:3":                 "want fixed, with no parameters",
		"zipf:1":                  `unknown seq-dist "zipf:1"`,
		"file:/does/not/exist":    "seq-dist file:/does/not/exist: no such file or directory",
		"file:" + os.DevNull:      "holds no lengths",
		"file:" + os.TempDir():    "is a directory",
		"lognormal:300:0.6:1024:": "want lognormal",
	}
	for s, want := range bad {
		if _, err := ParseSeqDist(s); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v, want one line saying %q", s, err, want)
		}
	}
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "lengths.txt")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLengthFile(t *testing.T) {
	path := writeFile(t, "12\n\n 7 \n12\r\n900\n12")
	f, err := ReadLengthFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Counted by hand: 7 once, 12 three times, 900 once.
	if f.Samples() != 5 || f.Max() != 900 || !slices.Equal(f.lengths, []int32{7, 12, 900}) || !slices.Equal(f.counts, []int64{1, 3, 1}) {
		t.Errorf("read %v %v", f.lengths, f.counts)
	}
	for u, want := range []int{7, 12, 12, 12, 900} {
		if got := f.draw(int64(u)); got != want {
			t.Errorf("draw(%d) = %d, want %d", u, got, want)
		}
	}

	bad := map[string]string{
		"12\n-3\n":              `line 2: "-3" is not a length`,
		"12\n0x10\n":            `line 2: "0x10" is not a length`,
		"1e3\n":                 `line 1: "1e3" is not a length`,
		"16777217\n":            `line 1: "16777217" is not a length`,
		strings.Repeat("9", 99): `line 1: "999999999999999999999999"… is not a length`,
		"\x00\x01\x02":          `line 1: "\x00\x01\x02" is not a length`,
		"\n\n  \n":              "holds no lengths",
	}
	for text, want := range bad {
		_, err := ReadLengthFile(writeFile(t, text))
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v, want one line saying %q", text, err, want)
		}
	}

	// Too many distinct lengths for a snapshot's metadata.
	var b strings.Builder
	for i := range MaxDistinctLengths + 1 {
		b.WriteString(strconv.Itoa(i+1) + "\n")
	}
	if _, err := ReadLengthFile(writeFile(t, b.String())); err == nil || !strings.Contains(err.Error(), "more than 16384 distinct lengths") {
		t.Errorf("16385 distinct lengths: %v", err)
	}

	// A file past the size limit is refused after reading one byte past it, not read whole.
	big := filepath.Join(t.TempDir(), "big.txt")
	fh, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := fh.Truncate(MaxLengthFileBytes + 1); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	if _, err := ReadLengthFile(big); err == nil || !strings.Contains(err.Error(), "larger than 64 MiB") {
		t.Errorf("a 64 MiB + 1 file: %v", err)
	}
}

// TestSeqDistJSON checks the settings survive a Config's JSON, a file's lengths included, and that a stored
// configuration never names a file to read.
func TestSeqDistJSON(t *testing.T) {
	f, err := ReadLengthFile(writeFile(t, "5\n9\n9\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{
		func() Config { c := tinyGPT(); c.SeqDist = UniformSeq(3, 40); c.Padding = PadToMultiple(8); return c }(),
		func() Config {
			c := tinyGPT()
			c.SeqDist, c.Padding, c.SortByLength, c.EmptyCache = LognormalSeq(20, 0.5, 64), PaddingMax, true, EmptyCachePhase
			return c
		}(),
		func() Config { c := tinyGPT(); c.SeqDist = FileSeq(f); return c }(),
	} {
		blob, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var back Config
		if err := json.Unmarshal(blob, &back); err != nil {
			t.Fatalf("%s: %v", blob, err)
		}
		again, _ := json.Marshal(back)
		if string(again) != string(blob) || back.SeqDist.String() != c.SeqDist.String() || back.Padding != c.Padding ||
			back.SortByLength != c.SortByLength || back.EmptyCache != c.EmptyCache {
			t.Errorf("round trip changed\n%s\n%s", blob, again)
		}
		if c.SeqDist.kind == seqFile {
			if !strings.Contains(string(blob), `"seq_dist":{"file":"`) || !strings.Contains(string(blob), `"counts":[[5,1],[9,2]]`) {
				t.Errorf("a file distribution is stored as %s", blob)
			}
		}
	}
	bad := map[string]string{
		`{"seq_dist":"file:/etc/passwd"}`:                  "carries a file's lengths, not its path",
		`{"seq_dist":{"file":"x","counts":[]}}`:            "no lengths",
		`{"seq_dist":{"file":"x","counts":[[5,1],[5,1]]}}`: "want increasing lengths",
		`{"seq_dist":{"file":"x","counts":[[0,1]]}}`:       "want increasing lengths",
		`{"seq_dist":{"file":"x","counts":[[5,0]]}}`:       "want increasing lengths",
		`{"seq_dist":"uniform:5"}`:                         "want uniform:MIN:MAX",
		`{"padding":"multiple:0"}`:                         "N must be an integer from 1",
		`{"padding":"some"}`:                               `unknown padding "some"`,
		`{"empty_cache":"always"}`:                         `unknown empty-cache "always" (want never, step or phase)`,
	}
	for blob, want := range bad {
		var c Config
		if err := json.Unmarshal([]byte(blob), &c); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", blob, err, want)
		}
	}
}

func tinyGPT() Config {
	c, err := PresetConfig("tiny")
	if err != nil {
		panic(err)
	}
	c.Device, c.Steps = "meta", 2
	return c
}

func TestPadding(t *testing.T) {
	// pad(longest, context), by hand from the settings' definitions.
	cases := []struct {
		p             Padding
		longest, want int
	}{
		{PaddingNone, 979, 979},
		{PaddingMax, 979, 1024},
		{PadToMultiple(64), 979, 1024}, // 979 / 64 = 15.3: 16 * 64
		{PadToMultiple(64), 960, 960},
		{PadToMultiple(8), 1, 8},
		{PadToMultiple(100), 1001, 1024}, // 1100 is past the context: kept within it
	}
	for _, c := range cases {
		if got := c.p.pad(c.longest, 1024); got != c.want {
			t.Errorf("%s pads %d to %d, want %d", c.p, c.longest, got, c.want)
		}
	}
	for _, s := range []string{"none", "max", "multiple:1", "multiple:64"} {
		if p, err := ParsePadding(s); err != nil || p.String() != s {
			t.Errorf("%q: %v, %v", s, p, err)
		}
	}
}

// TestSampler holds the drawn lengths against the distributions' own definitions.
func TestSampler(t *testing.T) {
	const n = 20000
	draws := func(d SeqDist, context int) []int {
		s := &lengthSampler{dist: d, context: context, rng: newLengthSampler(&Config{Seed: 7}).rng}
		out := make([]int, n)
		for i := range out {
			out[i] = s.draw()
		}
		return out
	}
	mean := func(xs []int) float64 {
		var s float64
		for _, x := range xs {
			s += float64(x)
		}
		return s / float64(len(xs))
	}

	u := draws(UniformSeq(64, 1024), 1024)
	if slices.Min(u) != 64 || slices.Max(u) != 1024 {
		t.Errorf("uniform:64:1024 drew from %d to %d", slices.Min(u), slices.Max(u))
	}
	// The mean of a discrete uniform on [64, 1024] is 544; its standard error over n draws is 277/sqrt(n) ≈ 2.
	if m := mean(u); math.Abs(m-544) > 10 {
		t.Errorf("uniform:64:1024 mean %.1f, want 544", m)
	}

	// A lognormal's median is e^mu: MEDIAN. A quarter of the draws lie above MEDIAN * e^(0.6745 sigma).
	l := draws(LognormalSeq(300, 0.6, 4096), 4096)
	sorted := slices.Clone(l)
	slices.Sort(sorted)
	if med := sorted[n/2]; math.Abs(float64(med)-300) > 8 {
		t.Errorf("lognormal:300:0.6 median %d, want 300", med)
	}
	if q3, want := sorted[3*n/4], 300*math.Exp(0.6745*0.6); math.Abs(float64(q3)-want) > 12 {
		t.Errorf("lognormal:300:0.6 upper quartile %d, want %.0f", q3, want)
	}
	// MAX cuts the tail: e^(0.6 * 3.5) * 300 = 2449 is drawn about once in 4300; cut at 1024 many are.
	cut := draws(LognormalSeq(300, 0.6, 1024), 1024)
	if slices.Max(cut) != 1024 {
		t.Errorf("lognormal:300:0.6:1024 drew up to %d", slices.Max(cut))
	}
	// The context cuts too: lengths past seq are truncated as a tokenizer does.
	if c := draws(UniformSeq(10, 100), 50); slices.Max(c) != 50 || slices.Min(c) != 10 {
		t.Errorf("uniform:10:100 in a context of 50 drew %d to %d", slices.Min(c), slices.Max(c))
	}

	// A file's lengths come back in proportion to their counts: 5 once in four, 9 three times in four.
	f, err := lengthFileFromCounts("x", [][2]int64{{5, 1}, {9, 3}})
	if err != nil {
		t.Fatal(err)
	}
	fd := draws(FileSeq(f), 1024)
	fives := 0
	for _, x := range fd {
		if x == 5 {
			fives++
		} else if x != 9 {
			t.Fatalf("file drew %d", x)
		}
	}
	if frac := float64(fives) / n; math.Abs(frac-0.25) > 0.015 {
		t.Errorf("file drew 5 in %.3f of the draws, want 0.25", frac)
	}
}

// TestSortByLength checks the length-grouped sampler against transformers' get_length_grouped_indices:
// megabatches of 50 batches, each sorted longest first and cut into consecutive batches.
func TestSortByLength(t *testing.T) {
	cfg := tinyGPT()
	cfg.Seq, cfg.Batch, cfg.SeqDist = 512, 4, UniformSeq(1, 512)
	plain := newLengthSampler(&cfg)
	cfg.SortByLength = true
	sorted := newLengthSampler(&cfg)
	var all, mega []int
	for range 50 {
		b := sorted.next(cfg.Batch)
		if b.t != slices.Max(b.lengths) {
			t.Fatalf("padded to %d, longest %d", b.t, slices.Max(b.lengths))
		}
		mega = append(mega, b.lengths...)
	}
	if !slices.IsSortedFunc(mega, func(a, b int) int { return b - a }) {
		t.Errorf("a megabatch is not longest first: %v", mega)
	}
	// The same draws as the plain sampler's, in another order: grouping changes the order, not the data.
	for range 50 {
		all = append(all, plain.next(cfg.Batch).lengths...)
	}
	slices.Sort(all)
	slices.Sort(mega)
	if !slices.Equal(all, mega) {
		t.Error("the grouped sampler drew other lengths than the plain one")
	}
}

// TestVariableLengthRun checks a recorded run's batches, for every sequence model: each micro-batch is
// (batch, T) with T the padded length of the step, the model's activations follow T, and the run reproduces
// with the same seed.
func TestVariableLengthRun(t *testing.T) {
	for name, cfg := range map[string]Config{"gpt": tinyGPT(), "llama": smallLlama(t)} {
		t.Run(name, func(t *testing.T) {
			cfg.Device = "meta"
			cfg.Steps, cfg.Batch, cfg.Seq, cfg.SeqDist, cfg.Padding = 6, 2, 32, UniformSeq(4, 32), PadToMultiple(8)
			variableLengthRun(t, cfg)
		})
	}
}

func variableLengthRun(t *testing.T, cfg Config) {
	res, _, err := Run(context.Background(), cfg, nil)
	if err != nil || res.OOM != nil {
		t.Fatal(err, res.OOM)
	}
	again, _, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ts []int
	for i, st := range res.StepStats {
		if len(st.SeqLens) != 1 {
			t.Fatalf("step %d drew %d batches", i, len(st.SeqLens))
		}
		T := st.SeqLens[0]
		if T%8 != 0 || T < 8 || T > 32 {
			t.Errorf("step %d padded to %d, not a multiple of 8 within 32", i, T)
		}
		if st.PaddedTokens != int64(cfg.Batch*T) || st.Tokens > st.PaddedTokens || st.Tokens < int64(cfg.Batch*4) {
			t.Errorf("step %d: %d tokens, %d with padding, T %d", i, st.Tokens, st.PaddedTokens, T)
		}
		if !slices.Equal(st.SeqLens, again.StepStats[i].SeqLens) || st.Tokens != again.StepStats[i].Tokens {
			t.Errorf("step %d differs between two runs of one seed", i)
		}
		ts = append(ts, T)
	}
	if slices.Min(ts) == slices.Max(ts) {
		t.Errorf("every step had length %d", ts[0])
	}

	// The recording: the batch of step i is i64[batch, T] (8 bytes a token), and the token embedding's
	// output f32[batch, T, d_model].
	var buf bytes.Buffer
	if _, err := Record(context.Background(), cfg, &buf, RecordOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]int64{}
	for _, e := range s.Events.All() {
		if e.Action == snapshot.ActionAlloc && e.Iteration >= 0 {
			found[fmt.Sprintf("%d %s", e.Iteration, s.String(e.Label))] = e.Size
		}
	}
	for i, T := range ts {
		x := fmt.Sprintf("%d i64[%d,%d] batch.x", i, cfg.Batch, T)
		emb := fmt.Sprintf("%d f32[%d,%d,%d] embedding.out", i, cfg.Batch, T, cfg.DModel)
		if found[x] != int64(cfg.Batch*T*8) || found[emb] != int64(cfg.Batch*T*cfg.DModel*4) {
			t.Errorf("step %d: %q is %d bytes, %q %d; want %d and %d", i, x, found[x], emb, found[emb], cfg.Batch*T*8, cfg.Batch*T*cfg.DModel*4)
		}
	}

	cfg.Seed++
	other, _, _ := Run(context.Background(), cfg, nil)
	same := true
	for i := range other.StepStats {
		same = same && slices.Equal(other.StepStats[i].SeqLens, res.StepStats[i].SeqLens)
	}
	if same {
		t.Error("another seed drew the same lengths")
	}
}
