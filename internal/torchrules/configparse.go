package torchrules

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// ConfigError is a settings string PyTorch would refuse. Error returns PyTorch's own message where PyTorch
// has one (c10/core/AllocatorConfig.cpp, c10/cuda/CUDAAllocatorConfig.cpp).
type ConfigError struct {
	Key string // the setting at fault, "" when the string is malformed before any key
	Msg string
}

func (e *ConfigError) Error() string { return e.Msg }

// maxSizeMB caps "_mb" values the way PyTorch does (SIZE_MAX / 1 MiB), so the byte count cannot overflow.
const maxSizeMB = math.MaxUint64 / mib

// settingKind says how ParseConfig treats a key.
type settingKind uint8

const (
	kindField     settingKind = iota // decides where device memory goes; parsed into a Config field
	kindInertBool                    // accepted, True/False, no effect here
	kindInertSize                    // accepted, an unsigned integer, no effect here
	kindInertText                    // accepted, any value (or list), no effect here
)

// settingKinds lists every key the newest PyTorch accepts for a CUDA device.
var settingKinds = map[string]settingKind{
	"backend":                              kindField,
	"large_segment_size_mb":                kindField,
	"max_split_size_mb":                    kindField,
	"max_non_split_rounding_mb":            kindField,
	"garbage_collection_threshold":         kindField,
	"roundup_power2_divisions":             kindField,
	"expandable_segments":                  kindField,
	"per_process_memory_fraction":          kindField,
	"throw_on_cudamalloc_oom":              kindField,
	"release_lock_on_cudamalloc":           kindInertBool,
	"release_lock_on_hipmalloc":            kindInertBool,
	"graph_capture_record_stream_reuse":    kindInertBool,
	"pinned_use_background_threads":        kindInertBool,
	"pinned_use_cuda_host_register":        kindInertBool,
	"pinned_use_hip_host_register":         kindInertBool,
	"pinned_free_catch_all":                kindInertBool,
	"pinned_num_register_threads":          kindInertSize,
	"pinned_reserve_segment_size_mb":       kindInertSize,
	"pinned_max_round_threshold_mb":        kindInertSize,
	"pinned_max_cached_size_mb":            kindInertSize,
	"expandable_segments_reserve":          kindInertText,
	"expandable_segments_reserve_by_class": kindInertText,
	"expandable_segments_handle_type":      kindInertText,
}

// pinnedMaxRegisterThreads is CUDAAllocatorConfig::pinned_max_register_threads().
const pinnedMaxRegisterThreads = 128

// entry is one key:value of a settings string: tokens[key] is the key, tokens[lo:hi] the value (one token,
// or a bracketed list including its brackets).
type entry struct {
	key    string
	keyIdx int
	lo, hi int
}

// ParseConfig parses a PYTORCH_CUDA_ALLOC_CONF string ("key:value,key2:[a:b,c:d]") the way PyTorch does:
// whitespace is ignored anywhere, later keys override earlier ones, every parse starts from the defaults,
// and large_segment_size_mb is applied first because it bounds max_split_size_mb. Booleans are "True" or
// "False", nothing else, as PyTorch's ConfigTokenizer::toBool reads them. Unknown keys, bad values and
// malformed strings return a *ConfigError with PyTorch's message.
func ParseConfig(s string) (Config, error) {
	cfg := Config{Source: s}
	toks := tokenize(s)
	entries, err := splitEntries(toks)
	if err != nil {
		return Config{}, err
	}
	// large_segment_size_mb first: max_split_size_mb and max_non_split_rounding_mb are checked against it.
	for _, e := range entries {
		if e.key == "large_segment_size_mb" {
			v, err := sizeValue(toks, e)
			if err != nil {
				return Config{}, err
			}
			if v <= MinLargeAlloc/mib {
				return Config{}, &ConfigError{Key: e.key, Msg: "CachingAllocator option large_segment_size_mb must be > 10 MB"}
			}
			cfg.LargeSegmentSize = min(v, maxSizeMB) * mib
		}
	}
	for _, e := range entries {
		if err := cfg.apply(toks, e); err != nil {
			return Config{}, err
		}
	}
	return cfg, nil
}

// tokenize splits a settings string into keys, values and the single-character tokens , : [ ], dropping
// whitespace, as PyTorch's ConfigTokenizer does.
func tokenize(s string) []string {
	var toks []string
	var buf strings.Builder
	flush := func() {
		if buf.Len() > 0 {
			toks = append(toks, buf.String())
			buf.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ',', ':', '[', ']':
			flush()
			toks = append(toks, string(c))
		case ' ', '\t', '\n', '\v', '\f', '\r':
		default:
			buf.WriteByte(c)
		}
	}
	flush()
	return toks
}

