package snapshot_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

// fuzzLimits keep one input's memory small, so the fuzzer explores instead of allocating.
var fuzzLimits = snapshot.Limits{
	MetaBytes: 64 << 10, ChunkBytes: 1 << 20, ChunkEvents: 1 << 14, StringBytes: 4 << 10, Strings: 1 << 14,
	Frames: 1 << 14, Stacks: 1 << 14, StackDepth: 256, TableBytes: 4 << 20, WindowBytes: 1 << 20, Events: 1 << 16,
}

// FuzzReader feeds arbitrary bytes to the Reader, as they are and with their checksums repaired, so that the
// fuzzer reaches the decoders behind the CRCs. Seeds are in testdata/fuzz/FuzzReader.
func FuzzReader(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data)
		if fixed := repairChecksums(data); !bytes.Equal(fixed, data) {
			checkRead(t, fixed)
		}
	})
}

// checkRead reads data with Read and with Next and checks what any reader may rely on.
func checkRead(t *testing.T, data []byte) {
	s, readErr := snapshot.Read(bytes.NewReader(data), snapshot.WithLimits(fuzzLimits))
	err := readErr
	if s == nil {
		var de *snapshot.DecodeError
		if !errors.As(err, &de) {
			t.Fatalf("Read without a snapshot must fail with a *DecodeError, got %v", err)
		}
		return
	}
	if err != nil {
		var de *snapshot.DecodeError
		if !errors.As(err, &de) {
			t.Fatalf("error is not a *DecodeError: %v", err)
		}
	}
	if s.Warning != nil && !errors.Is(s.Warning, snapshot.ErrTruncated) {
		t.Fatalf("warning %v", s.Warning)
	}
	for i, e := range s.Events.All() {
		if e.Seq != uint64(i) || !e.Action.Valid() || !e.Phase.Valid() || !e.Category.Valid() ||
			int(e.Scope) >= len(s.Strings) || int(e.Label) >= len(s.Strings) || int(e.Text) >= len(s.Strings) ||
			int(e.Stack) >= len(s.Stacks) {
			t.Fatalf("event %d is invalid: %+v", i, e)
		}
	}
	for id, st := range s.Stacks[1:] {
		for _, f := range st {
			if f == 0 || int(f) >= len(s.Frames) {
				t.Fatalf("stack %d has undefined frame %d", id+1, f)
			}
		}
	}
	r, err := snapshot.NewReader(bytes.NewReader(data), snapshot.WithLimits(fuzzLimits))
	if err != nil {
		t.Fatalf("Read read the header but NewReader fails: %v", err)
	}
	n := 0
	for {
		_, err := r.Next()
		if err != nil {
			if readErr == nil && (err != io.EOF || n != s.Events.Len()) {
				t.Fatalf("Next: %d events then %v; Read: %d events", n, err, s.Events.Len())
			}
			break
		}
		n++
	}
}

// repairChecksums recomputes every CRC it can find in data's framing.
func repairChecksums(data []byte) []byte {
	d := bytes.Clone(data)
	crc := func(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
	if len(d) < 16 {
		return d
	}
	off := 16 + int(binary.LittleEndian.Uint32(d[12:]))
	if off < 16 || off+4 > len(d) {
		return d
	}
	binary.LittleEndian.PutUint32(d[off:], crc(d[:off]))
	off += 4
	for off+24 <= len(d) {
		h := d[off : off+24]
		end := off + 24 + int(binary.LittleEndian.Uint32(h[4:]))
		if end < off || end > len(d) {
			binary.LittleEndian.PutUint32(h[20:], crc(h[:20]))
			break
		}
		binary.LittleEndian.PutUint32(h[16:], crc(d[off+24:end]))
		binary.LittleEndian.PutUint32(h[20:], crc(h[:20]))
		off = end
	}
	return d
}

// fuzzSeeds are the seed corpus: small valid files, compressed and stored (stored payloads let mutations reach
// the event decoder directly), cut short, and damaged.
func fuzzSeeds(t testing.TB) map[string][]byte {
	golden, _ := goldenFile(t)
	stored, _ := encode(t, everyAction, testFooter(21), snapshot.WithChunkEvents(8), snapshot.WithCompressionLevel(0))
	randomStored, _ := encode(t, random(3, 60), nil, snapshot.WithCompressionLevel(0), snapshot.WithChunkEvents(20))
	cfg := snapshottest.Tiny()
	cfg.Iterations = 1
	var tiny bytes.Buffer
	if err := snapshottest.Encode(&tiny, cfg, snapshot.WithChunkEvents(200)); err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(golden)
	flipped[len(flipped)/2] ^= 0x10
	return map[string][]byte{
		"golden":           golden,
		"stored":           stored,
		"random-stored":    randomStored,
		"tiny":             tiny.Bytes(),
		"cut-in-chunk":     golden[:len(golden)*2/3],
		"cut-in-header":    golden[:100],
		"stored-cut":       stored[:len(stored)/2],
		"flipped":          flipped,
		"zero-tail":        append(bytes.Clone(golden[:600]), make([]byte, 64)...),
		"not-a-snapshot":   []byte("PK\x03\x04 a zip file"),
		"future-version":   fileHeader(9, []byte("{}")),
		"huge-chunk-claim": file(validHeader(), chunkHeader(1, 1, 1<<30, 1<<30, 1<<30, nil)),
	}
}

// TestFuzzCorpus keeps testdata/fuzz/FuzzReader in step with the Writer: regenerate it with -update.
func TestFuzzCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzReader")
	update := flag.Lookup("update") != nil && flag.Lookup("update").Value.String() == "true"
	for name, data := range fuzzSeeds(t) {
		path := filepath.Join(dir, name)
		want := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(data)))
		if update {
			if err := os.MkdirAll(dir, 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(want), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (regenerate with -update)", err)
		}
		if string(got) != want {
			t.Errorf("%s is stale; regenerate with -update", path)
		}
	}
}
