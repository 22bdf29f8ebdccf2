package snapshot_test

import (
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"runtime"
)

// Hand-built files, from the byte layout of docs/format.md, for hostile and corrupt input.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fileHeader returns a file header with the given version and metadata.
func fileHeader(version uint16, meta []byte) []byte {
	b := []byte("\x89OOMDBG\n")
	b = binary.LittleEndian.AppendUint16(b, version)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(meta)))
	b = append(b, meta...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// validHeader is a version-1 header with test metadata.
func validHeader() []byte {
	meta, _ := json.Marshal(testMeta())
	return fileHeader(1, meta)
}

// chunkHeader returns a chunk header with correct checksums for payload, but any declared lengths.
func chunkHeader(kind, codec byte, stored, raw, events uint32, payload []byte) []byte {
	h := []byte{kind, codec, 0, 0}
	h = binary.LittleEndian.AppendUint32(h, stored)
	h = binary.LittleEndian.AppendUint32(h, raw)
	h = binary.LittleEndian.AppendUint32(h, events)
	h = binary.LittleEndian.AppendUint32(h, crc32.Checksum(payload, castagnoli))
	return binary.LittleEndian.AppendUint32(h, crc32.Checksum(h, castagnoli))
}

// storedChunk returns a complete uncompressed chunk.
func storedChunk(kind byte, events uint32, payload []byte) []byte {
	return append(chunkHeader(kind, 0, uint32(len(payload)), uint32(len(payload)), events, payload), payload...)
}

// endChunk is an end chunk without a footer.
func endChunk() []byte { return storedChunk(2, 0, nil) }

// uv appends uvarints.
func uv(b []byte, vs ...uint64) []byte {
	for _, v := range vs {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

func zz(v int64) uint64 { return uint64(v<<1) ^ uint64(v>>63) }

// eventsPayload assembles an events chunk payload: a table section, then the three streams.
func eventsPayload(tables, ops, fields, times []byte) []byte {
	p := append([]byte(nil), tables...)
	p = uv(p, uint64(len(ops)))
	p = append(p, ops...)
	p = uv(p, uint64(len(fields)))
	p = append(p, fields...)
	return append(p, times...)
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
