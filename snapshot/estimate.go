package snapshot

import (
	"encoding/binary"
	"hash/crc32"
	"io"
)

// EstimateEvents says how many events the snapshot in r (of size bytes) holds, from its chunk headers alone:
// it reads the headers of up to the first 4,096 chunks, skipping their payloads, and extrapolates the events
// per byte to the rest of the file. exact is true when it read every chunk header. A program decides with
// it, before reading a large file, how to hold it. It reads nothing it does not check: a header whose
// checksum fails ends the count.
func EstimateEvents(r io.ReaderAt, size int64) (events int64, exact bool) {
	var h [fileHeaderSize]byte
	if _, err := r.ReadAt(h[:], 0); err != nil || string(h[:len(Magic)]) != Magic {
		return 0, false
	}
	off := int64(fileHeaderSize) + int64(binary.LittleEndian.Uint32(h[12:])) + 4
	start := off
	var c [chunkHeaderSize]byte
	for range 4096 {
		if _, err := r.ReadAt(c[:], off); err != nil {
			return events, true // the end, or all that can be read
		}
		if crc32.Checksum(c[:20], crcTable) != binary.LittleEndian.Uint32(c[20:]) {
			return events, true // damage ends a read there too
		}
		events += int64(binary.LittleEndian.Uint32(c[12:]))
		off += chunkHeaderSize + int64(binary.LittleEndian.Uint32(c[4:]))
		if c[0] == kindEnd {
			return events, true
		}
	}
	if off <= start || off >= size {
		return events, off >= size
	}
	return events * (size - start) / (off - start), false
}
