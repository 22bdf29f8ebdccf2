package train

import (
	"math/rand/v2"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// blobs is a synthetic classification task: each class is a Gaussian blob around its own centre. A small MLP
// separates them in a few hundred steps, so a run on the cpu device shows the loss falling.
type blobs struct {
	rng     *rand.Rand
	centers [][]float32
}

func newBlobs(features, classes int, seed uint64) *blobs {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	b := &blobs{rng: rng, centers: make([][]float32, classes)}
	for c := range b.centers {
		b.centers[c] = make([]float32, features)
		for i := range b.centers[c] {
			b.centers[c][i] = float32(rng.NormFloat64()) * 1.5
		}
	}
	return b
}

// batch puts a batch of n samples on the device: features (n, features) and class indices (n). On a device
// that computes nothing, no values are drawn; the allocations are the same.
func (b *blobs) batch(rt *tensor.Runtime, shape batchShape, role string) (x, y *tensor.Tensor) {
	n := shape.n
	features := len(b.centers[0])
	if !rt.Device().Computes() {
		x = rt.Zeros(tensor.F32, []int{n, features}, role+".x", snapshot.CategoryInput)
		y = rt.Zeros(tensor.I64, []int{n}, role+".y", snapshot.CategoryInput)
		return x, y
	}
	xs := make([]float32, 0, n*features)
	ys := make([]float32, n)
	for i := range n {
		c := b.rng.IntN(len(b.centers))
		ys[i] = float32(c)
		for _, v := range b.centers[c] {
			xs = append(xs, v+float32(b.rng.NormFloat64()))
		}
	}
	x = rt.FromValues(tensor.F32, []int{n, features}, xs, role+".x", snapshot.CategoryInput)
	y = rt.FromValues(tensor.I64, []int{n}, ys, role+".y", snapshot.CategoryInput)
	return x, y
}

// accuracy is the share of rows whose largest logit is the label (0 on a device that computes nothing).
func accuracy(logits, y *tensor.Tensor, classes int) float32 {
	lv, yv := logits.Values(), y.Values()
	if lv == nil {
		return 0
	}
	right := 0
	for i, label := range yv {
		row := lv[i*classes : (i+1)*classes]
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		if best == int(label) {
			right++
		}
	}
	return float32(right) / float32(len(yv))
}
