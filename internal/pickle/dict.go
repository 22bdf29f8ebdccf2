package pickle

import "iter"

// Item is one key/value pair of a Dict.
type Item struct {
	Key, Value any
}

// Dict is a Python dict: keys in insertion order, Python's key equality (1, 1.0 and True are the same key),
// fast lookup by string key. Snapshot dicts are small and string-keyed, so they are searched linearly; larger
// dicts, and any dict with a non-string key, get a hash index.
type Dict struct {
	items  []Item
	strIdx map[string]int32 // string keys → position; nil while the dict is small and all-string
	anyIdx map[any]int32    // other keys, by hashKey form → position; nil until one is inserted

	keySig uint64 // a bit per string key, by keyBit: a clear bit proves a key absent without a scan

	id uint32
}

// keyBit picks a string key's bit in Dict.keySig from its length and end bytes: the keys of one snapshot dict
// differ there, so a new key almost never needs the scan for a duplicate.
func keyBit(s string) uint64 {
	if s == "" {
		return 1
	}
	return 1 << ((uint(len(s))*7 + uint(s[0])*3 + uint(s[len(s)-1])) & 63)
}

// ID is the dict's Doc.ID: containers are numbered densely from 0 in the order they were created, so a
// consumer interning shared dicts (PyTorch's frames) can index a slice instead of hashing pointers.
func (d *Dict) ID() int { return int(d.id) }

// smallDict is the size up to which a string-keyed dict is searched linearly: a scan of a few interned keys
// beats hashing, and snapshot dicts have at most about a dozen keys.
const smallDict = 16

// Len returns the number of entries.
func (d *Dict) Len() int { return len(d.items) }

// Items returns the entries in insertion order. The slice is the dict's own storage: do not modify it.
func (d *Dict) Items() []Item { return d.items }

// All iterates over the entries in insertion order.
func (d *Dict) All() iter.Seq2[any, any] {
	return func(yield func(any, any) bool) {
		for _, it := range d.items {
			if !yield(it.Key, it.Value) {
				return
			}
		}
	}
}

// Get returns the value stored under a string key.
func (d *Dict) Get(key string) (any, bool) {
	if i := d.findStr(key); i >= 0 {
		return d.items[i].Value, true
	}
	return nil, false
}

// Lookup returns the value stored under any key, compared as Python compares keys. An unhashable key (a list,
// dict, set or bytearray) is never found.
func (d *Dict) Lookup(key any) (any, bool) {
	if s, ok := key.(string); ok {
		return d.Get(s)
	}
	if d.anyIdx == nil {
		return nil, false // no non-string key was ever inserted
	}
	h := keyHasher{budget: hashKeyBudget}
	hk, err := h.hashKey(key)
	if err != nil {
		return nil, false
	}
	if i, ok := d.anyIdx[hk]; ok {
		return d.items[i].Value, true
	}
	return nil, false
}

// GetInt returns the value under key as an integer, through AsInt64.
func (d *Dict) GetInt(key string) (int64, bool) {
	v, ok := d.Get(key)
	if !ok {
		return 0, false
	}
	return AsInt64(v)
}

// GetString returns the value under key if it is a str.
func (d *Dict) GetString(key string) (string, bool) {
	v, _ := d.Get(key)
	s, ok := v.(string)
	return s, ok
}

// GetList returns the value under key if it is a list.
func (d *Dict) GetList(key string) (*List, bool) {
	v, _ := d.Get(key)
	l, ok := v.(*List)
	return l, ok
}

// GetDict returns the value under key if it is a dict.
func (d *Dict) GetDict(key string) (*Dict, bool) {
	v, _ := d.Get(key)
	m, ok := v.(*Dict)
	return m, ok
}

// findStr returns the position of a string key, or -1.
func (d *Dict) findStr(key string) int {
	if d.strIdx != nil {
		if i, ok := d.strIdx[key]; ok {
			return int(i)
		}
		return -1
	}
	if d.keySig&keyBit(key) == 0 {
		return -1
	}
	for i := range d.items {
		if s, ok := d.items[i].Key.(string); ok && s == key {
			return i
		}
	}
	return -1
}

// set inserts or replaces key as Python's d[key] = value does: a replaced entry keeps its position and its
// original key object. It fails for an unhashable key, or when h's budget runs out.
func (d *Dict) set(key, value any, h *keyHasher) error {
	if s, ok := key.(string); ok {
		if len(s) > longKey {
			if err := h.charge(len(s)); err != nil {
				return err
			}
			if d.strIdx == nil {
				d.buildIndex()
			}
		}
		if i := d.findStr(s); i >= 0 {
			d.items[i].Value = value
			return nil
		}
		d.items = append(d.items, Item{key, value})
		d.keySig |= keyBit(s)
		if d.strIdx != nil {
			d.strIdx[s] = int32(len(d.items) - 1)
		} else if len(d.items) > smallDict {
			d.buildIndex()
		}
		return nil
	}
	hk, err := h.hashKey(key)
	if err != nil {
		return err
	}
	if d.strIdx == nil {
		d.buildIndex()
	}
	if d.anyIdx == nil {
		d.anyIdx = make(map[any]int32)
	}
	if i, ok := d.anyIdx[hk]; ok {
		d.items[i].Value = value
		return nil
	}
	d.items = append(d.items, Item{key, value})
	d.anyIdx[hk] = int32(len(d.items) - 1)
	return nil
}

// buildIndex indexes the string keys; it runs once, when the dict outgrows the linear search or first gets a
// non-string key (which are always indexed, so Lookup never rehashes the whole dict).
func (d *Dict) buildIndex() {
	d.strIdx = make(map[string]int32, len(d.items)+1)
	for i, it := range d.items {
		if s, ok := it.Key.(string); ok {
			d.strIdx[s] = int32(i)
		}
	}
}
