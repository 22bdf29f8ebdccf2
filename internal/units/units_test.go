package units

import "testing"

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

func TestFormatSize(t *testing.T) {
	tests := map[int64]string{
		0: "0 B", 512: "512 B", 1023: "1023 B", 1024: "1.00 KiB", 1536: "1.50 KiB", 1 << 20: "1.00 MiB",
		24 << 30: "24.00 GiB", -3 << 20: "-3.00 MiB", 5 << 40: "5.00 TiB",
	}
	for in, want := range tests {
		if got := FormatSize(in); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", in, got, want)
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
