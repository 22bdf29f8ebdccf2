package alloc

import "testing"

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
		if got := cfg.RoundupPower2Divisions[roundupIndex(size)]; got != want {
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
		if got := roundupIndex(size); got != want {
			t.Errorf("roundupIndex(%d) = %d, want %d", size, got, want)
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

// TestPoolChoice checks that the pool follows the rounded size: up to 1 MiB small (2 MiB segments),
// above it large.
func TestPoolChoice(t *testing.T) {
	tests := map[string]struct {
		size    uint64
		segment uint64
		pool    string
	}{
		"1 byte":         {1, SmallBuffer, PoolSmall},
		"1 MiB - 1":      {mib - 1, SmallBuffer, PoolSmall},
		"1 MiB":          {mib, SmallBuffer, PoolSmall},
		"1 MiB + 1":      {mib + 1, LargeBuffer, PoolLarge},
		"9 MiB":          {9 * mib, LargeBuffer, PoolLarge},
		"300 KB request": {300_000, SmallBuffer, PoolSmall},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, 4*gib, 0, "")
			addr := e.malloc(tc.size, 0)
			segs := e.a.Segments()
			if len(segs) != 1 || segs[0].Size != tc.segment || segs[0].Pool != tc.pool || segs[0].Addr != addr {
				t.Fatalf("segments %+v, want one %s segment of %d at %#x", segs, tc.pool, tc.segment, addr)
			}
		})
	}
}
