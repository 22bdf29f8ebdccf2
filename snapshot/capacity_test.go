package snapshot_test

import (
	"errors"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

// TestGiveCapacity: a capacity given for a snapshot goes to its GPUs that record none, marked as given,
// never to its host memory; one that contradicts a recorded capacity is refused and changes nothing.
func TestGiveCapacity(t *testing.T) {
	const gib = 1 << 30
	m := snapshot.Meta{Devices: []snapshot.DeviceInfo{
		{Index: 0, Name: "cuda:0", Kind: "unknown"},
		{Index: 1, Name: "cuda:1", Kind: "unknown", Capacity: 24 * gib},
		{Index: snapshot.HostDeviceIndex, Kind: snapshot.DeviceKindHost},
	}}
	other := m
	other.Devices = append([]snapshot.DeviceInfo(nil), m.Devices...)
	var ce *snapshot.CapacityError
	if err := other.GiveCapacity(40 * gib); !errors.As(err, &ce) || ce.Device != "cuda:1" || ce.Recorded != 24*gib || ce.Given != 40*gib {
		t.Errorf("a capacity against cuda:1's recorded one: %v", err)
	}
	if other.Devices[0].Capacity != 0 {
		t.Errorf("a refused capacity was given to cuda:0: %+v", other.Devices[0])
	}
	if err := m.GiveCapacity(24 * gib); err != nil {
		t.Fatal(err)
	}
	want := []snapshot.DeviceInfo{
		{Index: 0, Name: "cuda:0", Kind: "unknown", Capacity: 24 * gib, CapacityGiven: true},
		{Index: 1, Name: "cuda:1", Kind: "unknown", Capacity: 24 * gib},
		{Index: snapshot.HostDeviceIndex, Kind: snapshot.DeviceKindHost},
	}
	for i := range want {
		if m.Devices[i] != want[i] {
			t.Errorf("device %d: %+v, want %+v", i, m.Devices[i], want[i])
		}
	}
}
