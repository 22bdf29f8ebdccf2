package optim

import (
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// labelLog is a Tracer that keeps the label of every allocation, in order.
type labelLog struct{ labels []string }

func (l *labelLog) SetPhase(snapshot.Phase) {}
func (l *labelLog) TagNextAlloc(_ snapshot.Category, label string) {
	l.labels = append(l.labels, label)
}
func (l *labelLog) SetCategory(int, uint64, snapshot.Category, string) {}
func (l *labelLog) PushScope(string)                                   {}
func (l *labelLog) PopScope()                                          {}

// stepProbe is an optimizer that records the bytes allocated when its step runs.
type stepProbe struct {
	rt    *tensor.Runtime
	bytes []int64
}

func (p *stepProbe) Step()         { p.bytes = append(p.bytes, allocatedNow(p.rt)) }
func (p *stepProbe) ZeroGrad(bool) {}
func (p *stepProbe) Release()      {}

// TestGradScalerOrderOfEvents follows torch/amp/grad_scaler.py. unscale_ makes inv_scale as
// self._scale.double().reciprocal().float() (two float64 temporaries, each freed once the next is made) and
// found_inf = torch.full((), 0.0); _unscale_grads_ passes per-device copies (_MultiDeviceReplicator.get:
// .to(copy=True)) of found_inf, then inv_scale, to the unscale kernel, and returns the found_inf copy, which
// the optimizer's state holds through optimizer.step() until update() refreshes _per_optimizer_states. So
// during the step one 512-byte block (the found_inf copy) is alive beyond what was before, and none after
// update. At the kernel inv_scale, found_inf and their copies are alive: four blocks at the peak.
func TestGradScalerOrderOfEvents(t *testing.T) {
	log := &labelLog{}
	rt := tensor.NewRuntime(device.NewSimulated(device.Meta, 0, 1<<30, 0, allocator.DefaultConfig()), log, 1)
	ps := params(rt, [][]float32{{1, 2}}, [][]float32{{3, 4}})
	s := NewGradScaler(rt)
	loss := rt.Zeros(tensor.F32, nil, "loss", snapshot.CategoryTemporary)
	scaled := s.Scale(loss)
	base := allocatedNow(rt)
	log.labels = nil
	opt := &stepProbe{rt: rt}
	rt.Device().Allocator().ResetPeakStats()
	s.Step(opt, ps)
	if got, want := rt.Device().Allocator().Stats().AllocatedBytes.All().Peak, base+4*512; got != want {
		t.Errorf("peak during step %d, want %d", got, want)
	}
	want := []string{"f64[] to.f64", "f64[] reciprocal.out", "f32[] to.f32", "f32[] grad_scaler.found_inf",
		"f32[] grad_scaler.found_inf", "f32[] grad_scaler.inv_scale"}
	if !slices.Equal(log.labels, want) {
		t.Errorf("step allocated %q, want %q", log.labels, want)
	}
	if want := []int64{base + 512}; !slices.Equal(opt.bytes, want) {
		t.Errorf("allocated during optimizer.step(): %v, want %v (the found_inf copy kept for update)", opt.bytes, want)
	}
	if got := allocatedNow(rt); got != base+512 {
		t.Errorf("%d bytes after step, want %d", got, base+512)
	}
	s.Update()
	if got := allocatedNow(rt); got != base {
		t.Errorf("%d bytes after update, want %d", got, base)
	}
	scaled.Release()
	loss.Release()
	s.Release()
}