func isSeparator(t string) bool { return t == "," || t == ":" || t == "[" || t == "]" }

// splitEntries checks the key:value,... structure and the keys, and returns the entries in order.
func splitEntries(toks []string) ([]entry, error) {
	var entries []entry
	for i := 0; i < len(toks); i++ {
		key := toks[i]
		if _, ok := settingKinds[key]; !ok {
			return nil, &ConfigError{Key: key, Msg: fmt.Sprintf("Unrecognized key '%s' in Accelerator allocator config.", key)}
		}
		e := entry{key: key, keyIdx: i}
		i++
		if i >= len(toks) || toks[i] != ":" {
			return nil, &ConfigError{Key: key, Msg: "Error parsing CachingAllocator::AllocatorConfig settings, expected :"}
		}
		i++
		if i >= len(toks) || (isSeparator(toks[i]) && toks[i] != "[") {
			return nil, &ConfigError{Key: key, Msg: "Error, expecting " + key + " value"}
		}
		e.lo = i
		if toks[i] == "[" {
			for i++; i < len(toks) && toks[i] != "]"; i++ {
				if toks[i] == "[" {
					return nil, &ConfigError{Key: key, Msg: "Error parsing " + key + " value"}
				}
			}
			if i >= len(toks) {
				return nil, &ConfigError{Key: key, Msg: "Expected closing bracket ']' in ConfigTokenizer but reached end of config"}
			}
		}
		e.hi = i + 1
		entries = append(entries, e)
		if i+1 < len(toks) {
			i++
			if toks[i] != "," {
				return nil, &ConfigError{Key: key, Msg: "Error parsing CachingAllocator::AllocatorConfig settings, expected ,"}
			}
		}
	}
	return entries, nil
}

// apply interprets one entry into cfg.
func (cfg *Config) apply(toks []string, e entry) error {
	val := strings.Join(toks[e.lo:e.hi], "")
	switch settingKinds[e.key] {
	case kindInertBool:
		if _, err := boolValue(toks, e); err != nil {
			return err
		}
		cfg.Inert = append(cfg.Inert, Setting{e.key, val})
		return nil
	case kindInertSize:
		v, err := sizeValue(toks, e)
		if err != nil {
			return err
		}
		switch e.key {
		case "pinned_num_register_threads":
			if v == 0 || v&(v-1) != 0 {
				return &ConfigError{Key: e.key, Msg: fmt.Sprintf("Number of register threads has to be power of 2, got %d", v)}
			}
			if v > pinnedMaxRegisterThreads {
				return &ConfigError{Key: e.key, Msg: fmt.Sprintf("Number of register threads should be less than or equal to %d, got %d", pinnedMaxRegisterThreads, v)}
			}
		case "pinned_reserve_segment_size_mb":
			if v == 0 {
				return &ConfigError{Key: e.key, Msg: "Pinned reserve segment size has to be greater than 0"}
			}
		}
		cfg.Inert = append(cfg.Inert, Setting{e.key, val})
		return nil
	case kindInertText:
		cfg.Inert = append(cfg.Inert, Setting{e.key, val})
		return nil
	}

	switch e.key {
	case "backend":
		switch val {
		case "native":
			cfg.Backend = "" // the default, spelled out
		case "cudaMallocAsync":
			cfg.Backend = val
		default:
			return &ConfigError{Key: e.key, Msg: "Unknown allocator backend, options are native and cudaMallocAsync"}
		}
	case "large_segment_size_mb":
		// Applied before the other keys.
	case "max_split_size_mb", "max_non_split_rounding_mb":
		v, err := sizeValue(toks, e)
		if err != nil {
			return err
		}
		minMB := cfg.LargeSegment() / mib
		if v < minMB {
			return &ConfigError{Key: e.key, Msg: fmt.Sprintf("CachingAllocator option %s too small, must be >= %d", e.key, minMB)}
		}
		if e.key == "max_split_size_mb" {
			cfg.MaxSplitSize = min(v, maxSizeMB) * mib
		} else {
			cfg.MaxNonSplitRounding = min(v, maxSizeMB) * mib
		}
	case "garbage_collection_threshold":
		v, err := floatValue(toks, e)
		if err != nil {
			return err
		}
		if !(v > 0 && v < 1) {
			return &ConfigError{Key: e.key, Msg: "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"}
		}
		cfg.GarbageCollectionThreshold = v
	case "roundup_power2_divisions":
		return cfg.parseDivisions(toks, e)
	case "expandable_segments":
		v, err := boolValue(toks, e)
		if err != nil {
			return err
		}
		cfg.ExpandableSegments = v
	case "per_process_memory_fraction":
		v, err := floatValue(toks, e)
		if err != nil {
			return err
		}
		if !(v >= 0 && v <= 1) {
			return &ConfigError{Key: e.key, Msg: "per_process_memory_fraction is invalid, set it in [0.0, 1.0]"}
		}
		cfg.PerProcessMemoryFraction = v
	case "throw_on_cudamalloc_oom":
		v, err := boolValue(toks, e)
		if err != nil {
			return err
		}
		cfg.ThrowOnCudaMallocOOM = v
	}
	return nil
}

