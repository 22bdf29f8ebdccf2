package torchrules

import (
	"reflect"
	"testing"
)

// FuzzParseConfig checks the settings parser never panics, that whatever it accepts validates, and that
// the canonical rendering parses back to the same settings.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		"",
		"max_split_size_mb:128,expandable_segments:True",
		"roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
		"roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]",
		"roundup_power2_divisions:4,garbage_collection_threshold:0.6",
		"large_segment_size_mb:40,max_split_size_mb:40,max_non_split_rounding_mb:64",
		"expandable_segments_reserve_by_class:[a:0.5,b:40G],pinned_num_register_threads:8",
		"backend:native,per_process_memory_fraction:0.5",
		"roundup_power2_divisions:[",
		"a:[b:[c]]",
		":,:,[,]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cfg, err := ParseConfig(s)
		if err != nil {
			if _, ok := err.(*ConfigError); !ok {
				t.Fatalf("ParseConfig(%q) error %T, want *ConfigError", s, err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("ParseConfig(%q) accepted settings that do not validate: %v", s, err)
		}
		back, err := ParseConfig(cfg.String())
		if err != nil {
			t.Fatalf("rendering %q of %q does not parse: %v", cfg.String(), s, err)
		}
		back.Source, cfg.Source = "", ""
		if !reflect.DeepEqual(back, cfg) {
			t.Fatalf("%q -> %q changed the settings:\n %+v\n %+v", s, cfg.String(), cfg, back)
		}
	})
}
