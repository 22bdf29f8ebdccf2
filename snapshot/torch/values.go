package torch

import (
	"encoding/json"
	"math"
	"math/big"

	"github.com/oomdbg/oomdbg/internal/pickle"
)

// The importer reads two families of decoded values: the pickle decoder's (*pickle.List, *pickle.Dict,
// pickle.Tuple, int64, *big.Int, ...) and encoding/json's with UseNumber ([]any, map[string]any,
// json.Number, ...). listView and dictView hold one or the other, so that one walk serves both without an
// interface call per access.

// listView is a list (or a tuple) of either family.
type listView struct {
	p *pickle.List
	j []any
}

func (l listView) len() int {
	if l.p != nil {
		return l.p.Len()
	}
	return len(l.j)
}

func (l listView) at(i int) any {
	if l.p != nil {
		return l.p.At(i)
	}
	return l.j[i]
}

// dictAt returns element i as a dict, without boxing it when the pickle list holds only dicts.
func (l listView) dictAt(i int) (dictView, bool) {
	if l.p != nil {
		d, ok := l.p.DictAt(i)
		return dictView{p: d}, ok
	}
	m, ok := l.j[i].(map[string]any)
	return dictView{j: m}, ok
}

// id is the pickle list's identity (shared through the memo), or -1 for JSON, which has no sharing.
func (l listView) id() int {
	if l.p != nil {
		return l.p.ID()
	}
	return -1
}

// dictView is a dict of either family.
type dictView struct {
	p *pickle.Dict
	j map[string]any
}

func (d dictView) get(key string) (any, bool) {
	if d.p != nil {
		return d.p.Get(key)
	}
	v, ok := d.j[key]
	return v, ok
}

func (d dictView) has(key string) bool {
	_, ok := d.get(key)
	return ok
}

// id is the pickle dict's identity, or -1 for JSON.
func (d dictView) id() int {
	if d.p != nil {
		return d.p.ID()
	}
	return -1
}

// pick looks up several keys in one pass over the dict: vals[i] gets the value under keys[i], and bit i of
// the result says whether it was there. Snapshot dicts have a handful of keys, so one scan comparing each
// against the few wanted beats one lookup per key.
func (d dictView) pick(keys []string, vals []any) uint32 {
	var found uint32
	if d.p != nil {
		for _, it := range d.p.Items() {
			k, ok := it.Key.(string)
			if !ok {
				continue
			}
			for i, want := range keys {
				if k == want {
					vals[i] = it.Value
					found |= 1 << i
					break
				}
			}
		}
		return found
	}
	for i, k := range keys {
		if v, ok := d.j[k]; ok {
			vals[i] = v
			found |= 1 << i
		}
	}
	return found
}

func asList(v any) (listView, bool) {
	switch x := v.(type) {
	case *pickle.List:
		return listView{p: x}, true
	case []any:
		return listView{j: x}, true
	case pickle.Tuple:
		return listView{j: []any(x)}, true
	}
	return listView{}, false
}

func asDict(v any) (dictView, bool) {
	switch x := v.(type) {
	case *pickle.Dict:
		return dictView{p: x}, true
	case map[string]any:
		return dictView{j: x}, true
	}
	return dictView{}, false
}

// asInt returns an integer of either family. Like pickle.AsInt64, it maps PyTorch's unsigned 2^64-1 (a size_t
// "unlimited" or a -1 read as unsigned) back to -1. A bool is not an integer here.
func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n, true
		}
		if b, ok := new(big.Int).SetString(string(x), 10); ok {
			return pickle.AsInt64(b)
		}
		return 0, false
	default:
		return pickle.AsInt64(v)
	}
}

// asFloat returns a float (or an integer, as Python would accept it) of either family.
func asFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int64:
		return float64(x), true
	case json.Number:
		f, err := x.Float64()
		return f, err == nil && !math.IsInf(f, 0)
	}
	return 0, false
}

// pyType names a decoded value's Python type, for error messages.
func pyType(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case json.Number:
		if _, err := x.Int64(); err == nil {
			return "int"
		}
		if _, ok := new(big.Int).SetString(string(x), 10); ok {
			return "int"
		}
		return "float"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case pickle.ByteArray:
		return "bytearray"
	case *pickle.List, []any:
		return "list"
	case *pickle.Dict, map[string]any:
		return "dict"
	case pickle.Tuple:
		return "tuple"
	case *pickle.Set:
		if x.Frozen {
			return "frozenset"
		}
		return "set"
	}
	return "object"
}
