package nvml

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/oomdbg/oomdbg/internal/nvmlib"
)

// reading is one call of a SampleFunc.
type reading struct {
	device      int
	used, total uint64
	at          time.Duration // since the sampler started
}

// recorder collects readings; it is the SampleFunc the recorder package will provide.
type recorder struct {
	mu    sync.Mutex
	start time.Time
	got   []reading
}

func (r *recorder) sample(device int, used, total uint64, t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, reading{device, used, total, t.Sub(r.start)})
}

func (r *recorder) readings() []reading {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]reading(nil), r.got...)
}

// growing is a device whose used memory grows by 1 GiB per reading, like a leaking training run.
func growing(t *testing.T) *Session {
	lib := newH100(t, gpuState{}, gpuState{})
	var used uint64
	lib.Devices[1].(*mockDevice).GetMemoryInfo_v2Func = func() (nvmlib.Memory_v2, nvmlib.Return) {
		used += gib
		return nvmlib.Memory_v2{Total: h100Total, Used: used, Free: h100Total - used}, nvmlib.SUCCESS
	}
	return openMock(t, lib)
}

// Time in a synctest bubble is virtual: readings land exactly on the interval, and the test takes no time.
func TestSamplerPolls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := growing(t)
		r := &recorder{start: time.Now()}
		ctx, cancel := context.WithCancel(t.Context())
		sm := StartSampler(ctx, s, 1, 100*time.Millisecond, r.sample)

		time.Sleep(450 * time.Millisecond)
		cancel()
		<-sm.Done()

		var want []reading
		for i := range 5 { // at 0, 100, 200, 300 and 400 ms
			want = append(want, reading{1, uint64(i+1) * gib, h100Total, time.Duration(i) * 100 * time.Millisecond})
		}
		got := r.readings()
		if len(got) != len(want) {
			t.Fatalf("got %d readings %+v, want %d", len(got), got, len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("reading %d = %+v, want %+v", i, got[i], want[i])
			}
		}
		if err := sm.Err(); err != nil {
			t.Errorf("Err() after cancel = %v, want nil", err)
		}
	})
}

func TestSamplerStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := growing(t)
		r := &recorder{start: time.Now()}
		sm := StartSampler(t.Context(), s, 1, 0, r.sample) // 0: DefaultInterval
		time.Sleep(DefaultInterval*3 - time.Millisecond)
		if err := sm.Err(); err != nil {
			t.Errorf("Err() while running = %v, want nil", err)
		}
		sm.Stop()
		n := len(r.readings())
		if n != 3 {
			t.Errorf("%d readings before Stop at 3 intervals, want 3", n)
		}
		time.Sleep(time.Second)
		if got := len(r.readings()); got != n {
			t.Errorf("%d readings delivered after Stop returned", got-n)
		}
		sm.Stop() // again: no panic, no hang
		select {
		case <-sm.Done():
		default:
			t.Error("Done() not closed after Stop")
		}
	})
}

// A failed reading ends sampling; Err says why. Closing the session under a running sampler is one such case.
func TestSamplerStopsOnError(t *testing.T) {
	tests := map[string]struct {
		brk  func(s *Session, lost *atomic.Bool)
		want error
	}{
		"GPU lost":       {func(_ *Session, lost *atomic.Bool) { lost.Store(true) }, nvmlib.ERROR_GPU_IS_LOST},
		"session closed": {func(s *Session, _ *atomic.Bool) { s.Close() }, ErrClosed},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lib := newH100(t, gpuState{used: gib})
				var lost atomic.Bool
				read := lib.Devices[0].(*mockDevice).GetMemoryInfo_v2Func
				lib.Devices[0].(*mockDevice).GetMemoryInfo_v2Func = func() (nvmlib.Memory_v2, nvmlib.Return) {
					if lost.Load() {
						return nvmlib.Memory_v2{}, nvmlib.ERROR_GPU_IS_LOST
					}
					return read()
				}
				s := openMock(t, lib)
				r := &recorder{start: time.Now()}
				sm := StartSampler(t.Context(), s, 0, 100*time.Millisecond, r.sample)
				time.Sleep(250 * time.Millisecond) // readings at 0, 100 and 200 ms
				tc.brk(s, &lost)
				<-sm.Done()
				if err := sm.Err(); !errors.Is(err, tc.want) {
					t.Errorf("Err() = %v, want %v", err, tc.want)
				}
				if got := len(r.readings()); got != 3 {
					t.Errorf("%d readings, want the 3 before the failure", got)
				}
			})
		})
	}
}

// A SampleFunc slower than the interval delays the next reading; the ticks it misses collapse into one, so
// readings follow each other as fast as the callback allows, never queued behind it.
func TestSamplerSlowCallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := growing(t)
		r := &recorder{start: time.Now()}
		slow := func(device int, used, total uint64, at time.Time) {
			r.sample(device, used, total, at)
			time.Sleep(250 * time.Millisecond)
		}
		// The deadline falls between ticks and callbacks, so the outcome does not depend on select's choice.
		ctx, cancel := context.WithTimeout(t.Context(), 1050*time.Millisecond)
		defer cancel()
		sm := StartSampler(ctx, s, 1, 100*time.Millisecond, slow)
		<-sm.Done()
		var want []reading
		for i := range 5 { // at 0, 250, 500, 750 and 1000 ms: right after each callback returns
			want = append(want, reading{1, uint64(i+1) * gib, h100Total, time.Duration(i) * 250 * time.Millisecond})
		}
		if got := r.readings(); !reflect.DeepEqual(got, want) {
			t.Errorf("readings\n got %+v\nwant %+v", got, want)
		}
	})
}
