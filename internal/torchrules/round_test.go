package torchrules

import "testing"

const (
	kib = 1 << 10
	gib = 1 << 30
)

func allDivisions(n uint64) *[RoundupIntervals]uint64 {
	var t [RoundupIntervals]uint64
	for i := range t {
		t[i] = n
	}
	return &t
}

func TestRoundSize(t *testing.T) {
	tests := map[string]struct {
		size      uint64
		divisions *[RoundupIntervals]uint64
		want      uint64
	}{
		"1 byte":                            {1, nil, 512},
		"511":                               {511, nil, 512},
		"512":                               {512, nil, 512},
		"513":                               {513, nil, 1024},
		"1000":                              {1000, nil, 1024},
		"1 MiB":                             {mib, nil, mib},
		"1 MiB + 1":                         {mib + 1, nil, mib + 512},
		"1200, 4 divisions (code, not doc)": {1200, allDivisions(4), 1536},
		"2048, 4 divisions":                 {2048, allDivisions(4), 2048},
		"2049, 4 divisions":                 {2049, allDivisions(4), 2560},
		"3000, 4 divisions":                 {3000, allDivisions(4), 3072},
		"5 MiB + 1, 4 divisions":            {5*mib + 1, allDivisions(4), 6 * mib},
		"1 MiB + 1, 8 divisions":            {mib + 1, allDivisions(8), mib + 128*kib},
		"power of two stays, 8 divisions":   {64 * mib, allDivisions(8), 64 * mib},
		"on a division stays":               {80 * mib, allDivisions(4), 80 * mib},
		"1 division is off":                 {5*mib + 1, allDivisions(1), 5*mib + 512},
		"divisions only above 512*n":        {2100, allDivisions(8), 2560},
		"just above 512*n":                  {4097, allDivisions(8), 4608},
		"100.3 MB, 2 divisions":             {100_300_000, allDivisions(2), 96 * mib},
		"70 MB, 8 divisions":                {70_000_000, allDivisions(8), 72 * mib},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := RoundSize(tc.size, tc.divisions); got != tc.want {
				t.Errorf("RoundSize(%d) = %d, want %d", tc.size, got, tc.want)
			}
		})
	}
}

// TestRoundupPower2NextDivision pins the helper on its own, where the docs' example does hold.
func TestRoundupPower2NextDivision(t *testing.T) {
	tests := []struct{ size, divisions, want uint64 }{
		{1200, 4, 1280},
		{1024, 4, 1024},
		{1025, 2, 1536},
		{1537, 2, 2048},
		{3, 4, 4}, // step 0: next power of two
	}
	for _, tc := range tests {
		if got := roundupPower2NextDivision(tc.size, tc.divisions); got != tc.want {
			t.Errorf("roundup_power2_next_division(%d, %d) = %d, want %d", tc.size, tc.divisions, got, tc.want)
		}
	}
}

// TestRoundupTableExample is the C++ config unit test's example: key k sets the divisions for [k, 2k) MiB,
// the first key also fills below it, and ">" the intervals after the last key.
func TestRoundupTableExample(t *testing.T) {
	cfg, err := ParseConfig("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]")
	if err != nil {
		t.Fatal(err)
	}
	tests := map[uint64]uint64{
		32 * mib: 8, 64 * mib: 8, 128 * mib: 2, 256 * mib: 4, 512 * mib: 2, 1024 * mib: 4, 2048 * mib: 1,
		mib / 2: 8, 40 * gib: 1,
	}
	for size, want := range tests {
		if got := cfg.RoundupPower2Divisions[RoundupIndex(size)]; got != want {
			t.Errorf("divisions for %d MiB = %d, want %d", size/mib, got, want)
		}
	}
}

func TestRoundupIndex(t *testing.T) {
	tests := map[uint64]int{
		512: 0, mib - 1: 0, mib: 0, 2*mib - 1: 0, 2 * mib: 1, 3 * mib: 1, 4 * mib: 2,
		32 * gib: 15, 64 * gib: 15, 1 << 50: 15,
	}
	for size, want := range tests {
		if got := RoundupIndex(size); got != want {
			t.Errorf("RoundupIndex(%d) = %d, want %d", size, got, want)
		}
	}
}

