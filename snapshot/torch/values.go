package torch

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"slices"

	"github.com/oomdbg/oomdbg/internal/pickle"
)

// The importer reads one form of decoded snapshot, a pickle.Doc: a pickle decodes into one directly, and a
// JSON snapshot is converted into one (jsonDoc). Values are read through the Doc, which holds them compactly:
// no Go object per dict, list or int.

// pyType names a value's Python type, for error messages.
func pyType(v pickle.Value) string {
	if v.IsNone() {
		return "None"
	}
	return v.TypeName()
}

// list returns the elements of a list or a tuple.
func (im *importer) list(v pickle.Value) ([]pickle.Value, bool) {
	switch v.Kind() {
	case pickle.KindList, pickle.KindTuple:
		return im.doc.Elems(v), true
	}
	return nil, false
}

// isDict reports whether v is a dict.
func isDict(v pickle.Value) bool { return v.Kind() == pickle.KindDict }

// get returns the value of dict d under a str key.
func (im *importer) get(d pickle.Value, key string) (pickle.Value, bool) { return im.doc.Get(d, key) }

func (im *importer) has(d pickle.Value, key string) bool {
	_, ok := im.doc.Get(d, key)
	return ok
}

// pickKeys picks the keys the importer reads from each kind of dict, in the order of segmentKeys, blockKeys,
// entryKeys and frameKeys (pickle.Picker).
type pickKeys struct {
	segment, block, entry, frame *pickle.Picker
}

// resolveKeys looks the key names up in doc once per import.
func resolveKeys(doc *pickle.Doc) pickKeys {
	var keys [len(segmentKeys) + len(blockKeys) + len(entryKeys) + len(frameKeys)]pickle.Value
	used := keys[:0]
	picker := func(names []string) *pickle.Picker {
		from := len(used)
		for _, n := range names {
			used = append(used, doc.Key(n))
		}
		return doc.Picker(used[from:len(used):len(used)]...)
	}
	return pickKeys{segment: picker(segmentKeys[:]), block: picker(blockKeys[:]), entry: picker(entryKeys[:]), frame: picker(frameKeys[:])}
}

// asInt returns an integer. Like pickle.AsInt64, it maps PyTorch's unsigned 2^64-1 (a size_t "unlimited" or a
// -1 read as unsigned) back to -1. A bool is not an integer here.
func (im *importer) asInt(v pickle.Value) (int64, bool) { return im.doc.Int(v) }

// asFloat returns a float, or an integer as Python would accept it.
func (im *importer) asFloat(v pickle.Value) (float64, bool) {
	if f, ok := im.doc.Float(v); ok {
		return f, true
	}
	if i, ok := im.doc.Int(v); ok {
		return float64(i), true
	}
	return 0, false
}

// maxJSONDepth bounds the nesting of a JSON snapshot, as pickle.Limits.MaxDepth bounds a pickle's.
const maxJSONDepth = 1000

// jsonDoc converts a value decoded by encoding/json (with UseNumber) into a Doc of at most maxMemory bytes
// (0: no ceiling).
func jsonDoc(v any, maxMemory int64) (*pickle.Doc, error) {
	b := pickle.Limits{MaxMemory: maxMemory}.NewBuilder()
	root, err := jsonValue(b, v, 0)
	if err != nil {
		return nil, err
	}
	return b.Doc(root), nil
}

func jsonValue(b *pickle.Builder, v any, depth int) (pickle.Value, error) {
	if depth > maxJSONDepth {
		return 0, fmt.Errorf("%w: JSON nested more than %d deep", ErrLimit, maxJSONDepth)
	}
	switch x := v.(type) {
	case nil:
		return b.None(), nil
	case bool:
		return b.Bool(x), nil
	case string:
		return b.Str(x)
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return b.Int(n)
		}
		if n, ok := new(big.Int).SetString(string(x), 10); ok {
			return b.BigInt(n)
		}
		f, err := x.Float64()
		if err != nil {
			return 0, fmt.Errorf("%w: JSON number %s: %w", ErrMalformed, truncate(string(x), 64), err)
		}
		return b.Float(f)
	case []any:
		elems := make([]pickle.Value, len(x))
		for i, e := range x {
			var err error
			if elems[i], err = jsonValue(b, e, depth+1); err != nil {
				return 0, err
			}
		}
		return b.List(elems)
	case map[string]any:
		pairs := make([]pickle.Value, 0, 2*len(x))
		for _, k := range slices.Sorted(maps.Keys(x)) { // a pure function of the input, whatever map order
			kv, err := b.Str(k)
			if err != nil {
				return 0, err
			}
			ev, err := jsonValue(b, x[k], depth+1)
			if err != nil {
				return 0, err
			}
			pairs = append(pairs, kv, ev)
		}
		return b.Dict(pairs)
	}
	return 0, fmt.Errorf("%w: JSON value of type %T", ErrMalformed, v)
}