// parseDivisions reads roundup_power2_divisions: either one power of two for every interval, or a list
// [k1:v1,k2:v2,...,>:vN] where each k is a power-of-two MiB boundary setting the entry for [k, 2k) MiB,
// the first key also fills every entry below it, and ">" fills the entries after the last key (the newer
// code's from last+1; older code overwrote the last key's entry).
func (cfg *Config) parseDivisions(toks []string, e entry) error {
	var t [RoundupIntervals]uint64 // every parse starts from all zeros
	if toks[e.lo] != "[" {
		v, err := sizeValue(toks, e)
		if err != nil {
			return err
		}
		if v == 0 || v&(v-1) != 0 {
			return &ConfigError{Key: e.key, Msg: "For roundups, the divisions has to be power of 2 "}
		}
		for i := range t {
			t[i] = v
		}
		cfg.RoundupPower2Divisions = t
		return nil
	}
	malformed := &ConfigError{Key: e.key, Msg: "Error parsing roundup_power2_divisions value"}
	first, last := true, 0
	i := e.lo + 1
	for i < e.hi-1 {
		if i+2 >= e.hi-1 || isSeparator(toks[i]) || toks[i+1] != ":" || isSeparator(toks[i+2]) {
			return malformed
		}
		boundary, value := toks[i], toks[i+2]
		v, err := parseSize(e.key, value)
		if err != nil {
			return err
		}
		if v != 0 && v&(v-1) != 0 {
			return &ConfigError{Key: e.key, Msg: "For roundups, the divisions has to be power of 2 or 0 to disable roundup "}
		}
		if boundary == ">" {
			for j := last + 1; j < RoundupIntervals; j++ {
				t[j] = v
			}
		} else {
			k, err := parseSize(e.key, boundary)
			if err != nil {
				return err
			}
			if k == 0 || k&(k-1) != 0 {
				return &ConfigError{Key: e.key, Msg: "For roundups, the intervals have to be power of 2 "}
			}
			idx := min(roundupLog2(k), RoundupIntervals-1)
			if first {
				for j := 0; j < idx; j++ {
					t[j] = v
				}
				first = false
			}
			t[idx] = v
			last = idx
		}
		i += 3
		if i < e.hi-1 {
			if toks[i] != "," {
				return malformed
			}
			i++
			if i >= e.hi-1 {
				return malformed // a trailing comma inside the list
			}
		}
	}
	cfg.RoundupPower2Divisions = t
	return nil
}

// roundupLog2 is log2 of a power of two.
func roundupLog2(k uint64) int { return bits.Len64(k) - 1 }

// singleValue returns an entry's value token, or an error if the value is a list.
func singleValue(toks []string, e entry) (string, error) {
	if e.hi-e.lo != 1 {
		return "", &ConfigError{Key: e.key, Msg: "Error parsing " + e.key + " value"}
	}
	return toks[e.lo], nil
}

func sizeValue(toks []string, e entry) (uint64, error) {
	v, err := singleValue(toks, e)
	if err != nil {
		return 0, err
	}
	return parseSize(e.key, v)
}

// parseSize reads an unsigned decimal integer. PyTorch's std::stoull would also take a sign or trailing
// garbage and fail with the bare message "stoull"; a strict reading with the key named is more useful.
func parseSize(key, v string) (uint64, error) {
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, &ConfigError{Key: key, Msg: fmt.Sprintf("Error parsing %s value '%s': expected an unsigned integer", key, v)}
		}
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, &ConfigError{Key: key, Msg: fmt.Sprintf("Error parsing %s value '%s': out of range", key, v)}
	}
	return n, nil
}

func floatValue(toks []string, e entry) (float64, error) {
	v, err := singleValue(toks, e)
	if err != nil {
		return 0, err
	}
	f, perr := strconv.ParseFloat(v, 64)
	if perr != nil {
		return 0, &ConfigError{Key: e.key, Msg: fmt.Sprintf("Error parsing %s value '%s': expected a number", e.key, v)}
	}
	return f, nil
}

func boolValue(toks []string, e entry) (bool, error) {
	v, err := singleValue(toks, e)
	if err != nil {
		return false, err
	}
	switch v {
	case "True":
		return true, nil
	case "False":
		return false, nil
	}
	return false, &ConfigError{Key: e.key, Msg: fmt.Sprintf("Expected 'True' or 'False' at index %d in ConfigTokenizer but got '%s'", e.lo, v)}
}