func TestAllocationSize(t *testing.T) {
	tests := map[string]struct{ rounded, large, want uint64 }{
		"512":              {512, LargeBuffer, SmallBuffer},
		"1 MiB":            {mib, LargeBuffer, SmallBuffer},
		"1 MiB + 512":      {mib + 512, LargeBuffer, LargeBuffer},
		"10 MiB - 512":     {10*mib - 512, LargeBuffer, LargeBuffer},
		"10 MiB":           {10 * mib, LargeBuffer, 10 * mib},
		"10 MiB + 512":     {10*mib + 512, LargeBuffer, 12 * mib},
		"100.3 MB":         {100_300_288, LargeBuffer, 96 * mib},
		"5 MiB, 40 MiB":    {5 * mib, 40 * mib, 40 * mib},
		"1 GiB":            {gib, LargeBuffer, gib},
		"odd large, 12MiB": {11*mib + 512, 12 * mib, 12 * mib},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := AllocationSize(tc.rounded, tc.large); got != tc.want {
				t.Errorf("AllocationSize(%d) = %d, want %d", tc.rounded, got, tc.want)
			}
		})
	}
}

func TestShouldSplit(t *testing.T) {
	tests := map[string]struct {
		block, rounded uint64
		small          bool
		maxSplit       uint64
		want           bool
	}{
		"small, 512 left":            {2 * mib, 2*mib - 512, true, ^uint64(0), true},
		"small, 511 left":            {2*mib - 1, 2*mib - 512, true, ^uint64(0), false},
		"large, 1 MiB left":          {20 * mib, 19 * mib, false, ^uint64(0), false},
		"large, 1 MiB + 512 left":    {20 * mib, 19*mib - 512, false, ^uint64(0), true},
		"large, oversize request":    {200 * mib, 100 * mib, false, 100 * mib, false},
		"large, below max split":     {200 * mib, 99 * mib, false, 100 * mib, true},
		"expandable counts as small": {20 * mib, 20*mib - 512, true, 100 * mib, true},
	}
	for name, tc := range tests {
		if got := ShouldSplit(tc.block, tc.rounded, tc.small, tc.maxSplit); got != tc.want {
			t.Errorf("%s: ShouldSplit(%d, %d, %v, %d) = %v, want %v", name, tc.block, tc.rounded, tc.small, tc.maxSplit, got, tc.want)
		}
	}
}

// TestNoOverflow checks the sizes of hostile input next to 2^64 come back unrounded rather than wrapped.
func TestNoOverflow(t *testing.T) {
	for _, size := range []uint64{^uint64(0), ^uint64(0) - 100, 1<<63 + 1, 1<<63 + 3<<61 + 1} {
		if got := RoundSize(size, nil); got < size {
			t.Errorf("RoundSize(%d) = %d, wrapped", size, got)
		}
		if got := RoundSize(size, allDivisions(4)); got < size {
			t.Errorf("RoundSize(%d, 4 divisions) = %d, wrapped", size, got)
		}
		if got := AllocationSize(size, LargeBuffer); got < size {
			t.Errorf("AllocationSize(%d) = %d, wrapped", size, got)
		}
	}
}

func TestHostBlockSizeIsThePowerOfTwoCeiling(t *testing.T) {
	t.Parallel()
	cases := map[uint64]uint64{0: 0, 1: 1, 2: 2, 3: 4, 512: 512, 513: 1024, 1 << 30: 1 << 30, 1<<30 + 1: 1 << 31,
		3 << 29: 1 << 31, 1 << 63: 1 << 63, 1<<63 + 1: 1<<63 + 1}
	for size, want := range cases {
		if got := HostBlockSize(size); got != want {
			t.Errorf("HostBlockSize(%d) = %d, want %d", size, got, want)
		}
		// Independently: the least power of two not below size.
		if size > 0 && size <= 1<<63 {
			p := uint64(1)
			for p < size {
				p <<= 1
			}
			if p != want {
				t.Fatalf("case %d: table says %d, loop says %d", size, want, p)
			}
		}
	}
}
