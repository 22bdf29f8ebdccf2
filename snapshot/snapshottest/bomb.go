package snapshottest

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"

	"github.com/klauspost/compress/zstd"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Bomb returns a hostile snapshot file: chunks events chunks of perChunk annotation events each, every event
// as cheap as the format allows (an op byte and a zero time delta, all else predicted), compressed in one zstd
// stream. zstd packs a million such events into about 300 bytes: Bomb(64, 1<<20) is a 17 KB file that
// declares 67 million events, Bomb(10, 1<<20) 2.8 KB with 10 million. Chunks are framed by docs/format.md
// with good checksums, and the file ends without an end chunk, as a recording cut short does.
func Bomb(chunks, perChunk int) []byte {
	var out bytes.Buffer
	w, err := snapshot.NewWriter(&out, snapshot.Meta{Tool: "oomdbg", Source: "oomdbg", TimeUnit: "ns"})
	if err != nil || w == nil {
		panic(err) // the metadata is constant
	}
	var z bytes.Buffer
	enc, err := zstd.NewWriter(&z, zstd.WithEncoderConcurrency(1), zstd.WithEncoderCRC(false), zstd.WithWindowSize(1<<20))
	if err != nil {
		panic(err)
	}
	raw := []byte{0, 0, 0} // no strings, frames or stacks
	raw = binary.AppendUvarint(raw, uint64(perChunk))
	raw = append(raw, bytes.Repeat([]byte{byte(snapshot.ActionAnnotation)}, perChunk)...)
	raw = binary.AppendUvarint(raw, 0)           // no fields
	raw = append(raw, make([]byte, perChunk)...) // every time delta 0
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	for range chunks {
		z.Reset()
		if _, err := enc.Write(raw); err != nil {
			panic(err)
		}
		if err := enc.Flush(); err != nil {
			panic(err)
		}
		h := []byte{1, 1, 0, 0} // events, zstd
		h = binary.LittleEndian.AppendUint32(h, uint32(z.Len()))
		h = binary.LittleEndian.AppendUint32(h, uint32(len(raw)))
		h = binary.LittleEndian.AppendUint32(h, uint32(perChunk))
		h = binary.LittleEndian.AppendUint32(h, crc32.Checksum(z.Bytes(), castagnoli))
		h = binary.LittleEndian.AppendUint32(h, crc32.Checksum(h, castagnoli))
		out.Write(h)
		out.Write(z.Bytes())
	}
	return out.Bytes()
}
