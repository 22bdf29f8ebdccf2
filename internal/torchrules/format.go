package torchrules

import "strconv"

// FormatSize is PyTorch's format_size, the way sizes read in its OOM message: bytes up to 1024, then KiB,
// MiB and GiB with two decimals. Each bound is inclusive, so 1 MiB prints as "1024.00 KiB" and 1 GiB as
// "1024.00 MiB". oomdbg's own output uses internal/units instead; this is for PyTorch's exact text.
func FormatSize(size uint64) string {
	switch {
	case size <= 1024:
		return strconv.FormatUint(size, 10) + " bytes"
	case size <= 1048576:
		return strconv.FormatFloat(float64(size)/1024.0, 'f', 2, 64) + " KiB"
	case size <= 1073741824:
		return strconv.FormatFloat(float64(size)/1048576.0, 'f', 2, 64) + " MiB"
	default:
		return strconv.FormatFloat(float64(size)/1073741824.0, 'f', 2, 64) + " GiB"
	}
}
