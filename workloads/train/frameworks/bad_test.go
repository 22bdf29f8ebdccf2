package frameworks

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestBadConfigsRefusedInOneLine hands the reader what an attacker or a typo would: each is refused with one
// line that says what is wrong.
func TestBadConfigsRefusedInOneLine(t *testing.T) {
	bomb := "a: &a [x, x, x, x, x, x, x, x, x]\n"
	for i, prev := 0, "a"; i < 9; i++ {
		name := string(rune('b' + i))
		bomb += name + ": &" + name + " [*" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + "]\n"
		prev = name
	}
	tests := map[string]struct{ content, want string }{
		"not yaml":         {"a: [", "not YAML or JSON"},
		"a list":           {"- batch_size: 2", "not a mapping of settings"},
		"nothing known":    {"epochs: 3", "not a torchtune recipe"},
		"unknown model":    {"model:\n  _component_: torchtune.models.falcon.falcon_7b\n", `model._component_ "falcon_7b": oomdbg has no preset`},
		"bad batch":        {"model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\nbatch_size: many\n", "batch_size: want an integer"},
		"bad dtype":        {"model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\ndtype: fp8\n", `dtype "fp8"`},
		"bad precision":    {"checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: 8-true\n", `precision "8-true"`},
		"uneven batches":   {"checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\ntrain:\n  micro_batch_size: 3\n  global_batch_size: 8\n", "not a multiple"},
		"bad lora target":  {"base_model: NousResearch/Llama-3.2-1B\nadapter: lora\nlora_r: 8\nlora_target_modules: 7\n", "lora_target_modules: want a list of names"},
		"alias bomb":       {bomb, "not YAML or JSON"},
		"no config.json":   {`{"per_device_train_batch_size": 2}`, "config.json must be beside them"},
		"json, not args":   {`{"epochs": 2}`, "not TrainingArguments"},
		"bad ac option":    {"model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\nac_mode: selective\nac_option: op\n", "ac_option"},
		"negative seq len": {"base_model: NousResearch/Llama-3.2-1B\nsequence_len: -5\n", "seq -5"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "config.yaml")
			if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := ReadFile(path, nil)
			if err == nil {
				err = m.Config.Validate() // a setting the reader takes as it comes is refused where the run checks it
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("got %v, want one line with %q", err, tc.want)
			}
		})
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, []byte("a: "+strings.Repeat("x", MaxSize)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(big, nil); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("a file over MaxSize: %v", err)
	}
}

// TestFlagsGiveTheConfig replays each frozen configuration's flags through the setters onto the model they
// name, and checks they give the mapped configuration, field for field: the printed command line is the
// configuration.
func TestFlagsGiveTheConfig(t *testing.T) {
	files, _ := filepath.Glob("testdata/*/*.y*ml")
	more, _ := filepath.Glob("testdata/hf-trainer/*/training_args.json")
	for _, f := range append(files, more...) {
		m, err := ReadFile(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := replay(m.Flags)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if !reflect.DeepEqual(got, m.Config) {
			t.Errorf("%s: the flags give\n%+v\nthe mapping\n%+v", f, got, m.Config)
		}
	}
}

// replay applies flags as the command line would, from the model they name.
func replay(flags []string) (train.Config, error) {
	var cfg train.Config
	for i := 0; i < len(flags); i++ {
		name, value, inline := strings.Cut(strings.TrimPrefix(flags[i], "--"), "=")
		if !inline {
			i++
			value = flags[i]
		}
		var err error
		switch name {
		case "preset":
			cfg, err = train.PresetConfig(value)
		case "hf-config":
			var data []byte
			if data, err = os.ReadFile(value); err == nil {
				var m *hfconfig.Model
				if m, err = hfconfig.Parse(data); err == nil {
					cfg = train.FromHF(m)
				}
			}
		default:
			err = setters[name](&cfg, value)
		}
		if err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// FuzzParse feeds the reader arbitrary files (the frozen configurations as seeds): it returns a mapping or an
// error, never panics in its own code, and what it maps is what its flags give.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*/*.y*ml")
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data, t.TempDir(), nil)
		if err != nil {
			if strings.HasPrefix(err.Error(), "not a configuration this reads: ") {
				t.Fatalf("a panic: %v", err)
			}
			return
		}
		if got, err := replay(m.Flags); err != nil || !reflect.DeepEqual(got, m.Config) {
			t.Fatalf("flags %v give %+v (%v), the mapping %+v", m.Flags, got, err, m.Config)
		}
	})
}
