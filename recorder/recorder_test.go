package recorder_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/recorder"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// repoRoot is the repository's root, where examples/ is.
func repoRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(wd)
}

// fakeEnv is the environment of a job recorded against the fake CUDA of release version, which writes its
// truth to truth.
func fakeEnv(t testing.TB, version, truth string, extra ...string) []string {
	t.Helper()
	fake, err := filepath.Abs("testdata/fakecuda")
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "OMP_NUM_THREADS=1",
		"PYTHONPATH=" + fake + string(os.PathListSeparator) + filepath.Join(filepath.Dir(fake), "hfstub"),
		"FAKECUDA_TORCH=" + version, "PYTHONDONTWRITEBYTECODE=1"}
	if truth != "" {
		env = append(env, "FAKECUDA_TRUTH="+truth)
	}
	return append(env, extra...)
}

// record runs examples/record/loop.py with args under the recorder, against the fake CUDA.
func record(t *testing.T, opt recorder.Options, env []string, args ...string) (recorder.Result, string, string) {
	t.Helper()
	torchtest.Require(t)
	var stdout, stderr bytes.Buffer
	opt.Env, opt.Stdout, opt.Stderr, opt.Stdin = env, &stdout, &stderr, strings.NewReader("")
	argv := append([]string{torchtest.Python, filepath.Join(repoRoot(t), "examples/record/loop.py"), "--device", "cpu"}, args...)
	res, err := recorder.Run(context.Background(), argv, opt)
	if err != nil {
		t.Fatalf("recorder.Run: %v\nstderr:\n%s", err, stderr.String())
	}
	return res, stdout.String(), stderr.String()
}

// truth is what the loop knew, as the fake wrote it: every allocation of the recording, in trace order.
type truthFile struct {
	Allocs []struct {
		Addr      uint64
		Size      int64
		Phase     string
		Iteration int32
		Category  *string
	}
}

func (tf *truthFile) UnmarshalJSON(b []byte) error {
	var raw struct {
		Allocs [][]json.RawMessage `json:"allocs"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	tf.Allocs = make([]struct {
		Addr      uint64
		Size      int64
		Phase     string
		Iteration int32
		Category  *string
	}, len(raw.Allocs))
	for i, a := range raw.Allocs {
		x := &tf.Allocs[i]
		for j, dst := range []any{&x.Addr, &x.Size, &x.Phase, &x.Iteration, &x.Category} {
			if err := json.Unmarshal(a[j], dst); err != nil {
				return err
			}
		}
	}
	return nil
}

func readTruth(t *testing.T, path string) truthFile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var tf truthFile
	if err := json.Unmarshal(data, &tf); err != nil {
		t.Fatal(err)
	}
	return tf
}

// recordedAllocs returns the allocations the trace of s recorded, in order.
func recordedAllocs(s *snapshot.Snapshot) []snapshot.Event {
	var out []snapshot.Event
	for i := range s.Events.Len() {
		e := s.Events.At(i)
		if e.Action == snapshot.ActionAlloc && !s.Reconstructed(&e) {
			out = append(out, e)
		}
	}
	return out
}

// modelStates are the categories the recorder tags; a block the loop did not tag must not carry one.
var modelStates = map[snapshot.Category]bool{snapshot.CategoryParameter: true, snapshot.CategoryGradient: true,
	snapshot.CategoryOptimizerState: true, snapshot.CategoryInput: true}

// TestRecordedTagsAgainstTruth records the loop against the fake CUDA of each release the recorder supports
// and holds the dump's phases, iterations and categories, as the importer reads them, to what the loop
// knew of every allocation: the phase and iteration it was in, and which tensors were parameters,
// gradients, optimizer state and its batch. Weighted by bytes, all must agree.
func TestRecordedTagsAgainstTruth(t *testing.T) {
	loops := map[string][]string{
		"zero_grad at the end":              {"--steps", "4"},
		"zero_grad first, accumulate, clip": {"--steps", "4", "--zero-grad", "top", "--accum", "2", "--clip"},
		"sgd, gradients zeroed in place":    {"--steps", "3", "--optimizer", "sgd", "--set-to-none", "false"},
		// Trainer's on_step_begin begins each iteration; the batch goes to the model as keyword arguments.
		"hf trainer callbacks, accumulate": {"--steps", "3", "--hf-callbacks", "--accum", "2", "--clip"},
	}
	for _, version := range []string{"2.0", "2.1", "2.3", "2.5", "2.7"} {
		for name, args := range loops {
			t.Run(version+"/"+name, func(t *testing.T) {
				t.Parallel() // each records its own Python process: two cores run two
				dir := t.TempDir()
				truthPath := filepath.Join(dir, "truth.json")
				res, _, stderr := record(t, recorder.Options{Dir: filepath.Join(dir, "dumps")}, fakeEnv(t, version, truthPath), args...)
				if res.ExitCode != 0 {
					t.Fatalf("exit %d\n%s", res.ExitCode, stderr)
				}
				end := dumpOf(t, res, recorder.DumpEnd)
				s, err := torch.ImportFile(end)
				if err != nil {
					t.Fatal(err)
				}
				o, _ := torch.OriginOf(s)
				if o.Recorded == nil || o.Iterations != torch.IterationsRecorded.String() {
					t.Fatalf("iterations %q, recorded %+v", o.Iterations, o.Recorded)
				}
				tf := readTruth(t, truthPath)
				got := recordedAllocs(s)
				if len(got) != len(tf.Allocs) {
					t.Fatalf("%d allocations imported, the loop made %d", len(got), len(tf.Allocs))
				}
				var total, phaseOK, iterOK, catOK, catTotal int64
				for i, e := range got {
					want := tf.Allocs[i]
					if e.Addr != want.Addr || e.Size != want.Size {
						t.Fatalf("allocation %d: %#x %d bytes, the loop's is %#x %d bytes", i, e.Addr, e.Size, want.Addr, want.Size)
					}
					n := e.Size
					total += n
					if e.Phase.String() == want.Phase {
						phaseOK += n
					} else if testing.Verbose() {
						t.Logf("allocation %d (%d bytes): phase %s, the loop's %s", i, n, e.Phase, want.Phase)
					}
					if e.Iteration == want.Iteration {
						iterOK += n
					}
					switch {
					case want.Category != nil:
						catTotal += n
						if e.Category.String() == *want.Category {
							catOK += n
						} else {
							t.Errorf("allocation %d (%d bytes): category %s, the loop's %s", i, n, e.Category, *want.Category)
						}
					case modelStates[e.Category]:
						t.Errorf("allocation %d (%d bytes): category %s, but the loop never said so", i, n, e.Category)
					}
				}
				t.Logf("%d allocations, %d bytes: phases %.2f%%, iterations %.2f%%, categories %.2f%% of %d tagged bytes",
					len(got), total, 100*float64(phaseOK)/float64(total), 100*float64(iterOK)/float64(total),
					100*float64(catOK)/float64(max(catTotal, 1)), catTotal)
				if phaseOK != total || iterOK != total {
					t.Errorf("phases right for %d of %d bytes, iterations for %d", phaseOK, total, iterOK)
				}
				if catTotal == 0 {
					t.Error("the loop tagged nothing")
				}
			})
		}
	}
}

// dumpOf returns the path of the dump of kind a recording wrote.
func dumpOf(t *testing.T, res recorder.Result, kind recorder.DumpKind) string {
	t.Helper()
	for _, d := range res.Dumps {
		if d.Kind == kind {
			return d.Path
		}
	}
	t.Fatalf("no %s dump among %v", kind, res.Dumps)
	return ""
}
