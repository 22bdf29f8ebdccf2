package app

import (
	"fmt"
	"os"

	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// BaseConfig is the configuration a run starts from, before the flags that change it: the preset's, that of
// the Hugging Face config.json at hfConfig, or model's default (train.DefaultPreset for gpt,
// train.DefaultLlamaPreset for llama, the MLP otherwise).
func BaseConfig(preset, hfConfig, model string) (train.Config, error) {
	switch {
	case hfConfig != "" && preset != "":
		return train.Config{}, fmt.Errorf("--hf-config and --preset both name a model: give one")
	case hfConfig != "":
		f, err := os.Open(hfConfig)
		if err != nil {
			return train.Config{}, err
		}
		defer f.Close()
		m, err := hfconfig.Read(f)
		if err != nil {
			return train.Config{}, fmt.Errorf("%s: %w", hfConfig, err)
		}
		return train.FromHF(m), nil
	case preset == "" && model == "gpt":
		preset = train.DefaultPreset
	case preset == "" && model == "llama":
		preset = train.DefaultLlamaPreset
	case preset == "" && model == "bert":
		preset = train.DefaultBertPreset
	case preset == "":
		return train.DefaultMLP(), nil
	}
	return train.PresetConfig(preset)
}
