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

// Integer is any integer type a size may come in: int64 for sizes and changes in snapshots, uint64 for what
// devices and the allocator report.
type Integer interface {
	~int | ~int8 | ~int16 | ~int32 | ~int64 | ~uint | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~uintptr
}

// FormatSize prints a size in the largest binary unit that keeps the number at least 1, with two decimals:
// "512 B", "1.50 KiB", "23.99 GiB". A size that would round to 1024.00 of a unit prints as 1.00 of the next
// (1,048,575 B is "1.00 MiB", never "1024.00 KiB"). Negative sizes (changes) keep their sign. This is
// oomdbg's own format; PyTorch's format_size, whose bounds differ, is torchrules.FormatSize.
func FormatSize[N Integer](n N) string {
	sign, u := "", uint64(n)
	if n < 0 {
		sign, u = "-", -u // two's complement: the magnitude, even of the most negative int64
	}
	if u < 1<<10 {
		return sign + strconv.FormatUint(u, 10) + " B"
	}
	const prefixes = "KMGTPE"
	v, i := float64(u)/(1<<10), 0
	for v >= 1023.995 && i < len(prefixes)-1 { // 1023.995 and above would print as 1024.00
		v /= 1 << 10
		i++
	}
	return sign + strconv.FormatFloat(v, 'f', 2, 64) + " " + prefixes[i:i+1] + "iB"
}

// FormatSizeShort prints a size in at most five characters, for a label where FormatSize does not fit: two
// significant digits and the binary unit's letter, "512B", "1.5K", "12M", "1.1G". A value that would print as
// 1000 or more of a unit prints in the next.
func FormatSizeShort[N Integer](n N) string {
	sign, u := "", uint64(n)
	if n < 0 {
		sign, u = "-", -u
	}
	if u < 1000 {
		return sign + strconv.FormatUint(u, 10) + "B"
	}
	const prefixes = "KMGTPE"
	v, i := float64(u)/(1<<10), 0
	for v >= 999.5 && i < len(prefixes)-1 {
		v /= 1 << 10
		i++
	}
	if v < 9.95 {
		return sign + strconv.FormatFloat(v, 'f', 1, 64) + prefixes[i:i+1]
	}
	return sign + strconv.FormatFloat(v, 'f', 0, 64) + prefixes[i:i+1]
}

// FormatChange prints a change of size with its sign: "+1.50 KiB", "-512 B", and "0 B" for no change.
func FormatChange[N Integer](n N) string {
	if n > 0 {
		return "+" + FormatSize(n)
	}
	return FormatSize(n)
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
