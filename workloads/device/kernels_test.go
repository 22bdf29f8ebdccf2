package device

import (
	"math"
	"math/rand/v2"
	"testing"
)

func randSlice(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func TestGemmMatchesNaiveProduct(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const m, n, k = 5, 7, 3
	for _, tc := range []struct{ ta, tb bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		a, b := randSlice(r, m*k), randSlice(r, k*n)
		at := func(i, p int) float32 { // op(a)[i,p]
			if tc.ta {
				return a[p*m+i]
			}
			return a[i*k+p]
		}
		bt := func(p, j int) float32 {
			if tc.tb {
				return b[j*k+p]
			}
			return b[p*n+j]
		}
		lda, ldb := k, n
		if tc.ta {
			lda = m
		}
		if tc.tb {
			ldb = k
		}
		c := randSlice(r, m*n)
		c0 := append([]float32(nil), c...)
		Gemm(tc.ta, tc.tb, m, n, k, 2, a, lda, b, ldb, 0.5, c, n)
		for i := range m {
			for j := range n {
				var want float32
				for p := range k {
					want += at(i, p) * bt(p, j)
				}
				want = 2*want + 0.5*c0[i*n+j]
				if d := math.Abs(float64(c[i*n+j] - want)); d > 1e-5 {
					t.Fatalf("transA=%v transB=%v: c[%d,%d] = %v, want %v", tc.ta, tc.tb, i, j, c[i*n+j], want)
				}
			}
		}
	}
}

// gradCheck compares an analytic gradient with central finite differences of f at x.
func gradCheck(t *testing.T, name string, x []float32, f func([]float32) float64, grad []float32) {
	t.Helper()
	const h = 1e-2
	for i := range x {
		old := x[i]
		x[i] = old + h
		up := f(x)
		x[i] = old - h
		down := f(x)
		x[i] = old
		num := (up - down) / (2 * h)
		if d := math.Abs(num - float64(grad[i])); d > 2e-3*(1+math.Abs(num)) {
			t.Errorf("%s: d/dx[%d] analytic %.6f, finite difference %.6f", name, i, grad[i], num)
		}
	}
}

// dot64 returns Σ a*b in float64: the scalar loss L = Σ y*w whose gradient dL/dy is w.
func dot64(a, b []float32) float64 {
	var s float64
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return s
}

func TestBackwardKernelsAgainstFiniteDifferences(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const rows, cols = 3, 5
	n := rows * cols
	w := randSlice(r, n) // dL/dy
	x := randSlice(r, n)

	t.Run("gelu", func(t *testing.T) {
		y := make([]float32, n)
		f := func(x []float32) float64 { GELU(y, x); return dot64(y, w) }
		dx := make([]float32, n)
		GELUBackward(dx, w, x)
		gradCheck(t, "gelu", x, f, dx)
	})
	t.Run("relu", func(t *testing.T) {
		y := make([]float32, n)
		f := func(x []float32) float64 { ReLU(y, x); return dot64(y, w) }
		ReLU(y, x)
		dx := make([]float32, n)
		ReLUBackward(dx, w, y)
		xs := append([]float32(nil), x...)
		for i := range xs { // keep away from the kink
			if math.Abs(float64(xs[i])) < 0.05 {
				xs[i] = 0.5
			}
		}
		ReLU(y, xs)
		ReLUBackward(dx, w, y)
		gradCheck(t, "relu", xs, f, dx)
	})
	t.Run("softmax", func(t *testing.T) {
		y := make([]float32, n)
		f := func(x []float32) float64 { Softmax(y, x, cols); return dot64(y, w) }
		Softmax(y, x, cols)
		dx := make([]float32, n)
		SoftmaxBackward(dx, w, y, cols)
		gradCheck(t, "softmax", x, f, dx)
	})
	t.Run("log_softmax", func(t *testing.T) {
		y := make([]float32, n)
		f := func(x []float32) float64 { LogSoftmax(y, x, cols); return dot64(y, w) }
		LogSoftmax(y, x, cols)
		dx := make([]float32, n)
		LogSoftmaxBackward(dx, w, y, cols)
		gradCheck(t, "log_softmax", x, f, dx)
	})
	t.Run("layer_norm", func(t *testing.T) {
		gamma, beta := randSlice(r, cols), randSlice(r, cols)
		y, mean, rstd := make([]float32, n), make([]float32, rows), make([]float32, rows)
		f := func(x []float32) float64 { LayerNorm(y, mean, rstd, x, gamma, beta, cols, 1e-5); return dot64(y, w) }
		LayerNorm(y, mean, rstd, x, gamma, beta, cols, 1e-5)
		dx, dgamma, dbeta := make([]float32, n), make([]float32, cols), make([]float32, cols)
		LayerNormBackward(dx, dgamma, dbeta, w, x, mean, rstd, gamma, cols)
		gradCheck(t, "layer_norm dx", x, f, dx)
		gradCheck(t, "layer_norm dgamma", gamma, func(g []float32) float64 {
			LayerNorm(y, mean, rstd, x, g, beta, cols, 1e-5)
			return dot64(y, w)
		}, dgamma)
		gradCheck(t, "layer_norm dbeta", beta, func(b []float32) float64 {
			LayerNorm(y, mean, rstd, x, gamma, b, cols, 1e-5)
			return dot64(y, w)
		}, dbeta)
	})
	t.Run("cross_entropy", func(t *testing.T) {
		target := []float32{1, 4, 0}
		logp := make([]float32, n)
		f := func(x []float32) float64 { LogSoftmax(logp, x, cols); return float64(NLLLoss(logp, target, cols)) }
		LogSoftmax(logp, x, cols)
		dlogp, dx := make([]float32, n), make([]float32, n)
		NLLLossBackward(dlogp, target, cols, 1)
		LogSoftmaxBackward(dx, dlogp, logp, cols)
		gradCheck(t, "cross_entropy", x, f, dx)
	})
	t.Run("mse", func(t *testing.T) {
		y := randSlice(r, n)
		dx := make([]float32, n)
		MSELossBackward(dx, x, y, 1)
		gradCheck(t, "mse", x, func(x []float32) float64 { return float64(MSELoss(x, y)) }, dx)
	})
	t.Run("embedding", func(t *testing.T) {
		weight := randSlice(r, 4*cols)
		idx := []float32{2, 0, 2}
		y := make([]float32, n)
		dweight := make([]float32, 4*cols)
		EmbeddingBackward(dweight, w, idx, cols)
		gradCheck(t, "embedding", weight, func(wt []float32) float64 { Embedding(y, wt, idx, cols); return dot64(y, w) }, dweight)
	})
}

func TestSoftmaxRowsSumToOne(t *testing.T) {
	x := []float32{1000, 1001, 1002, -5, 0, 5} // large values: must not overflow
	y := make([]float32, 6)
	Softmax(y, x, 3)
	for r := range 2 {
		if s := y[3*r] + y[3*r+1] + y[3*r+2]; math.Abs(float64(s-1)) > 1e-6 {
			t.Errorf("row %d sums to %v", r, s)
		}
	}
	if math.Abs(float64(y[2])-0.66524096) > 1e-6 {
		t.Errorf("softmax(1000,1001,1002)[2] = %v, want 0.66524096", y[2])
	}
}

func TestDropoutKeepsExpectation(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := make([]float32, 100000)
	Fill(x, 1)
	y, mask := make([]float32, len(x)), make([]float32, len(x))
	Dropout(y, mask, x, 0.25, r.Float32)
	kept := Sum(mask) / float32(len(x))
	if math.Abs(float64(kept-0.75)) > 0.01 {
		t.Errorf("kept %.3f of elements, want 0.75", kept)
	}
	if mean := Sum(y) / float32(len(y)); math.Abs(float64(mean-1)) > 0.02 {
		t.Errorf("mean after dropout %.3f, want 1 (inverted scaling)", mean)
	}
	dx := make([]float32, len(x))
	DropoutBackward(dx, x, mask, 0.25)
	for i := range dx {
		if dx[i] != y[i] {
			t.Fatalf("backward of ones differs from forward at %d: %v vs %v", i, dx[i], y[i])
		}
	}
}

func TestHalfPrecisionRounding(t *testing.T) {
	t.Run("f16 known values", func(t *testing.T) {
		for _, tc := range []struct {
			in   float32
			bits uint16
		}{
			{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65519, 0x7bff}, {65520, 0x7c00}, // 65520 is the tie to Inf
			{float32(1.0 / 3), 0x3555}, {0.1, 0x2e66}, {6.103515625e-05, 0x0400}, // smallest normal
			{5.960464477539063e-08, 0x0001}, {2.98023223876953125e-08, 0x0000}, // smallest subnormal; its half ties to 0
			{4.470348358154297e-08, 0x0001}, {float32(math.Inf(-1)), 0xfc00}, {1 + 1.0/2048, 0x3c00}, // 1+2^-11 ties to even
			{1 + 3.0/2048, 0x3c02},
		} {
			if got := F32ToF16(tc.in); got != tc.bits {
				t.Errorf("F32ToF16(%g) = %#04x, want %#04x", tc.in, got, tc.bits)
			}
		}
	})
	t.Run("f16 round trip of every value", func(t *testing.T) {
		for h := range 1 << 16 {
			f := F16ToF32(uint16(h))
			if f != f { // NaN
				if back := F32ToF16(f); back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
					t.Fatalf("NaN %#04x came back as %#04x", h, back)
				}
				continue
			}
			if back := F32ToF16(f); back != uint16(h) {
				t.Fatalf("%#04x -> %g -> %#04x", h, f, back)
			}
		}
	})
	t.Run("bf16", func(t *testing.T) {
		for _, tc := range []struct {
			in   float32
			want float32
		}{
			{1, 1}, {3.140625, 3.140625}, {float32(math.Pi), 3.140625}, {1 + 1.0/256, 1}, {1 + 3.0/256, 1 + 4.0/256},
			{0.1, 0.10009765625},
		} {
			x := []float32{tc.in}
			RoundBF16(x)
			if x[0] != tc.want {
				t.Errorf("bf16(%g) = %g, want %g", tc.in, x[0], tc.want)
			}
		}
	})
}
