package main

import (
	"bytes"
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestConfigFileIsItsFlags checks, for every frozen framework configuration, that `--config FILE` and the
// flags it prints make the same run configuration through the command line's own flags, and that flags
// given with --config change it.
func TestConfigFileIsItsFlags(t *testing.T) {
	dir := filepath.Join("..", "..", "workloads", "train", "frameworks", "testdata")
	files, _ := filepath.Glob(filepath.Join(dir, "*", "*.y*ml"))
	more, _ := filepath.Glob(filepath.Join(dir, "hf-trainer", "*", "training_args.json"))
	files = append(files, more...)
	if len(files) < 8 {
		t.Fatalf("%d frozen configurations", len(files))
	}
	parse := func(args ...string) (train.Config, *configFlags) {
		t.Helper()
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		f := addConfigFlags(fs, train.DefaultMLP()).addHFConfig()
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		cfg, err := f.config()
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return cfg, f
	}
	for _, file := range files {
		fromFile, f := parse("--config", file)
		fromFlags, _ := parse(f.mapping.Flags...)
		if !reflect.DeepEqual(fromFile, fromFlags) {
			t.Errorf("%s: --config gives\n%+v\nits flags\n%+v", file, fromFile, fromFlags)
		}
		changed, _ := parse("--config", file, "--batch", "1", "--checkpoint", "selective:ops")
		if changed.Batch != 1 || !changed.Checkpoint.Ops() {
			t.Errorf("%s: flags given with --config do not change it: batch %d, checkpoint %s", file, changed.Batch, changed.Checkpoint)
		}
	}
}

// TestRunWithConfigFile runs a recipe headless: the mapping on standard error, the run's summary on
// standard output; and refuses --config with --preset.
func TestRunWithConfigFile(t *testing.T) {
	recipe := filepath.Join("..", "..", "workloads", "train", "frameworks", "testdata", "axolotl", "llama-3_qlora-1b.yml")
	out := filepath.Join(t.TempDir(), "run.oomdbg")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "-o", out, "--config", recipe, "--steps", "1", "--seq", "256"}, &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, want := range []string{"axolotl config ", "oomdbg run --preset llama-3.2-1b --lora 32", "ignored:", "--qlora-storage bf16"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	if !strings.Contains(stdout.String(), "llama-3.2-1b [QLoRA r=32, bf16 weights, stored in bf16]") {
		t.Errorf("stdout:\n%s", stdout.String())
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"run", "-o", out, "--config", recipe, "--preset", "tiny"}, &stdout, &stderr); code != exitUsage ||
		!strings.Contains(stderr.String(), "--config and --preset both name a model") {
		t.Errorf("--config with --preset: exit %d, %q", code, stderr.String())
	}
}
