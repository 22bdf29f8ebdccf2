package torchrules

import "testing"

// TestFormatSize holds format_size to its definition: bounds inclusive, two decimals, binary units.
func TestFormatSize(t *testing.T) {
	tests := map[uint64]string{
		0:              "0 bytes",
		512:            "512 bytes",
		1024:           "1024 bytes",
		1025:           "1.00 KiB",
		1536:           "1.50 KiB",
		1048575:        "1024.00 KiB",
		1048576:        "1024.00 KiB",
		1048577:        "1.00 MiB",
		2097152:        "2.00 MiB",
		20971520:       "20.00 MiB",
		300_000:        "292.97 KiB",
		1073741824:     "1024.00 MiB",
		1073741825:     "1.00 GiB",
		3 * gib / 2:    "1.50 GiB",
		24 * gib:       "24.00 GiB",
		79_181_873_152: "73.74 GiB",
	}
	for size, want := range tests {
		if got := FormatSize(size); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", size, got, want)
		}
	}
}
