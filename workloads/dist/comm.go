package dist

import (
	"fmt"
	"strings"

	"github.com/oomdbg/oomdbg/internal/units"
)

// Collective is one kind of transfer a rank takes part in: a collective over a group of ranks, or a copy
// between the GPU and host memory.
type Collective uint8

// The transfers.
const (
	AllReduce Collective = iota
	ReduceScatter
	AllGather
	Broadcast
	HostToDevice
	DeviceToHost
	numCollectives
)

var collectiveNames = [...]string{"all-reduce", "reduce-scatter", "all-gather", "broadcast", "host to device", "device to host"}

func (c Collective) String() string {
	if int(c) < len(collectiveNames) {
		return collectiveNames[c]
	}
	return fmt.Sprintf("collective(%d)", uint8(c))
}

// NumCollectives is one past the last Collective.
const NumCollectives = int(numCollectives)

// Traffic is what one rank moves, summed over some span (an optimizer step, a run).
type Traffic struct {
	// Payload is the bytes of the tensors handed to each kind of transfer: an all-reduce's buffer, a
	// reduce-scatter's input, an all-gather's output, a copy's bytes.
	Payload [NumCollectives]int64
	// Calls counts the transfers of each kind.
	Calls [NumCollectives]int
	// Sent is the bytes this rank puts on the network, as NCCL's ring algorithms move them: 2(n-1)/n of an
	// all-reduce's buffer, (n-1)/n of a reduce-scatter's input and of an all-gather's output, (n-1)/n of a
	// broadcast's, over a group of n ranks. Host copies are not on the network.
	Sent int64
}

// Add adds u to t.
func (t *Traffic) Add(u Traffic) {
	for i := range t.Payload {
		t.Payload[i] += u.Payload[i]
		t.Calls[i] += u.Calls[i]
	}
	t.Sent += u.Sent
}

// Wire returns the bytes a rank sends for one transfer of kind c of payload bytes over a group of n ranks.
func Wire(c Collective, payload int64, n int) int64 {
	if n <= 1 {
		return 0
	}
	switch c {
	case AllReduce:
		return 2 * payload * int64(n-1) / int64(n)
	case ReduceScatter, AllGather, Broadcast:
		return payload * int64(n-1) / int64(n)
	}
	return 0
}

// String says what t holds in a line: each kind's bytes, then what went on the wire.
func (t Traffic) String() string {
	var parts []string
	for c := range numCollectives {
		if t.Calls[c] > 0 {
			parts = append(parts, fmt.Sprintf("%s %s (%d)", c, units.FormatSize(t.Payload[c]), t.Calls[c]))
		}
	}
	if len(parts) == 0 {
		return "nothing moved"
	}
	return strings.Join(parts, ", ") + fmt.Sprintf("; %s sent per rank", units.FormatSize(t.Sent))
}

// comm counts a rank's transfers and tells the recording about each.
type comm struct {
	step, total Traffic
	annotate    func(string)
}

// record counts one transfer of payload bytes over a group of n ranks (n is ignored for host copies) and
// annotates it with what it was for.
func (c *comm) record(kind Collective, payload int64, n int, what string) {
	if payload <= 0 {
		return
	}
	wire := Wire(kind, payload, n)
	for _, t := range []*Traffic{&c.step, &c.total} {
		t.Payload[kind] += payload
		t.Calls[kind]++
		t.Sent += wire
	}
	if c.annotate == nil {
		return
	}
	if kind == HostToDevice || kind == DeviceToHost {
		c.annotate(fmt.Sprintf("comm: %s %s: %s", kind, units.FormatSize(payload), what))
		return
	}
	c.annotate(fmt.Sprintf("comm: %s %s over %d ranks, %s sent: %s", kind, units.FormatSize(payload), n, units.FormatSize(wire), what))
}

// endStep annotates the step's totals and starts the next step's.
func (c *comm) endStep(step int) Traffic {
	t := c.step
	c.step = Traffic{}
	if c.annotate != nil {
		c.annotate(fmt.Sprintf("comm step %d: %s", step, t))
	}
	return t
}
