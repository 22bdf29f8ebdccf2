package tensor

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

// TestNF4StorageIsTheBitsandbytesFormula checks the bytes of a stored weight against bitsandbytes'
// quantize_4bit with compress_statistics: n/2 bytes of packed indices, one uint8 absmax per 64 values, one
// float32 per 256 absmax values, and per weight a 256-entry float32 dynamic code, a 16-entry NF4 table and a
// float32 offset. Shapes include a count that is not a multiple of 64 and block counts that are not of 256.
func TestNF4StorageIsTheBitsandbytesFormula(t *testing.T) {
	for _, shape := range [][2]int{{64, 64}, {4096, 4096}, {1024, 14336}, {7, 9}, {3, 1000}, {128256, 8}} {
		rt := newMeta(t, 8<<30)
		w := rt.Zeros(BF16, shape[:], "w", snapshot.CategoryParameter)
		q := Quantize4Bit(w, snapshot.CategoryParameter)
		w.Release()
		n := shape[0] * shape[1]
		blocks := (n + 63) / 64
		want := uint64((n+1)/2 + blocks + 4*((blocks+255)/256) + 256*4 + 16*4 + 4)
		var got uint64
		for _, x := range q.Tensors() {
			got += x.Bytes()
		}
		if got != want {
			t.Errorf("%v: %d bytes stored, bitsandbytes' formula %d", shape, got, want)
		}
		q.Release()
		if a := allocated(rt); a != 0 {
			t.Errorf("%v: %d bytes left after releasing the weight", shape, a)
		}
	}
}

// TestDynamicCodeIsBitsandbytes checks the signed dynamic map's defining properties: 256 sorted entries,
// -1 excluded and 1 included (create_dynamic_map appends 1.0 but no -1), zero, and for each decade 10^(i-6)
// the midpoints of linspace(0.1, 1, 2^i+1) mirrored; the smallest positive entry is 10^-6 x 0.55.
func TestDynamicCodeIsBitsandbytes(t *testing.T) {
	c := dynamicCode[:]
	if !slices.IsSorted(c) {
		t.Fatal("the dynamic code is not sorted")
	}
	if c[255] != 1 || c[0] <= -1 || !slices.Contains(c, 0) {
		t.Errorf("ends %v and %v, want the largest 1 and the smallest above -1, with 0 present", c[0], c[255])
	}
	var pos []float32
	for _, v := range c {
		if v > 0 {
			pos = append(pos, v)
		}
	}
	if len(pos) != 128 { // 2^i midpoints for each of 7 decades (127), plus 1.0
		t.Errorf("%d positive entries, want 128", len(pos))
	}
	if math.Abs(float64(pos[0])-0.55e-6) > 1e-12 {
		t.Errorf("smallest positive entry %g, want 5.5e-7", pos[0])
	}
	for _, v := range pos[:len(pos)-1] {
		if !slices.Contains(c, -v) {
			t.Errorf("%g has no negative twin", v)
		}
	}
}

// TestNF4RoundTrip quantizes normal weights on the cpu device and checks each dequantized value: it is the
// NF4 entry nearest to w/absmax times the block's absmax as double quantization restores it, so the error
// is at most half the widest gap of the table times the absmax, plus the absmax's own error.
func TestNF4RoundTrip(t *testing.T) {
	rt := newCPU(t)
	r := rand.New(rand.NewPCG(3, 4))
	const rows, cols = 16, 200 // 3200 values: 50 blocks
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = float32(r.NormFloat64()) * 0.02
	}
	w := rt.FromValues(F32, []int{rows, cols}, v, "w", snapshot.CategoryParameter)
	q := Quantize4Bit(w, snapshot.CategoryParameter)
	absmax, d := q.dequantize(false)
	defer releaseAll(absmax)
	defer d.Release()
	got := d.Values()
	var diff, norm float64
	for b := range rows * cols / Blocksize4Bit {
		block := v[b*Blocksize4Bit : (b+1)*Blocksize4Bit]
		var m float32
		for _, x := range block {
			m = max(m, float32(math.Abs(float64(x))))
		}
		for i, x := range block {
			g := got[b*Blocksize4Bit+i]
			if e := math.Abs(float64(g - x)); e > 0.17*float64(m)+0.02*float64(m) {
				t.Fatalf("value %d of block %d: %g stored as %g (absmax %g)", i, b, x, g, m)
			}
			diff += float64((g - x) * (g - x))
			norm += float64(x * x)
		}
	}
	if rel := math.Sqrt(diff / norm); rel > 0.12 {
		t.Errorf("relative error %.3f of NF4 on normal weights, want < 0.12", rel)
	}
	q.Release()
	w.Release()
}

// TestMatMul4BitSavesNothingAndDequantizesTwice checks bitsandbytes' memory behaviour: the forward saves
// no tensor (ctx.tensors is the packed weight), a dequantized weight of (out, in) in the weight's dtype is a
// temporary of the forward and again of the backward, and the weight gets no gradient.
func TestMatMul4BitSavesNothingAndDequantizesTwice(t *testing.T) {
	rt := newMeta(t, 8<<30)
	const out, in = 4096, 1024
	w := rt.Zeros(BF16, []int{out, in}, "w", snapshot.CategoryParameter)
	q := Quantize4Bit(w, snapshot.CategoryParameter)
	w.Release()
	x := rt.Zeros(BF16, []int{2, 8, in}, "x", snapshot.CategoryInput).SetRequiresGrad(true)
	base := allocated(rt)
	rt.dev.Allocator().ResetPeakStats()
	y := MatMul4Bit(x, q, nil)
	if saved := rt.SavedTensors(); len(saved) != 0 {
		t.Errorf("MatMul4Bit saved %v, want nothing", saved)
	}
	dequant := int64(out * in * 2)
	yBytes := int64(2 * 8 * out * 2)
	if peak := rt.dev.Allocator().Stats().AllocatedBytes.All().Peak - base; peak < dequant+yBytes {
		t.Errorf("forward peaked %d bytes above the start, want at least the dequantized weight and output %d", peak, dequant+yBytes)
	}
	if a := allocated(rt) - base; a != roundUp512(yBytes) {
		t.Errorf("%d bytes left after the forward, want only the output's %d", a, yBytes)
	}
	s := Sum(y)
	rt.dev.Allocator().ResetPeakStats()
	before := allocated(rt)
	s.Backward(false)
	if peak := rt.dev.Allocator().Stats().AllocatedBytes.All().Peak - before; peak < dequant {
		t.Errorf("backward peaked %d bytes above its start, want at least the dequantized weight %d", peak, dequant)
	}
	if x.Grad() == nil || !slices.Equal(x.Grad().Shape(), x.Shape()) {
		t.Errorf("x got gradient %v", x.Grad())
	}
	s.Release()
	y.Release()
	x.Release()
	q.Release()
}

func roundUp512(n int64) int64 { return (n + 511) / 512 * 512 }
