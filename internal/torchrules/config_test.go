package torchrules

import (
	"reflect"
	"testing"
)

func divisionsTable(v ...uint64) [RoundupIntervals]uint64 {
	var t [RoundupIntervals]uint64
	copy(t[:], v)
	return t
}

func TestParseConfig(t *testing.T) {
	tests := map[string]struct {
		in   string
		want Config
	}{
		"empty":                {"", Config{}},
		"max split":            {"max_split_size_mb:128", Config{MaxSplitSize: 128 * mib}},
		"max split minimum 20": {"max_split_size_mb:20", Config{MaxSplitSize: 20 * mib}},
		"spaces ignored":       {" max_split_size_mb : 1 28 , expandable_segments:True ", Config{MaxSplitSize: 128 * mib, ExpandableSegments: true}},
		"expandable false":     {"expandable_segments:False", Config{}},
		"gc":                   {"garbage_collection_threshold:0.6", Config{GarbageCollectionThreshold: 0.6}},
		"non split rounding":   {"max_non_split_rounding_mb:64", Config{MaxNonSplitRounding: 64 * mib}},
		"backend native":       {"backend:native", Config{}},
		"single division":      {"roundup_power2_divisions:4", Config{RoundupPower2Divisions: divisionsTable(4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4)}},
		"docs list": {"roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
			Config{RoundupPower2Divisions: divisionsTable(1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8)}},
		"unit test list": {"roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]",
			Config{RoundupPower2Divisions: divisionsTable(8, 8, 8, 8, 8, 8, 8, 2, 4, 2, 4, 1, 1, 1, 1, 1)}},
		// The newer parser fills ">" from the entry after the last key; the older one overwrote it.
		"> after last key": {"roundup_power2_divisions:[1:2,>:4]", Config{RoundupPower2Divisions: divisionsTable(2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4)}},
		"unlisted stay 0":  {"roundup_power2_divisions:[2:4,16:8]", Config{RoundupPower2Divisions: divisionsTable(4, 4, 0, 0, 8)}},
		"big key clamps":   {"roundup_power2_divisions:[65536:2]", Config{RoundupPower2Divisions: divisionsTable(2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2)}},
		"zero disables":    {"roundup_power2_divisions:[1:0,4:4]", Config{RoundupPower2Divisions: divisionsTable(0, 0, 4)}},
		"empty list":       {"roundup_power2_divisions:[]", Config{}},
		"later wins":       {"max_split_size_mb:100,max_split_size_mb:200", Config{MaxSplitSize: 200 * mib}},
		"trailing comma":   {"expandable_segments:True,", Config{ExpandableSegments: true}},
		"large segment first": {"max_split_size_mb:30,large_segment_size_mb:30",
			Config{MaxSplitSize: 30 * mib, LargeSegmentSize: 30 * mib}},
		"fraction": {"per_process_memory_fraction:0.5", Config{PerProcessMemoryFraction: 0.5}},
		"inert keys kept": {"pinned_use_cuda_host_register:True,release_lock_on_cudamalloc:False,pinned_num_register_threads:8",
			Config{Inert: []Setting{{"pinned_use_cuda_host_register", "True"}, {"release_lock_on_cudamalloc", "False"}, {"pinned_num_register_threads", "8"}}}},
		"inert list": {"expandable_segments_reserve_by_class:[a:0.5, b:40G]",
			Config{Inert: []Setting{{"expandable_segments_reserve_by_class", "[a:0.5,b:40G]"}}}},
		"throw off":           {"throw_on_cudamalloc_oom:False", Config{}},
		"throw on":            {"throw_on_cudamalloc_oom:True", Config{ThrowOnCudaMallocOOM: true}},
		"async backend":       {"backend:cudaMallocAsync", Config{Backend: "cudaMallocAsync"}},
		"huge max split caps": {"max_split_size_mb:18446744073709551615", Config{MaxSplitSize: maxSizeMB * mib}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseConfig(tc.in)
			if err != nil {
				t.Fatalf("ParseConfig(%q): %v", tc.in, err)
			}
			tc.want.Source = tc.in
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseConfig(%q) =\n %+v\nwant\n %+v", tc.in, got, tc.want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := map[string]struct{ in, msg string }{
		"max split too small":   {"max_split_size_mb:19", "CachingAllocator option max_split_size_mb too small, must be >= 20"},
		"max split vs segment":  {"large_segment_size_mb:64,max_split_size_mb:40", "CachingAllocator option max_split_size_mb too small, must be >= 64"},
		"rounding too small":    {"max_non_split_rounding_mb:10", "CachingAllocator option max_non_split_rounding_mb too small, must be >= 20"},
		"segment too small":     {"large_segment_size_mb:10", "CachingAllocator option large_segment_size_mb must be > 10 MB"},
		"gc zero":               {"garbage_collection_threshold:0", "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"},
		"gc one":                {"garbage_collection_threshold:1.0", "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"},
		"gc nan":                {"garbage_collection_threshold:nan", "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"},
		"gc not a number":       {"garbage_collection_threshold:half", "Error parsing garbage_collection_threshold value 'half': expected a number"},
		"divisions not pow2":    {"roundup_power2_divisions:3", "For roundups, the divisions has to be power of 2 "},
		"divisions zero single": {"roundup_power2_divisions:0", "For roundups, the divisions has to be power of 2 "},
		"list value not pow2":   {"roundup_power2_divisions:[64:3]", "For roundups, the divisions has to be power of 2 or 0 to disable roundup "},
		"list key not pow2":     {"roundup_power2_divisions:[100:2]", "For roundups, the intervals have to be power of 2 "},
		"list unclosed":         {"roundup_power2_divisions:[64:2,>:4", "Expected closing bracket ']' in ConfigTokenizer but reached end of config"},
		"list malformed":        {"roundup_power2_divisions:[64:2:4]", "Error parsing roundup_power2_divisions value"},
		"expandable yes":        {"expandable_segments:yes", "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'yes'"},
		"expandable lower":      {"max_split_size_mb:100,expandable_segments:true", "Expected 'True' or 'False' at index 6 in ConfigTokenizer but got 'true'"},
		"unknown key":           {"max_split_size:100", "Unrecognized key 'max_split_size' in Accelerator allocator config."},
		"equals sign":           {"expandable_segments=True", "Unrecognized key 'expandable_segments=True' in Accelerator allocator config."},
		"missing colon":         {"expandable_segments", "Error parsing CachingAllocator::AllocatorConfig settings, expected :"},
		"missing value":         {"max_split_size_mb:", "Error, expecting max_split_size_mb value"},
		"missing comma":         {"max_split_size_mb:100:200", "Error parsing CachingAllocator::AllocatorConfig settings, expected ,"},
		"not a number":          {"max_split_size_mb:lots", "Error parsing max_split_size_mb value 'lots': expected an unsigned integer"},
		"negative":              {"max_split_size_mb:-5", "Error parsing max_split_size_mb value '-5': expected an unsigned integer"},
		"overflow":              {"max_split_size_mb:99999999999999999999", "Error parsing max_split_size_mb value '99999999999999999999': out of range"},
		"unknown backend":       {"backend:cudaMalloc", "Unknown allocator backend, options are native and cudaMallocAsync"},
		"fraction":              {"per_process_memory_fraction:1.5", "per_process_memory_fraction is invalid, set it in [0.0, 1.0]"},
		"threads":               {"pinned_num_register_threads:3", "Number of register threads has to be power of 2, got 3"},
		"threads max":           {"pinned_num_register_threads:256", "Number of register threads should be less than or equal to 128, got 256"},
		"pinned reserve":        {"pinned_reserve_segment_size_mb:0", "Pinned reserve segment size has to be greater than 0"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ParseConfig(tc.in)
			if err == nil {
				t.Fatalf("ParseConfig(%q) succeeded", tc.in)
			}
			if err.Error() != tc.msg {
				t.Fatalf("ParseConfig(%q) error\n %q\nwant\n %q", tc.in, err.Error(), tc.msg)
			}
		})
	}
}

