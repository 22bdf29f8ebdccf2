package dist

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/workloads/tensor"
)

func TestSettingsParseAndRoundTrip(t *testing.T) {
	t.Parallel()
	for _, s := range Strategies {
		got, err := ParseStrategy(s.String())
		if err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %v, %v", s, got, err)
		}
	}
	for _, o := range Offloads {
		if got, err := ParseOffload(o.String()); err != nil || got != o {
			t.Errorf("ParseOffload(%q) = %v, %v", o, got, err)
		}
	}
	if _, err := ParseStrategy("zero4"); err == nil || !strings.Contains(err.Error(), "zero3") {
		t.Errorf("zero4: %v", err)
	}
	in := Settings{GPUs: 16, Nodes: 2, Strategy: HSDP, Rank: 3, Offload: OffloadOptimizerParams, BucketCapMB: 12.5,
		ReduceBucketSize: 2e8, Wrap: WrapModel}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Settings
	if err := json.Unmarshal(b, &out); err != nil || out != in {
		t.Fatalf("round trip of %s: %+v, %v", b, out, err)
	}
	if b, _ := json.Marshal(Settings{}); string(b) != "{}" {
		t.Errorf("the zero Settings marshal to %s, want {} (one GPU says nothing)", b)
	}
	if err := json.Unmarshal([]byte(`{"strategy":"zero9"}`), &out); err == nil {
		t.Error("an unknown strategy read back")
	}
}

func TestSettingsValidate(t *testing.T) {
	t.Parallel()
	ok := []Settings{{}, {GPUs: 8, Strategy: DDP}, {GPUs: 8, Strategy: ZeRO2, Offload: OffloadOptimizer},
		{GPUs: 8, Nodes: 2, Strategy: HSDP, Offload: OffloadOptimizerParams}, {GPUs: 1, Strategy: ZeRO3}}
	for _, s := range ok {
		if err := s.Validate(); err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
	bad := map[string]Settings{
		"gpus":                                {GPUs: -1, Strategy: DDP},
		"nodes":                               {GPUs: 6, Nodes: 4, Strategy: DDP},
		"rank":                                {GPUs: 4, Rank: 4, Strategy: DDP},
		"need a data-parallel strategy":       {GPUs: 4},
		"ddp offloads nothing":                {GPUs: 4, Strategy: DDP, Offload: OffloadOptimizer},
		"use --offload optimizer+params":      {GPUs: 4, Strategy: FSDPFull, Offload: OffloadOptimizer},
		"offloads parameters only at stage 3": {GPUs: 4, Strategy: ZeRO1, Offload: OffloadOptimizerParams},
		"bucket_cap_mb":                       {GPUs: 4, Strategy: DDP, BucketCapMB: -1},
		"reduce_bucket_size":                  {GPUs: 4, Strategy: ZeRO2, ReduceBucketSize: MaxBucketElements + 1},
	}
	for want, s := range bad {
		err := s.Validate()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want an error saying %q", s, err, want)
		}
	}
	var se *SettingError
	if err := (Settings{GPUs: 4, Rank: -2, Strategy: DDP}).Validate(); !errors.As(err, &se) || se.Field != "rank" {
		t.Errorf("rank -2: %v", err)
	}
}

func TestParseElements(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]int64{"5e8": 500_000_000, "500000000": 500_000_000, "0": 0, " 1e5 ": 100_000} {
		if got, err := ParseElements(s); err != nil || got != want {
			t.Errorf("ParseElements(%q) = %d, %v", s, got, err)
		}
	}
	for _, s := range []string{"1.5", "-1", "1e13", "x", "NaN", "Inf"} {
		if _, err := ParseElements(s); err == nil {
			t.Errorf("ParseElements(%q) succeeded", s)
		}
	}
}

// The reducer's rule on a hand-made case: a bucket closes at the first tensor that brings it to its limit.
func TestBucketAssignment(t *testing.T) {
	t.Parallel()
	// Limits 10 then 25: [4 4 3] closes at 11 >= 10; [20 6] at 26 >= 25; [30] alone; [1] left open.
	got := bucketAssignment([]int64{4, 4, 3, 20, 6, 30, 1}, make([]tensor.DType, 7), []int64{10, 25})
	want := "[[0 1 2] [3 4] [5] [6]]"
	if s := fmt.Sprint(got); s != want {
		t.Errorf("buckets %s, want %s", s, want)
	}
}
