package frameworks

import (
	"encoding"
	"fmt"
	"strconv"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// setters apply an `oomdbg run` flag to a configuration as the command line does: the same words, parsed
// by the same types (each Config field's UnmarshalText), so that the flags a Mapping prints give its Config.
var setters = map[string]func(c *train.Config, v string) error{
	"batch":                 intField(func(c *train.Config) *int { return &c.Batch }),
	"accum":                 intField(func(c *train.Config) *int { return &c.Accum }),
	"seq":                   intField(func(c *train.Config) *int { return &c.Seq }),
	"lora":                  intField(func(c *train.Config) *int { return &c.LoRA }),
	"lora-alpha":            floatField(func(c *train.Config) *float32 { return &c.LoRAAlpha }),
	"lora-dropout":          floatField(func(c *train.Config) *float32 { return &c.LoRADropout }),
	"lr":                    floatField(func(c *train.Config) *float32 { return &c.LR }),
	"weight-decay":          floatField(func(c *train.Config) *float32 { return &c.WeightDecay }),
	"qlora":                 boolField(func(c *train.Config) *bool { return &c.QLoRA }),
	"qlora-head":            boolField(func(c *train.Config) *bool { return &c.QLoRAHead }),
	"tied":                  boolField(func(c *train.Config) *bool { return &c.Tied }),
	"optimizer-in-backward": boolField(func(c *train.Config) *bool { return &c.OptimizerInBackward }),
	"sort-by-length":        boolField(func(c *train.Config) *bool { return &c.SortByLength }),
	"lora-targets":          textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.LoRATargets }),
	"weights":               textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.Weights }),
	"amp":                   textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.AMP }),
	"checkpoint":            textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.Checkpoint }),
	"attention":             textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.Attention }),
	"optimizer":             textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.Optimizer }),
	"optimizer-impl":        textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.OptimizerImpl }),
	"zero-grad":             textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.ZeroGrad }),
	"lora-dtype":            textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.LoRADType }),
	"loss":                  textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.Loss }),
	"qlora-double-quant":    textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.QLoRADoubleQuant }),
	"qlora-storage":         textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.QLoRAStorage }),
	"qlora-half":            textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.QLoRAHalf }),
	"kbit-prep":             textField(func(c *train.Config) encoding.TextUnmarshaler { return &c.KbitPrep }),
	"offload": func(c *train.Config, v string) error {
		o, err := train.ParseOffload(v)
		if err == nil {
			c.SetOffload(o)
		}
		return err
	},
}

// boolFlags are the setters of boolean flags (and of toggles, which take no value alone), which print as
// --name=value.
var boolFlags = map[string]bool{"qlora": true, "qlora-head": true, "tied": true, "optimizer-in-backward": true,
	"sort-by-length": true, "qlora-double-quant": true, "qlora-half": true, "kbit-prep": true}

// The knobs' types are the Config fields' own: check it once.
var _ = []encoding.TextUnmarshaler{new(knob.AMP), new(knob.Checkpoint), new(knob.Attention), new(knob.Optimizer)}

func intField(at func(*train.Config) *int) func(*train.Config, string) error {
	return func(c *train.Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%q is not an integer", v)
		}
		*at(c) = n
		return nil
	}
}

func floatField(at func(*train.Config) *float32) func(*train.Config, string) error {
	return func(c *train.Config, v string) error {
		f, err := strconv.ParseFloat(v, 32)
		if err != nil {
			return fmt.Errorf("%q is not a number", v)
		}
		*at(c) = float32(f)
		return nil
	}
}

func boolField(at func(*train.Config) *bool) func(*train.Config, string) error {
	return func(c *train.Config, v string) error {
		x, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q is not true or false", v)
		}
		*at(c) = x
		return nil
	}
}

func textField(at func(*train.Config) encoding.TextUnmarshaler) func(*train.Config, string) error {
	return func(c *train.Config, v string) error { return at(c).UnmarshalText([]byte(v)) }
}

// formatFloat writes a setting's number as the flag takes it: the shortest form that reads back the same.
func formatFloat(f float64) string { return strconv.FormatFloat(float64(float32(f)), 'g', -1, 32) }
