package snapshottest

import (
	"encoding/binary"
	"hash/crc32"
)

// Hand-built files, from the byte layout of docs/format.md, for hostile and corrupt input: the pieces are
// well framed (good checksums) whatever they declare.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// FileHeader returns a file header with the given format version and metadata bytes.
func FileHeader(version uint16, meta []byte) []byte {
	b := []byte("\x89OOMDBG\n")
	b = binary.LittleEndian.AppendUint16(b, version)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(meta)))
	b = append(b, meta...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// ChunkHeader returns a chunk header with correct checksums for payload, but any declared lengths.
func ChunkHeader(kind, codec byte, stored, raw, events uint32, payload []byte) []byte {
	h := []byte{kind, codec, 0, 0}
	h = binary.LittleEndian.AppendUint32(h, stored)
	h = binary.LittleEndian.AppendUint32(h, raw)
	h = binary.LittleEndian.AppendUint32(h, events)
	h = binary.LittleEndian.AppendUint32(h, crc32.Checksum(payload, castagnoli))
	return binary.LittleEndian.AppendUint32(h, crc32.Checksum(h, castagnoli))
}

// StoredChunk returns a complete uncompressed chunk.
func StoredChunk(kind byte, events uint32, payload []byte) []byte {
	return append(ChunkHeader(kind, 0, uint32(len(payload)), uint32(len(payload)), events, payload), payload...)
}

// EndChunk is an end chunk without a footer.
func EndChunk() []byte { return StoredChunk(2, 0, nil) }

// EventsPayload assembles an events chunk's payload: a table section, then the three streams.
func EventsPayload(tables, ops, fields, times []byte) []byte {
	p := append([]byte(nil), tables...)
	p = binary.AppendUvarint(p, uint64(len(ops)))
	p = append(p, ops...)
	p = binary.AppendUvarint(p, uint64(len(fields)))
	p = append(p, fields...)
	return append(p, times...)
}

// WithMeta returns the snapshot file data with its metadata replaced by meta: the header is rebuilt, the
// chunks kept as they are (they do not depend on it). data must have a whole header.
func WithMeta(data, meta []byte) []byte {
	n := binary.LittleEndian.Uint32(data[12:])
	return append(FileHeader(binary.LittleEndian.Uint16(data[8:]), meta), data[16+int(n)+4:]...)
}
