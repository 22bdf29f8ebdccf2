package device

import (
	"math"
	"slices"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// The CPU device's math: float32 kernels over contiguous row-major buffers. Each takes its dimensions
// explicitly and writes into a destination the caller allocated, so the tensor layer decides every allocation
// (and so the memory trace) and the kernels only compute.

// Gemm computes c = alpha * op(a) * op(b) + beta * c, where op(x) is x or its transpose, op(a) is m x k and
// op(b) is k x n. lda, ldb and ldc are the row strides of a, b and c as stored.
func Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	ga := blas32.General{Rows: m, Cols: k, Stride: lda, Data: a}
	ta := blas.NoTrans
	if transA {
		ga.Rows, ga.Cols, ta = k, m, blas.Trans
	}
	gb := blas32.General{Rows: k, Cols: n, Stride: ldb, Data: b}
	tb := blas.NoTrans
	if transB {
		gb.Rows, gb.Cols, tb = n, k, blas.Trans
	}
	if k == 0 { // gonum rejects empty inner dimensions; the product is zero
		Scale(c[:(m-1)*ldc+n], beta)
		return
	}
	blas32.Gemm(ta, tb, alpha, ga, gb, beta, blas32.General{Rows: m, Cols: n, Stride: ldc, Data: c})
}

// Fill sets every element of dst to v.
func Fill(dst []float32, v float32) {
	for i := range dst {
		dst[i] = v
	}
}

// Scale multiplies every element of dst by s.
func Scale(dst []float32, s float32) {
	for i := range dst {
		dst[i] *= s
	}
}

// Add sets dst = a + b elementwise; b is broadcast when it is shorter (a row vector repeated, e.g. a bias).
func Add(dst, a, b []float32) {
	if len(b) == len(a) {
		for i := range dst {
			dst[i] = a[i] + b[i]
		}
		return
	}
	n := len(b)
	for i := range dst {
		dst[i] = a[i] + b[i%n]
	}
}

// AddScaled sets dst += s * a (axpy).
func AddScaled(dst []float32, s float32, a []float32) {
	for i := range dst {
		dst[i] += s * a[i]
	}
}

// Mul sets dst = a * b elementwise; b is broadcast when shorter.
func Mul(dst, a, b []float32) {
	n := len(b)
	for i := range dst {
		dst[i] = a[i] * b[i%n]
	}
}

// SumRows sets dst[j] = Σ_i x[i*cols+j]: the gradient of a broadcast row vector (a bias).
func SumRows(dst, x []float32, cols int) {
	Fill(dst, 0)
	for i := 0; i < len(x); i += cols {
		row := x[i : i+cols]
		for j, v := range row {
			dst[j] += v
		}
	}
}

// Sum returns Σ x, accumulated in float64 so long reductions stay accurate.
func Sum(x []float32) float32 {
	var s float64
	for _, v := range x {
		s += float64(v)
	}
	return float32(s)
}

// ReLU sets dst = max(x, 0).
func ReLU(dst, x []float32) {
	for i, v := range x {
		dst[i] = max(v, 0)
	}
}

// ReLUBackward sets dx = dy where the saved output y > 0, else 0 (PyTorch saves the result).
func ReLUBackward(dx, dy, y []float32) {
	for i := range dx {
		if y[i] > 0 {
			dx[i] = dy[i]
		} else {
			dx[i] = 0
		}
	}
}

// GELU sets dst = x * Φ(x), the exact (erf) form, PyTorch's default.
func GELU(dst, x []float32) {
	for i, v := range x {
		xf := float64(v)
		dst[i] = float32(0.5 * xf * (1 + math.Erf(xf/math.Sqrt2)))
	}
}

