// Package frameworks reads the configuration files of the trainers people run — a torchtune recipe, a LitGPT
// finetune YAML, an axolotl YAML, Hugging Face TrainingArguments as JSON beside the model's config.json —
// into the run configuration oomdbg simulates (train.Config). Each reader maps every field that changes
// memory (the model, the adapter, quantization, batch, sequence length, accumulation, checkpointing,
// precision, the optimizer, loss chunking, offloading, compile) onto the typed configuration, says which
// fields it ignored and why, and gives the `oomdbg run` flags that make the same configuration.
//
// A configuration file is input from anywhere: it is read once, at most MaxSize bytes, parsed by a
// maintained YAML library (or encoding/json), and every error is one line.
package frameworks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// Framework names the trainer a configuration file is for.
type Framework string

// The frameworks read.
const (
	Torchtune Framework = "torchtune"
	LitGPT    Framework = "litgpt"
	Axolotl   Framework = "axolotl"
	HFTrainer Framework = "hf-trainer" // TrainingArguments (and a peft adapter_config.json) beside config.json
)

// MaxSize bounds a configuration file: recipes are a few KiB.
const MaxSize = 1 << 20

// Mapping is what a framework's configuration file says of a training run.
type Mapping struct {
	Framework Framework
	Path      string
	// Config is the run configuration: the model's (a preset's or a config.json's) with the file's settings.
	Config train.Config
	// Flags are the `oomdbg run` flags that give Config: the model's (--preset NAME or --hf-config PATH),
	// then one per setting the file changes, in the order the reader met them.
	Flags []string
	// Ignored are the fields the file sets that the mapping does not carry into Config, each with why.
	Ignored []Ignored
}

// Ignored is a field of a configuration file the mapping leaves out, and why.
type Ignored struct {
	Field  string // as the file spells it: "clip_grad_norm", "model.apply_lora_to_output"
	Reason string
}

// Reasons shared by the readers.
const (
	noMemory      = "does not change memory"
	notModelled   = "not modelled yet"
	datasetLength = "the samples' lengths come from the dataset: every sample is --seq long here (--seq-dist file:PATH gives the dataset's lengths)"
	compileReason = "torch.compile is not modelled (oomdbg run --compile says why): the figures are eager PyTorch's"
)

// ReadFile reads the configuration file at path, telling its framework from its content. model, when not
// nil, is the model to train instead of the one the file names (--hf-config given with --config). A
// TrainingArguments JSON takes its model from the config.json beside it, and its adapter from a peft
// adapter_config.json there, if any.
func ReadFile(path string, model *train.Config) (*Mapping, error) {
	data, err := readBounded(path)
	if err != nil {
		return nil, err
	}
	m, err := Parse(data, filepath.Dir(path), model)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	m.Path = path
	return m, nil
}

// readBounded reads at most MaxSize bytes of the file at path, refusing a larger one.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(data) > MaxSize {
		return nil, fmt.Errorf("%s: more than %d bytes: not a training configuration", path, MaxSize)
	}
	return data, nil
}

// Parse maps a configuration file's content; dir is where files it refers to beside it are (config.json
// for TrainingArguments). model is ReadFile's.
func Parse(data []byte, dir string, model *train.Config) (m *Mapping, err error) {
	defer func() { // the decoders are third-party code on hostile input: a panic is a refusal, not a crash
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("not a configuration this reads: %v", r)
		}
	}()
	doc, err := decode(data)
	if err != nil {
		return nil, err
	}
	b := &builder{doc: doc, dir: dir, model: model, used: map[string]bool{}}
	switch {
	case looksLikeJSON(data):
		err = b.hfTrainer()
	case has(doc, "model._component_") || has(doc, "checkpointer"):
		err = b.torchtune()
	case has(doc, "checkpoint_dir") && (has(doc, "train.micro_batch_size") || has(doc, "train.global_batch_size") || has(doc, "precision")):
		err = b.litgpt()
	case has(doc, "base_model"):
		err = b.axolotl()
	default:
		return nil, errors.New("not a torchtune recipe (model._component_), a LitGPT finetune config (checkpoint_dir, train), an axolotl config (base_model) or TrainingArguments JSON")
	}
	if err != nil {
		return nil, err
	}
	return b.mapping(), nil
}

