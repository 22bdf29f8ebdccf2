package device

import "math"

// Half-precision values live in float32 buffers on the CPU device, rounded to what fp16 or bf16 can hold after
// every op that produces them, so the numbers behave as on a GPU while the math stays float32.

// RoundF16 rounds every element of x to the nearest IEEE 754 binary16 value (ties to even), with overflow to
// ±Inf and gradual underflow, as a cast to torch.float16 does.
func RoundF16(x []float32) {
	for i, v := range x {
		x[i] = F16ToF32(F32ToF16(v))
	}
}

// RoundBF16 rounds every element of x to the nearest bfloat16 value (ties to even), as a cast to
// torch.bfloat16 does.
func RoundBF16(x []float32) {
	for i, v := range x {
		x[i] = BF16ToF32(F32ToBF16(v))
	}
}

// F32ToF16 returns the binary16 bits nearest to f (ties to even).
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	switch {
	case exp == 0xff: // Inf or NaN; keep NaN quiet and non-zero
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp-127 > 15: // too large even before rounding
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e <= 0 { // subnormal in binary16, or zero
		if e < -10 {
			return sign
		}
		m := mant | 0x800000    // the implicit leading one
		shift := uint32(14 - e) // from 23 fraction bits to the subnormal's position
		half := uint32(1) << (shift - 1)
		r := m >> shift
		rem := m & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // a carry into the exponent is right, and reaches Inf at the top
	}
	return sign | uint16(r)
}

// F16ToF32 returns the float32 value of binary16 bits h (exact).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		v := float32(mant) / (1 << 24) // subnormal: mant * 2^-24
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// F32ToBF16 returns the bfloat16 bits nearest to f (ties to even).
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7f800000 == 0x7f800000 && b&0x7fffff != 0 {
		return uint16(b>>16) | 0x40 // NaN stays NaN
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BF16ToF32 returns the float32 value of bfloat16 bits h (exact).
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
