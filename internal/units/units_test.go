package units

import (
	"math"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := map[string]uint64{
		"24GiB": 24 << 30, "24GB": 24 << 30, "24gb": 24 << 30, "24 GiB": 24 << 30, "1.5GiB": 3 << 29,
		"512MB": 512 << 20, "512MiB": 512 << 20, "64K": 64 << 10, "4096": 4096, "4096B": 4096, "1TiB": 1 << 40,
		"0": 0, "9007199254740993": 1<<53 + 1, "17179869183GiB": 1<<64 - 1<<30, "18446744073709551615": 1<<64 - 1,
	}
	for in, want := range tests {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "GB", "-1GB", "ten", "24XB", "1e400GB", "NaNGB", "24i", "24 iB", "17179869184GiB", "18446744073709551616", "16EiB"} {
		if got, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", bad, got)
		}
	}
}

// TestFormatSize checks the printed sizes against their definition: the largest binary unit that keeps the
// number at least 1, two decimals, a value that rounds to 1024.00 stepping up a unit.
func TestFormatSize(t *testing.T) {
	tests := map[int64]string{
		0: "0 B", 512: "512 B", 1023: "1023 B", 1024: "1.00 KiB", 1536: "1.50 KiB", 1 << 20: "1.00 MiB",
		24 << 30: "24.00 GiB", -3 << 20: "-3.00 MiB", 5 << 40: "5.00 TiB",
		1<<20 - 1:                "1.00 MiB", // 1023.999 KiB rounds up into the next unit
		1<<20 - 6:                "1023.99 KiB",
		1<<30 - 1:                "1.00 GiB",
		-(1<<20 - 1):             "-1.00 MiB",
		79<<30 + 665<<20:         "79.65 GiB",
		71<<30 + 337<<20 + 5<<10: "71.33 GiB",
		math.MinInt64:            "-8.00 EiB",
	}
	for in, want := range tests {
		if got := FormatSize(in); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[uint64]string{^uint64(0): "16.00 EiB", 80 << 30: "80.00 GiB", 1 << 40: "1.00 TiB"} {
		if got := FormatSize(in); got != want {
			t.Errorf("FormatSize(uint64 %d) = %q, want %q", in, got, want)
		}
	}
}

func TestFormatSizeShort(t *testing.T) {
	for in, want := range map[int64]string{
		0: "0B", 512: "512B", 999: "999B", 1000: "1.0K", 1536: "1.5K", 10189: "10K", 12<<20 + 41<<10: "12M",
		1<<30 + 82<<20: "1.1G", 1023 << 10: "1.0M", 999 << 20: "999M", 1000 << 20: "1.0G", -3 << 20: "-3.0M",
		math.MaxInt64: "8.0E",
	} {
		if got := FormatSizeShort(in); got != want || len(got) > 5 && in >= 0 {
			t.Errorf("FormatSizeShort(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestFormatChange(t *testing.T) {
	for in, want := range map[int64]string{0: "0 B", 512: "+512 B", -1536: "-1.50 KiB", 3 << 30: "+3.00 GiB"} {
		if got := FormatChange(in); got != want {
			t.Errorf("FormatChange(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestFormatSizeExact(t *testing.T) {
	tests := map[uint64]string{
		0: "0B", 512: "512B", 1024: "1KiB", 1536: "1536B", 3 << 29: "1536MiB", 24 << 30: "24GiB", 1000000000: "1000000000B",
		1 << 50: "1024TiB", 1<<64 - 1: "18446744073709551615B",
	}
	for in, want := range tests {
		got := FormatSizeExact(in)
		if got != want {
			t.Errorf("FormatSizeExact(%d) = %q, want %q", in, got, want)
		}
		if back, err := ParseSize(got); in < 1<<63 && (err != nil || back != in) {
			t.Errorf("ParseSize(%q) = %d, %v; want %d back", got, back, err, in)
		}
	}
}
