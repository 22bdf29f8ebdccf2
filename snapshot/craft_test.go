package snapshot_test

import (
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"runtime"

	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

// Hand-built files, from the byte layout of docs/format.md, for hostile and corrupt input: snapshottest's
// crafting under short names.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func fileHeader(version uint16, meta []byte) []byte { return snapshottest.FileHeader(version, meta) }

// validHeader is a version-1 header with test metadata.
func validHeader() []byte {
	meta, _ := json.Marshal(testMeta())
	return fileHeader(1, meta)
}

func chunkHeader(kind, codec byte, stored, raw, events uint32, payload []byte) []byte {
	return snapshottest.ChunkHeader(kind, codec, stored, raw, events, payload)
}

func storedChunk(kind byte, events uint32, payload []byte) []byte {
	return snapshottest.StoredChunk(kind, events, payload)
}

func endChunk() []byte { return snapshottest.EndChunk() }

// uv appends uvarints.
func uv(b []byte, vs ...uint64) []byte {
	for _, v := range vs {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

func zz(v int64) uint64 { return uint64(v<<1) ^ uint64(v>>63) }

func eventsPayload(tables, ops, fields, times []byte) []byte {
	return snapshottest.EventsPayload(tables, ops, fields, times)
}

// noTables is an empty table section.
var noTables = []byte{0, 0, 0}

// file joins a header and chunks.
func file(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