// decode parses YAML (of which JSON is a subset) into maps, lists and scalars.
func decode(data []byte) (map[string]any, error) {
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("not YAML or JSON: %s", firstLine(err.Error()))
	}
	m, ok := doc.(map[string]any)
	if !ok {
		return nil, errors.New("not a mapping of settings")
	}
	return m, nil
}

func looksLikeJSON(data []byte) bool {
	return bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) && json.Valid(data)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// builder makes a Mapping: the configuration, the flags that give it, the fields used and ignored.
type builder struct {
	doc   map[string]any
	dir   string
	model *train.Config

	fw      Framework
	cfg     train.Config
	base    []string // the model's flags
	flags   []string
	ignored []Ignored
	used    map[string]bool // the fields the reader looked at
}

func (b *builder) mapping() *Mapping {
	return &Mapping{Framework: b.fw, Config: b.cfg, Flags: append(slices.Clone(b.base), b.flags...), Ignored: b.ignored}
}

// useModel makes the model named name (a preset) the base, unless ReadFile was given one.
func (b *builder) useModel(field, name string) error {
	b.used[field] = true
	if b.model != nil {
		b.cfg, b.base = *b.model, nil
		b.ignore(field, "the model given with --hf-config is trained instead")
		return nil
	}
	preset, note, ok := presetFor(name)
	if !ok {
		return fmt.Errorf("%s %q: oomdbg has no preset of that model: give its config.json with --hf-config", field, name)
	}
	cfg, err := train.PresetConfig(preset)
	if err != nil {
		return err
	}
	b.cfg, b.base = cfg, []string{"--preset", preset}
	if note != "" {
		b.ignored = append(b.ignored, Ignored{field, note})
	}
	return nil
}

// set applies the flag --name value to the configuration, as the command line parses it, and records it.
func (b *builder) set(field, name, value string) error {
	b.used[field] = true
	apply, ok := setters[name]
	if !ok {
		panic("frameworks: no setter for --" + name)
	}
	if err := apply(&b.cfg, value); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	flag := []string{"--" + name, value}
	if _, isBool := boolFlags[name]; isBool { // --qlora=true: a boolean flag takes no separate value
		flag = []string{"--" + name + "=" + value}
	}
	for i, f := range b.flags { // a later setting replaces an earlier one
		if f == "--"+name || strings.HasPrefix(f, "--"+name+"=") {
			b.flags = slices.Delete(b.flags, i, i+len(flagWords(f)))
			break
		}
	}
	b.flags = append(b.flags, flag...)
	return nil
}

// flagWords is how many words a flag printed as f takes: one for --name=value, else two.
func flagWords(f string) []int {
	if strings.Contains(f, "=") {
		return []int{0}
	}
	return []int{0, 1}
}

// ignore records that field is left out, and why.
func (b *builder) ignore(field, reason string) {
	b.used[field] = true
	b.ignored = append(b.ignored, Ignored{field, reason})
}

// rest records every field of the document the reader did not look at as not changing memory, except the
// ones under prefixes known to be about memory (which the reader must have looked at).
func (b *builder) rest() {
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if b.used[prefix] {
			return
		}
		if m, ok := v.(map[string]any); ok && !b.usedUnder(prefix) {
			b.ignored = append(b.ignored, Ignored{prefix, noMemory})
			return
		} else if ok {
			for _, k := range sortedKeys(m) {
				walk(join(prefix, k), m[k])
			}
			return
		}
		if prefix != "" && v != nil {
			b.ignored = append(b.ignored, Ignored{prefix, noMemory})
		}
	}
	for _, k := range sortedKeys(b.doc) {
		walk(k, b.doc[k])
	}
}

