package tensor

import (
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
)

// TestRecordStreamDefersReuseUntilTheHostWaits follows one all-gather buffer through the runtime: made on a
// side stream, read on the default stream (record_stream), released; the side stream cannot have its memory
// back until the host waits for the default stream (here, a loss's .item()).
func TestRecordStreamDefersReuseUntilTheHostWaits(t *testing.T) {
	dev := device.NewSimulated(device.Meta, 0, 1<<30, 0, allocator.DefaultConfig())
	rt := NewRuntime(dev, nil, 7)
	side := dev.Streams().NewStream("unshard")
	shape := []int{10 << 20} // 40 MiB of float32: a segment of its own
	var buf *Tensor
	rt.OnStream(side, func() { buf = rt.Empty(F32, shape, "gathered") })
	if s := dev.Allocator().Segments(); len(s) != 1 || s[0].Stream != side {
		t.Fatalf("segments %+v: want one on the side stream %d", s, side)
	}
	addr := buf.st.addr
	dev.Streams().WaitStream(device.DefaultStream, side)
	loss := rt.Zeros(F32, []int{1}, "loss", snapshot.CategoryTemporary) // the default stream computes with it
	buf.RecordStream(device.DefaultStream)
	buf.Release()
	var again *Tensor
	rt.OnStream(side, func() { again = rt.Empty(F32, shape, "gathered") })
	if again.st.addr == addr {
		t.Fatal("the side stream got the buffer back while the default stream may still read it")
	}
	again.Release()
	loss.Item()
	rt.OnStream(side, func() { again = rt.Empty(F32, shape, "gathered") })
	if n := dev.Allocator().PendingFrees(); n != 0 {
		t.Fatalf("%d frees still pending after the host waited", n)
	}
	if r := dev.Allocator().Stats().ReservedBytes.All().Current; r != 2*40<<20+2<<20 {
		t.Fatalf("reserved %d: want the two 40 MiB buffers and the loss's 2 MiB segment, no third buffer", r)
	}
	again.Release()
	loss.Release()
}
