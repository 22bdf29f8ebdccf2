package units

import "testing"

func TestParseSize(t *testing.T) {
	tests := map[string]uint64{
		"24GiB": 24 << 30, "24GB": 24 << 30, "24gb": 24 << 30, "24 GiB": 24 << 30, "1.5GiB": 3 << 29,
		"512MB": 512 << 20, "512MiB": 512 << 20, "64K": 64 << 10, "4096": 4096, "4096B": 4096, "1TiB": 1 << 40,
		"0": 0,
	}
	for in, want := range tests {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "GB", "-1GB", "ten", "24XB", "1e400GB", "NaNGB", "24i", "24 iB"} {
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
