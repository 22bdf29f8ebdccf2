package snapshot_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/charmbracelet/x/exp/golden"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

// goldenFile is the small fixed snapshot whose bytes the golden files pin: every action, every address mode,
// several chunks (one per phase marker, at most eight events each), a footer.
func goldenFile(t testing.TB) ([]byte, []snapshot.Event) {
	return encode(t, everyAction, testFooter(21), snapshot.WithChunkEvents(8), snapshot.WithChunkAge(0),
		snapshot.WithCompressionLevel(3))
}

// TestGolden pins the bytes the Writer produces, and a readable dump of them. After an intended change to the
// encoding, regenerate with `go test ./snapshot/ -update` and review the dump's diff.
func TestGolden(t *testing.T) {
	data, _ := goldenFile(t)
	t.Run("file", func(t *testing.T) {
		golden.RequireEqual(t, data)
	})
	t.Run("dump", func(t *testing.T) {
		var buf bytes.Buffer
		if err := snapshot.Dump(&buf, data); err != nil {
			t.Fatal(err)
		}
		golden.RequireEqual(t, buf.Bytes())
	})
}

// TestReadVersion1 reads a version-1 file written when version 1 was defined. Unlike the golden files it is
// never regenerated: every later reader must read it, whatever the Writer writes then.
func TestReadVersion1(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "v1.oomdbg"))
	if err != nil {
		t.Fatal(err)
	}
	_, want := goldenFile(t)
	s := readAll(t, data)
	sameEvents(t, s.Events, want)
	if !reflect.DeepEqual(s.Footer, testFooter(21)) || !reflect.DeepEqual(s.Meta, testMeta()) || s.Warning != nil {
		t.Errorf("footer %v, meta %v, warning %v", s.Footer, s.Meta, s.Warning)
	}
	if got := s.String(s.Events.At(3).Label); got != "f32[8,1024,2304] qkv.out" {
		t.Errorf("label of event 3 = %q", got)
	}
	if got := s.Frame(s.Stack(s.Events.At(3).Stack)[1]); s.String(got.Function) != "github.com/oomdbg/oomdbg/workloads/nn.(*Linear).Forward" || got.Line != 44 {
		t.Errorf("outer frame of event 3's stack = %+v", got)
	}
}

// TestLoadPhaseIsVersion2 reads a load phase marker from a version-2 file, and refuses the same bytes
// labelled version 1, which defines no load phase (docs/format.md §10).
func TestLoadPhaseIsVersion2(t *testing.T) {
	data, _ := encode(t, func(s snapshottest.Sink) []snapshot.Event {
		return []snapshot.Event{
			emit(s, snapshot.Event{Action: snapshot.ActionPhase, Phase: snapshot.PhaseLoad, Iteration: -1}),
			emit(s, snapshot.Event{Action: snapshot.ActionAlloc, Addr: 1 << 20, Size: 512, BlockSize: 512, Phase: snapshot.PhaseLoad, Iteration: -1}),
		}
	}, nil)
	s := readAll(t, data)
	if got := s.Events.At(1).Phase; got != snapshot.PhaseLoad || got.String() != "load" {
		t.Fatalf("phase %v", got)
	}
	if p, ok := snapshot.ParsePhase("load"); !ok || p != snapshot.PhaseLoad {
		t.Errorf("ParsePhase(load) = %v, %v", p, ok)
	}
	v1 := bytes.Clone(data)
	v1[8] = 1
	n := int(binary.LittleEndian.Uint32(v1[12:]))
	binary.LittleEndian.PutUint32(v1[16+n:], crc32.Checksum(v1[:16+n], crc32.MakeTable(crc32.Castagnoli)))
	if _, err := snapshot.Read(bytes.NewReader(v1)); !errors.Is(err, snapshot.ErrCorrupt) {
		t.Errorf("a load phase in a version-1 file: err = %v, want ErrCorrupt", err)
	}
}
