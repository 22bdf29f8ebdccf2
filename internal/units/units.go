// Package units parses and prints byte sizes the way oomdbg's users write them: binary units throughout, so
// "24GiB" and "24GB" are both 24 x 2^30 bytes (as pytest-memray reads them), and sizes print as "1.50 GiB".
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var suffixes = []struct {
	names []string
	shift uint
}{
	{[]string{"tib", "tb", "t"}, 40},
	{[]string{"gib", "gb", "g"}, 30},
	{[]string{"mib", "mb", "m"}, 20},
	{[]string{"kib", "kb", "k"}, 10},
	{[]string{"b", ""}, 0},
}

// ParseSize parses a size such as "24GiB", "24GB", "1.5 GiB", "512MB", "4096" (bytes). Units are binary
// and case-insensitive.
func ParseSize(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for _, sfx := range suffixes {
		for _, name := range sfx.names {
			num, ok := strings.CutSuffix(t, name)
			if !ok {
				continue
			}
			num = strings.TrimSpace(num)
			if num == "" || strings.HasSuffix(num, "i") { // "24i" is no unit
				continue
			}
			if n, err := strconv.ParseUint(num, 10, 64); err == nil { // exact, beyond float64's 53 bits
				if n > math.MaxUint64>>sfx.shift {
					return 0, fmt.Errorf("size %q is too large", s)
				}
				return n << sfx.shift, nil
			}
			v, err := strconv.ParseFloat(num, 64)
			if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
				break
			}
			bytes := v * float64(uint64(1)<<sfx.shift)
			if bytes >= math.MaxUint64 {
				return 0, fmt.Errorf("size %q is too large", s)
			}
			return uint64(bytes), nil
		}
	}
	return 0, fmt.Errorf("invalid size %q (want a number with an optional unit: B, KiB, MiB, GiB, TiB; KB, MB, GB also mean binary units)", s)
}

// FormatSize prints bytes in the largest binary unit that keeps the number at least 1, with two decimals:
// "512 B", "1.50 KiB", "23.99 GiB". Negative sizes (deltas) keep their sign.
func FormatSize(bytes int64) string {
	sign := ""
	b := float64(bytes)
	if bytes < 0 {
		sign, b = "-", -b
	}
	switch {
	case b < 1<<10:
		return fmt.Sprintf("%s%d B", sign, int64(b))
	case b < 1<<20:
		return fmt.Sprintf("%s%.2f KiB", sign, b/(1<<10))
	case b < 1<<30:
		return fmt.Sprintf("%s%.2f MiB", sign, b/(1<<20))
	case b < 1<<40:
		return fmt.Sprintf("%s%.2f GiB", sign, b/(1<<30))
	}
	return fmt.Sprintf("%s%.2f TiB", sign, b/(1<<40))
}

// FormatSizeExact prints bytes in the largest binary unit that divides them, so that ParseSize reads back
// exactly the same number: "24GiB", "1536MiB", "1000000000B".
func FormatSizeExact(bytes uint64) string {
	for _, sfx := range suffixes {
		if sfx.shift > 0 && bytes != 0 && bytes%(1<<sfx.shift) == 0 {
			return fmt.Sprintf("%d%s", bytes>>sfx.shift, exactNames[sfx.shift])
		}
	}
	return fmt.Sprintf("%dB", bytes)
}

var exactNames = map[uint]string{40: "TiB", 30: "GiB", 20: "MiB", 10: "KiB"}