func TestConfigString(t *testing.T) {
	tests := map[string]struct{ in, want string }{
		"default":           {"", ""},
		"native is default": {"backend:native", ""},
		"reordered": {"expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.6",
			"max_split_size_mb:128,garbage_collection_threshold:0.6,expandable_segments:True"},
		"docs list":      {"roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"},
		"unit test list": {"roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]", "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]"},
		"uniform list":   {"roundup_power2_divisions:[1:4,>:4]", "roundup_power2_divisions:4"},
		"gap":            {"roundup_power2_divisions:[2:4,16:8]", "roundup_power2_divisions:[2:4,4:0,8:0,16:8,>:0]"},
		"all":            {"large_segment_size_mb:40,max_split_size_mb:200,max_non_split_rounding_mb:60,per_process_memory_fraction:0.9,pinned_use_background_threads:True", "large_segment_size_mb:40,max_split_size_mb:200,max_non_split_rounding_mb:60,per_process_memory_fraction:0.9,pinned_use_background_threads:True"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, err := ParseConfig(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.String(); got != tc.want {
				t.Fatalf("String() = %q, want %q", got, tc.want)
			}
			back, err := ParseConfig(cfg.String())
			if err != nil {
				t.Fatalf("reparse %q: %v", cfg.String(), err)
			}
			back.Source, cfg.Source = "", ""
			if !reflect.DeepEqual(back, cfg) {
				t.Fatalf("round trip changed the config:\n %+v\n %+v", cfg, back)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := map[string]struct {
		cfg Config
		ok  bool
	}{
		"default":             {Config{}, true},
		"split ok":            {Config{MaxSplitSize: 20 * mib}, true},
		"split too small":     {Config{MaxSplitSize: 10 * mib}, false},
		"split not MiB":       {Config{MaxSplitSize: 30*mib + 1}, false},
		"bad division":        {Config{RoundupPower2Divisions: divisionsTable(3)}, false},
		"gc out of range":     {Config{GarbageCollectionThreshold: 1}, false},
		"fraction negative":   {Config{PerProcessMemoryFraction: -0.1}, false},
		"async":               {Config{Backend: "cudaMallocAsync"}, true},
		"unknown backend":     {Config{Backend: "cudaMalloc"}, false},
		"segment too small":   {Config{LargeSegmentSize: 10 * mib}, false},
		"segment 12 MiB":      {Config{LargeSegmentSize: 12 * mib}, true},
		"split below segment": {Config{LargeSegmentSize: 64 * mib, MaxSplitSize: 32 * mib}, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestConfigIncludes: a setting is already in effect when the recorded settings make it with the same value,
// whatever else they set; the default configuration includes nothing but the defaults.
func TestConfigIncludes(t *testing.T) {
	parse := func(s string) Config {
		c, err := ParseConfig(s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		return c
	}
	for _, c := range []struct {
		recorded, fix string
		want          bool
	}{
		{"expandable_segments:True,max_split_size_mb:128", "expandable_segments:True", true},
		{"expandable_segments:True", "expandable_segments:True", true},
		{"", "expandable_segments:True", false},
		{"expandable_segments:False", "expandable_segments:True", false},
		{"max_split_size_mb:128", "max_split_size_mb:512", false},
		{"max_split_size_mb:512,garbage_collection_threshold:0.6", "garbage_collection_threshold:0.6", true},
		{"expandable_segments:True", "", true},
		{"pinned_num_register_threads:8", "expandable_segments:True", false},
	} {
		if got := parse(c.recorded).Includes(parse(c.fix)); got != c.want {
			t.Errorf("%q includes %q: %v, want %v", c.recorded, c.fix, got, c.want)
		}
	}
}