// GELUBackward sets dx = dy * (Φ(x) + x φ(x)) from the saved input x.
func GELUBackward(dx, dy, x []float32) {
	const invSqrt2Pi = 0.3989422804014327
	for i, v := range x {
		xf := float64(v)
		cdf := 0.5 * (1 + math.Erf(xf/math.Sqrt2))
		pdf := invSqrt2Pi * math.Exp(-0.5*xf*xf)
		dx[i] = dy[i] * float32(cdf+xf*pdf)
	}
}

// Dropout sets dst = x * mask / (1-p), where mask[i] is 1 with probability 1-p, drawn from rnd (uniform in
// [0,1)). The mask is stored as 0/1 values; it is accounted as one byte per element, as CUDA's.
func Dropout(dst, mask, x []float32, p float32, rnd func() float32) {
	scale := 1 / (1 - p)
	for i, v := range x {
		if rnd() >= p {
			mask[i], dst[i] = 1, v*scale
		} else {
			mask[i], dst[i] = 0, 0
		}
	}
}

// DropoutBackward sets dx = dy * mask / (1-p).
func DropoutBackward(dx, dy, mask []float32, p float32) {
	scale := 1 / (1 - p)
	for i := range dx {
		dx[i] = dy[i] * mask[i] * scale
	}
}

// Softmax sets each row of dst (rows of length cols) to the softmax of the same row of x.
func Softmax(dst, x []float32, cols int) {
	for r := 0; r < len(x); r += cols {
		row, out := x[r:r+cols], dst[r:r+cols]
		m := slices.Max(row) // the shift that keeps exp from overflowing
		var s float64
		for j, v := range row {
			e := math.Exp(float64(v - m))
			out[j] = float32(e)
			s += e
		}
		inv := float32(1 / s)
		for j := range out {
			out[j] *= inv
		}
	}
}

// SoftmaxBackward sets dx = y * (dy - Σ dy*y) per row, from the saved output y.
func SoftmaxBackward(dx, dy, y []float32, cols int) {
	for r := 0; r < len(y); r += cols {
		var dot float64
		for j := r; j < r+cols; j++ {
			dot += float64(dy[j] * y[j])
		}
		for j := r; j < r+cols; j++ {
			dx[j] = y[j] * (dy[j] - float32(dot))
		}
	}
}

// LogSoftmax sets each row of dst to the log-softmax of the same row of x.
func LogSoftmax(dst, x []float32, cols int) {
	for r := 0; r < len(x); r += cols {
		row, out := x[r:r+cols], dst[r:r+cols]
		m := slices.Max(row) // the shift that keeps exp from overflowing
		var s float64
		for _, v := range row {
			s += math.Exp(float64(v - m))
		}
		lse := m + float32(math.Log(s))
		for j, v := range row {
			out[j] = v - lse
		}
	}
}

// LogSoftmaxBackward sets dx = dy - exp(y) * Σ dy per row, from the saved output y.
func LogSoftmaxBackward(dx, dy, y []float32, cols int) {
	for r := 0; r < len(y); r += cols {
		var s float64
		for j := r; j < r+cols; j++ {
			s += float64(dy[j])
		}
		for j := r; j < r+cols; j++ {
			dx[j] = dy[j] - float32(math.Exp(float64(y[j])))*float32(s)
		}
	}
}

// LayerNorm normalises each row of x over cols: dst = (x - mean) * rstd * gamma + beta, and saves each row's
// mean and rstd (1/sqrt(var + eps)) as PyTorch does. gamma and beta may be nil (no affine).
func LayerNorm(dst, mean, rstd, x, gamma, beta []float32, cols int, eps float32) {
	for r, row := 0, 0; r < len(x); r, row = r+cols, row+1 {
		xs := x[r : r+cols]
		var s float64
		for _, v := range xs {
			s += float64(v)
		}
		mu := s / float64(cols)
		var ss float64
		for _, v := range xs {
			d := float64(v) - mu
			ss += d * d
		}
		rs := 1 / math.Sqrt(ss/float64(cols)+float64(eps))
		mean[row], rstd[row] = float32(mu), float32(rs)
		out := dst[r : r+cols]
		for j, v := range xs {
			y := float32((float64(v) - mu) * rs)
			if gamma != nil {
				y *= gamma[j]
			}
			if beta != nil {
				y += beta[j]
			}
			out[j] = y
		}
	}
}

