package train

import (
	"context"
	"errors"
	"math"
	"testing"
)

// TestValidateNumbers checks that every numeric field is bounded, with the field named: overflowing shapes,
// impossible memory sizes, NaNs, counts out of range.
func TestValidateNumbers(t *testing.T) {
	gpt, err := PresetConfig("gpt2-small")
	if err != nil {
		t.Fatal(err)
	}
	mlp := DefaultMLP()
	tests := map[string]struct {
		base  Config
		edit  func(*Config)
		field string // "" : valid
	}{
		"mlp as is":                {mlp, func(*Config) {}, ""},
		"gpt as is":                {gpt, func(*Config) {}, ""},
		"mlp hidden 2^62":          {mlp, func(c *Config) { c.Hidden = 1 << 62 }, "hidden"},
		"mlp hidden 2^30":          {mlp, func(c *Config) { c.Hidden = 1 << 30 }, "hidden"},
		"mlp in_features huge":     {mlp, func(c *Config) { c.InFeatures = math.MaxInt }, "in_features"},
		"mlp zero classes":         {mlp, func(c *Config) { c.Classes = 1 }, "classes"},
		"gpt d_model 2^40":         {gpt, func(c *Config) { c.DModel, c.Heads = 1<<40, 1 }, "d_model"},
		"gpt seq overflows scores": {gpt, func(c *Config) { c.Seq = 1 << 32 }, "seq"},
		"gpt layers 2^40":          {gpt, func(c *Config) { c.Layers = 1 << 40 }, "layers"},
		"gpt heads do not divide":  {gpt, func(c *Config) { c.Heads = 7 }, "heads"},
		"gpt dropout NaN":          {gpt, func(c *Config) { c.Dropout = float32(math.NaN()) }, "dropout"},
		"gpt dropout 1":            {gpt, func(c *Config) { c.Dropout = 1 }, "dropout"},
		"batch 0":                  {mlp, func(c *Config) { c.Batch = 0 }, "batch"},
		"batch huge":               {mlp, func(c *Config) { c.Batch = 1 << 60 }, "batch"},
		"accum 1e9":                {gpt, func(c *Config) { c.Accum = 1_000_000_000 }, "accum"},
		"steps negative":           {mlp, func(c *Config) { c.Steps = -1 }, "steps"},
		"steps past int32":         {mlp, func(c *Config) { c.Steps = math.MaxInt32 + 1 }, "steps"},
		"eval_every past int32":    {mlp, func(c *Config) { c.EvalEvery = 1 << 40 }, "eval_every"},
		"lr infinite":              {mlp, func(c *Config) { c.LR = float32(math.Inf(1)) }, "lr"},
		"weight decay negative":    {mlp, func(c *Config) { c.WeightDecay = -1 }, "weight_decay"},
		"gpu memory 2^64-2^30":     {mlp, func(c *Config) { c.GPUMemory = 1<<64 - 1<<30 }, "gpu_memory"},
		"gpu memory 1 PiB":         {mlp, func(c *Config) { c.GPUMemory = MaxGPUMemory }, ""},
		"reserve above memory":     {mlp, func(c *Config) { c.ContextReserve = c.GPUMemory }, "context_reserve"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := tc.base
			tc.edit(&c)
			err := c.Validate()
			var fe *FieldError
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field):
				t.Fatalf("Validate: %v, want a FieldError on %s", err, tc.field)
			}
		})
	}
}

// TestParameterBound holds the parameter bound against the parameters of the models as built: exact for the
// GPT (nanoGPT with biases, as the presets are), an upper bound for the MLP.
func TestParameterBound(t *testing.T) {
	for _, name := range []string{"tiny", "gpt2-small", "gpt2-medium", "buildalong", "mlp"} {
		t.Run(name, func(t *testing.T) {
			cfg, err := PresetConfig(name)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Steps = 0
			cfg.GPUMemory = MaxGPUMemory
			res, _, err := Run(context.Background(), cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, bound := cfg.parameterBound()
			if bound < uint64(res.Parameters) || cfg.Model == "gpt" && cfg.Bias && bound != uint64(res.Parameters) {
				t.Errorf("bound %d for a model of %d parameters", bound, res.Parameters)
			}
		})
	}
}
