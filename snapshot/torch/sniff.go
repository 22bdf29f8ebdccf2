package torch

// Sniff reports whether prefix, the first bytes of a file (16 are plenty), looks like a PyTorch memory
// snapshot this package imports: a pickle of protocol 2 to 5 (the PROTO opcode 0x80 and its version byte), or
// JSON whose first character, after an optional UTF-8 byte-order mark and whitespace, opens an object or a
// list. It looks at content only, never at a file name: snapshots are saved as .pickle, .pkl, .pt or anything.
func Sniff(prefix []byte) bool {
	if len(prefix) >= 2 && prefix[0] == 0x80 {
		return prefix[1] >= 2 && prefix[1] <= 5
	}
	return jsonStart(prefix) >= 0
}

// jsonStart returns the offset of the first character of a JSON object or list in data, or -1 when data
// starts with anything else.
func jsonStart(data []byte) int {
	i := 0
	if len(data) >= 3 && data[0] == 0xEF && data[1] == 0xBB && data[2] == 0xBF {
		i = 3
	}
	for ; i < len(data); i++ {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
		case '{', '[':
			return i
		default:
			return -1
		}
	}
	return -1
}
