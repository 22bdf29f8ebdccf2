package train

import (
	"math/rand/v2"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// tinyText is the built-in corpus of the tiny preset, learned character by character.
const tinyText = `the allocator rounds every request up to a multiple of five hundred and twelve bytes.
small requests share two megabyte segments; large ones get segments of their own.
a freed block goes back to the cache, not to the device, so reserved memory stays high.
activations saved for backward are the largest part of memory in a transformer.
checkpointing keeps only the inputs of each block and recomputes the rest during backward.
mixed precision halves the bytes of every activation and keeps the weights in float32.
the optimizer allocates its state at the first step, which is where many runs run out of memory.
`

// tinyVocab is the sorted set of characters of tinyText.
var tinyVocab = func() []rune {
	seen := map[rune]bool{}
	var v []rune
	for _, r := range tinyText {
		if !seen[r] {
			seen[r] = true
			v = append(v, r)
		}
	}
	slices.Sort(v)
	return v
}()

// tokens is a next-token task: windows of the built-in text when the vocabulary is its characters, else
// sequences of a random permutation walk (each token usually followed by its successor in a fixed
// permutation), which any GPT can learn.
type tokens struct {
	rng   *rand.Rand
	text  []int // the encoded text, or nil
	perm  []int // made at the first sequence: the meta device, which makes none, skips a vocabulary's worth
	vocab int
	// labelsAreInputs makes the targets a copy of the inputs, as HF's causal-LM collator makes labels
	// (input_ids.clone()): the model shifts them itself.
	labelsAreInputs bool
	// classes, when set, makes the targets one class a sample (sequence classification): its first token's
	// remainder, which a classifier can learn.
	classes int
}

func newTokens(vocab int, seed uint64) *tokens {
	rng := rand.New(rand.NewPCG(seed, 0x70c5))
	d := &tokens{rng: rng, vocab: vocab}
	if vocab == len(tinyVocab) {
		index := map[rune]int{}
		for i, r := range tinyVocab {
			index[r] = i
		}
		for _, r := range tinyText {
			d.text = append(d.text, index[r])
		}
	}
	return d
}

// batch puts a batch on the device: inputs (n, t) and the next tokens as targets (n, t), or a copy of the
// inputs as labels. A sample shorter than t is followed by padding: token 0 in the inputs and the targets
// (the loss counts padded positions too: the runtime's cross-entropy has no ignore_index; the memory is the
// same).
func (d *tokens) batch(rt *tensor.Runtime, b batchShape, role string) (x, y *tensor.Tensor) {
	shape := []int{b.n, b.t}
	yShape := shape
	if d.classes > 0 {
		yShape = []int{b.n}
	}
	if !rt.Device().Computes() {
		return rt.Zeros(tensor.I64, shape, role+".x", snapshot.CategoryInput), rt.Zeros(tensor.I64, yShape, role+".y", snapshot.CategoryInput)
	}
	xs, ys := make([]float32, b.n*b.t), make([]float32, b.n*b.t)
	for i := range b.n {
		n := b.t
		if b.lengths != nil {
			n = b.lengths[i]
		}
		seq := d.sequence(n)
		for j := range n {
			xs[i*b.t+j] = float32(seq[j])
			if d.labelsAreInputs {
				ys[i*b.t+j] = float32(seq[j])
			} else {
				ys[i*b.t+j] = float32(seq[j+1])
			}
		}
	}
	if d.classes > 0 {
		ys = ys[:b.n]
		for i := range ys {
			ys[i] = float32(int(xs[i*b.t]) % d.classes)
		}
	}
	return rt.FromValues(tensor.I64, shape, xs, role+".x", snapshot.CategoryInput),
		rt.FromValues(tensor.I64, yShape, ys, role+".y", snapshot.CategoryInput)
}

// sequence returns n+1 tokens.
func (d *tokens) sequence(n int) []int {
	if d.text != nil {
		start := d.rng.IntN(len(d.text) - n - 1)
		return d.text[start : start+n+1]
	}
	if d.perm == nil { // the rng's first draws, as when the permutation was made with the dataset
		d.perm = d.rng.Perm(d.vocab)
	}
	s := make([]int, n+1)
	s[0] = d.rng.IntN(d.vocab)
	for i := 1; i <= n; i++ {
		if d.rng.Float32() < 0.9 {
			s[i] = d.perm[s[i-1]]
		} else {
			s[i] = d.rng.IntN(d.vocab)
		}
	}
	return s
}