// usedUnder reports whether the reader looked at a field under prefix.
func (b *builder) usedUnder(prefix string) bool {
	for f := range b.used {
		if strings.HasPrefix(f, prefix+".") {
			return true
		}
	}
	return false
}

func join(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// get returns the value at a dotted path ("train.micro_batch_size"), or nil.
func get(doc map[string]any, path string) any {
	var v any = doc
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func has(doc map[string]any, path string) bool { return get(doc, path) != nil }

// str returns the value at path as a string ("" when absent or null).
func (b *builder) str(path string) (string, error) {
	switch v := get(b.doc, path).(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	case bool, int, float64:
		return fmt.Sprint(v), nil
	default:
		return "", fmt.Errorf("%s: want a string, not %T", path, v)
	}
}

// integer returns the value at path as an integer; ok is false when it is absent or null.
func (b *builder) integer(path string) (n int, ok bool, err error) {
	switch v := get(b.doc, path).(type) {
	case nil:
		return 0, false, nil
	case int:
		return v, true, nil
	case float64:
		if v == float64(int(v)) {
			return int(v), true, nil
		}
	case string:
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
			return n, true, nil
		}
	}
	return 0, false, fmt.Errorf("%s: want an integer, not %v", path, get(b.doc, path))
}

// number returns the value at path as a float ("3e-4" in YAML 1.1 is a string).
func (b *builder) number(path string) (f float64, ok bool, err error) {
	switch v := get(b.doc, path).(type) {
	case nil:
		return 0, false, nil
	case int:
		return float64(v), true, nil
	case float64:
		return v, true, nil
	case string:
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
			return f, true, nil
		}
	}
	return 0, false, fmt.Errorf("%s: want a number, not %v", path, get(b.doc, path))
}

// boolean returns the value at path as a bool: YAML's and Python's spellings ("True", "auto" is true).
func (b *builder) boolean(path string) (v, ok bool, err error) {
	switch x := get(b.doc, path).(type) {
	case nil:
		return false, false, nil
	case bool:
		return x, true, nil
	case string:
		switch strings.ToLower(strings.TrimSpace(x)) {
		case "true", "yes", "1", "auto":
			return true, true, nil
		case "false", "no", "0", "":
			return false, true, nil
		}
	case int:
		return x != 0, true, nil
	}
	return false, false, fmt.Errorf("%s: want true or false, not %v", path, get(b.doc, path))
}

// strings returns the value at path as a list of strings (a single string is a list of one).
func (b *builder) strings(path string) ([]string, error) {
	switch v := get(b.doc, path).(type) {
	case nil:
		return nil, nil
	case string:
		return []string{v}, nil
	case []any:
		out := make([]string, 0, len(v))
		for _, x := range v {
			s, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("%s: want a list of names, not %v", path, v)
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s: want a list of names, not %v", path, get(b.doc, path))
}

// Write says what the mapping is, for people: the framework and file, the equivalent command line (join
// writes the flags as one, quoted for a shell), and the fields ignored, those that do not change memory
// together on one line.
func (m *Mapping) Write(w io.Writer, join func([]string) string) {
	fmt.Fprintf(w, "%s config %s, as flags:\n  oomdbg run %s\n", m.Framework, m.Path, join(m.Flags))
	if len(m.Ignored) == 0 {
		return
	}
	fmt.Fprintln(w, "ignored:")
	var quiet []string
	for _, i := range m.Ignored {
		if i.Reason == noMemory {
			quiet = append(quiet, i.Field)
			continue
		}
		fmt.Fprintf(w, "  %s: %s\n", i.Field, i.Reason)
	}
	if len(quiet) > 0 {
		fmt.Fprintf(w, "  %s: %s\n", strings.Join(quiet, ", "), noMemory)
	}
}
