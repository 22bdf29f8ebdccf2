// Package pickle decodes the data subset of Python pickles (protocols 2 to 5, and the integer, float and memo
// opcodes of protocols 0 and 1), as pickle.dump writes PyTorch CUDA memory snapshots.
//
// It is strict and built for untrusted files. Opcodes that would import or call Python code (GLOBAL,
// STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID, BINPERSID, EXT1/2/4) and out-of-band
// buffers (NEXT_BUFFER, READONLY_BUFFER) are refused with an error naming the opcode and its offset. Every
// declared length is checked against the remaining input and against Limits before anything is allocated, and
// every error is a *DecodeError carrying the byte offset and opcode name. A decoded value is never cyclic and
// never nests deeper than Limits.MaxDepth, so a recursive walk over it is safe.
//
// # Docs and values
//
// DecodeDoc decodes into a Doc, the form for large input: every value is a 64-bit Value, and strings and
// container contents live in a few flat slices without pointers, so a snapshot of millions of dicts, lists and
// ints costs a few dozen allocations and nothing for the garbage collector to scan. Dicts with the same short
// str keys in the same order (a snapshot's million trace entries) share one list of the keys and hold only
// their values. A Doc is read through its
// methods (Int, Str, Elems, Pairs, Get, and Key with Pick to look up several keys of many dicts at once).
// Short strs are interned, so equal keys are equal Values. A Builder makes a Doc from values that were never
// pickled (a JSON snapshot), so that a reader handles one form.
//
// Decode returns Go values instead (Doc.Any makes them), for code that prefers a tree:
//
//	None                 nil
//	bool                 bool
//	int                  int64, or *big.Int when it does not fit (AsInt64 maps PyTorch's 2^64-1 back to -1)
//	float                float64
//	str                  string (the UTF-8 bytes as written; lone surrogates stay as "surrogatepass" wrote them)
//	bytes                []byte
//	bytearray            ByteArray
//	list                 *List (elements through Len, At, All; DictAt and Dicts for the usual list of dicts)
//	dict                 *Dict (insertion order kept; Get by string key, Lookup by any key)
//	tuple                Tuple ([]any)
//	set, frozenset       *Set (Frozen tells which)
//
// The memo is honoured: every BINGET of one memo slot yields the same value, so a list or dict shared in
// Python (PyTorch shares each distinct traceback and frame) is the same container in a Doc and the same *List
// or *Dict in a tree. A consumer can intern by the dense numbers Doc.ID (List.ID and Dict.ID), which index a
// slice.
//
// Containers are complete before they are shared: a pickle that adds to a list, dict or set after placing it
// inside another container (which only a self-referencing structure needs) is refused, and that is what keeps
// results acyclic.
//
// Decode and DecodeDoc read from a byte slice, the fast path when the file is in memory. DecodeReader and
// DecodeDocReader read an io.Reader (a file, a pipe, standard input) through a buffer of 4 to 128 KiB,
// never the whole input at once: they stop at STOP, leaving what follows unread, or at the first bad opcode.
// Both give the same result and the same errors for the same bytes. Bytes after the STOP opcode are ignored,
// as Python's pickle.loads ignores them.
//
// # Memory
//
// Limits.MaxMemory sets a ceiling on what a decode holds at once, checked before each allocation: past it the
// decode fails with ErrMemory instead of allocating. Doc.Footprint tells what a decoded Doc holds.
package pickle