// LayerNormBackward computes dx and accumulates dgamma and dbeta (when not nil) from the saved input, mean and
// rstd.
func LayerNormBackward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma []float32, cols int) {
	n := float64(cols)
	for r, row := 0, 0; r < len(x); r, row = r+cols, row+1 {
		mu, rs := float64(mean[row]), float64(rstd[row])
		var sumG, sumGX float64 // Σ g and Σ g*xhat, where g = dy*gamma
		for j := range cols {
			xhat := (float64(x[r+j]) - mu) * rs
			g := float64(dy[r+j])
			if gamma != nil {
				g *= float64(gamma[j])
			}
			sumG += g
			sumGX += g * xhat
			if dgamma != nil {
				dgamma[j] += dy[r+j] * float32(xhat)
			}
			if dbeta != nil {
				dbeta[j] += dy[r+j]
			}
		}
		for j := range cols {
			xhat := (float64(x[r+j]) - mu) * rs
			g := float64(dy[r+j])
			if gamma != nil {
				g *= float64(gamma[j])
			}
			dx[r+j] = float32(rs * (g - sumG/n - xhat*sumGX/n))
		}
	}
}

// Embedding gathers rows of weight (width cols) for each index: dst[i] = weight[idx[i]].
func Embedding(dst, weight, idx []float32, cols int) {
	for i, id := range idx {
		k := int(id)
		copy(dst[i*cols:(i+1)*cols], weight[k*cols:(k+1)*cols])
	}
}

// EmbeddingBackward accumulates dy's rows into the rows of dweight the indices name.
func EmbeddingBackward(dweight, dy, idx []float32, cols int) {
	for i, id := range idx {
		k := int(id)
		AddScaled(dweight[k*cols:(k+1)*cols], 1, dy[i*cols:(i+1)*cols])
	}
}

// NLLLoss returns the mean over rows of -logp[row, target[row]] (logp has rows of length cols), rows whose
// target is negative (an ignore_index) left out.
func NLLLoss(logp, target []float32, cols int) float32 {
	var s float64
	for i, t := range target {
		if t >= 0 {
			s -= float64(logp[i*cols+int(t)])
		}
	}
	return float32(s / float64(NLLCount(target)))
}

// NLLCount is the number of rows the mean is taken over: the targets other than a negative ignore_index
// (HF's -100 for the padded last position); nll_loss's total_weight.
func NLLCount(target []float32) int {
	n := 0
	for _, t := range target {
		if t >= 0 {
			n++
		}
	}
	return n
}

// NLLLossBackward sets dlogp = -g/count at each counted row's target and 0 elsewhere.
func NLLLossBackward(dlogp, target []float32, cols int, g float32) {
	Fill(dlogp, 0)
	w := -g / float32(NLLCount(target))
	for i, t := range target {
		if t >= 0 {
			dlogp[i*cols+int(t)] = w
		}
	}
}

// MSELoss returns the mean of (x - y)^2.
func MSELoss(x, y []float32) float32 {
	var s float64
	for i := range x {
		d := float64(x[i] - y[i])
		s += d * d
	}
	return float32(s / float64(len(x)))
}

// MSELossBackward sets dx = g * 2 (x - y) / n.
func MSELossBackward(dx, x, y []float32, g float32) {
	w := 2 * g / float32(len(x))
	for i := range dx {
		dx[i] = w * (x[i] - y[i])
	}
}

// Transpose2D writes the transpose of the rows x cols matrix x into dst (cols x rows).
func Transpose2D(dst, x []float32, rows, cols int) {
	for i := range rows {
		for j := range cols {
			dst[j*rows+i] = x[i*cols+j]
		}
	}
}
