package snapshottest

import (
	"encoding/binary"
	"fmt"
	"math"
)

// PyTorch snapshots made in Go, for tests and benchmarks of the importer and the replay that need a shape no
// real file has (a final state of hundreds of thousands of segments) without committing megabytes of it.

// Dict is a Python dict whose keys keep their order.
type Dict []KV

// KV is one entry of a Dict.
type KV struct {
	Key   string
	Value any
}

// Pickle encodes v as a protocol-2 pickle of plain data, as CPython's pickle.dumps would load it: Dict,
// []any, []Dict, string, int, int64, uint64, float64, bool and nil. Other types panic: this is test input.
func Pickle(v any) []byte {
	p := pickler{memo: map[string]uint32{}}
	b := []byte("\x80\x02")
	b = p.append(b, v)
	return append(b, '.')
}

// pickler remembers the strings it wrote, as CPython's pickler does: a string met again is a memo reference.
type pickler struct {
	memo map[string]uint32
}

func (p *pickler) append(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, 'N')
	case bool:
		if x {
			return append(b, 0x88)
		}
		return append(b, 0x89)
	case int:
		return appendPickleInt(b, int64(x))
	case int64:
		return appendPickleInt(b, x)
	case uint64:
		if x <= math.MaxInt64 {
			return appendPickleInt(b, int64(x))
		}
		le := binary.LittleEndian.AppendUint64(nil, x)
		b = append(b, 0x8a, 9) // LONG1: nine bytes, the top one zero keeps it positive
		return append(append(b, le...), 0)
	case float64:
		b = append(b, 'G')
		return binary.BigEndian.AppendUint64(b, math.Float64bits(x))
	case string:
		if i, ok := p.memo[x]; ok {
			b = append(b, 'j') // LONG_BINGET
			return binary.LittleEndian.AppendUint32(b, i)
		}
		b = append(b, 'X')
		b = binary.LittleEndian.AppendUint32(b, uint32(len(x)))
		b = append(b, x...)
		i := uint32(len(p.memo))
		p.memo[x] = i
		b = append(b, 'r') // LONG_BINPUT
		return binary.LittleEndian.AppendUint32(b, i)
	case []any:
		b = append(b, ']', '(')
		for _, e := range x {
			b = p.append(b, e)
		}
		return append(b, 'e')
	case []Dict:
		b = append(b, ']', '(')
		for _, e := range x {
			b = p.append(b, e)
		}
		return append(b, 'e')
	case Dict:
		b = append(b, '}', '(')
		for _, kv := range x {
			b = p.append(b, kv.Key)
			b = p.append(b, kv.Value)
		}
		return append(b, 'u')
	}
	panic("snapshottest.Pickle: a value of an unsupported type")
}

// appendPickleInt appends i as BININT (32 bits) or LONG1 (8 bytes, two's complement).
func appendPickleInt(b []byte, i int64) []byte {
	if i >= math.MinInt32 && i <= math.MaxInt32 {
		b = append(b, 'J')
		return binary.LittleEndian.AppendUint32(b, uint32(int32(i)))
	}
	b = append(b, 0x8a, 8)
	return binary.LittleEndian.AppendUint64(b, uint64(i))
}

// ManySegments is a PyTorch snapshot (_dump_snapshot's dict, protocol 2) whose final state holds n small-pool
// segments of 2 MiB on device 0, and whose trace, a ring buffer that begins after every segment was made,
// frees a 512-byte block at the start of every other segment: the final state shows those segments free and
// the others with their 512-byte block still in use. The importer finds every segment alive before the
// trace, and the replay rebuilds them all before it replays the frees: the shape of a long-running job's
// snapshot with a short history.
func ManySegments(n int) []byte {
	const (
		base   = uint64(0x7f00_0000_0000)
		segLen = 2 << 20
		block  = 512
	)
	segs := make([]Dict, n)
	var trace []Dict
	for i := range n {
		addr := base + uint64(i)*segLen
		blocks := []Dict{{{"address", addr}, {"size", segLen}, {"requested_size", block}, {"state", "inactive"}}}
		used := 0
		if i%2 == 0 {
			used = block
			blocks = []Dict{
				{{"address", addr}, {"size", block}, {"requested_size", block}, {"state", "active_allocated"}},
				{{"address", addr + block}, {"size", segLen - block}, {"requested_size", 0}, {"state", "inactive"}},
			}
		} else {
			for _, act := range []string{"free_requested", "free_completed"} {
				trace = append(trace, Dict{{"action", act}, {"addr", addr}, {"size", block}, {"stream", 0}})
			}
		}
		segs[i] = Dict{
			{"device", 0}, {"address", addr}, {"total_size", segLen}, {"allocated_size", used},
			{"active_size", used}, {"requested_size", used}, {"stream", 0}, {"segment_type", "small"},
			{"blocks", blocks},
		}
	}
	return Pickle(Dict{{"segments", segs}, {"device_traces", []any{trace}}})
}

// RepeatedEntry is a PyTorch snapshot pickle whose trace is one alloc entry, with a stack of the given depth,
// and then n references to it through the pickle's memo: 5 bytes an entry in the file, and as many entries as
// any trace to the importer, each with its whole stack to an exporter that writes JSON. It is the pickle that
// makes an import's memory, or a JSON export, grow fastest per byte of input.
func RepeatedEntry(n, depth int) []byte {
	b := []byte("\x80\x02}(")                            // the top-level dict, MARK
	b = append(b, "X\x08\x00\x00\x00segments]"...)       // "segments": []
	b = append(b, "X\x0d\x00\x00\x00device_traces]]"...) // "device_traces": [[ (device 0's trace)
	frames := make([]Dict, depth)
	for i := range frames {
		frames[i] = Dict{{"filename", fmt.Sprintf("/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module_%d.py", i)},
			{"line", 1000 + i}, {"name", fmt.Sprintf("_call_impl_of_a_module_with_a_long_name_%d", i)}}
	}
	entry := Pickle(Dict{{"action", "alloc"}, {"addr", uint64(1 << 30)}, {"size", 512}, {"stream", 0}, {"frames", frames}})
	b = append(b, entry[2:len(entry)-1]...) // the entry dict, without PROTO and STOP (its strings take memo 0 on)
	b = append(b, 'r')                      // LONG_BINPUT above the strings' memo
	b = binary.LittleEndian.AppendUint32(b, 1<<20)
	b = append(b, 'a') // append it to the trace
	for n > 0 {
		k := min(n, 1000)
		b = append(b, '(')
		for range k {
			b = append(b, 'j') // LONG_BINGET
			b = binary.LittleEndian.AppendUint32(b, 1<<20)
		}
		b = append(b, 'e') // APPENDS
		n -= k
	}
	return append(b, 'a', 'u', '.') // the trace into device_traces; both pairs into the dict; STOP
}
