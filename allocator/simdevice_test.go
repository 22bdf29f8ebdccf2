package allocator

import (
	"errors"
	"testing"
)

func TestSimDeviceAccounting(t *testing.T) {
	d := NewSimDevice(3, 8*gib, 512*mib)
	if d.Index() != 3 || d.TotalMemory() != 8*gib {
		t.Fatal("index or total")
	}
	free, total, _ := d.MemGetInfo()
	if free != 8*gib-512*mib || total != 8*gib {
		t.Fatalf("MemGetInfo = %d, %d", free, total)
	}
	a, err := d.Malloc(20 * mib)
	if err != nil || a != simMallocBase {
		t.Fatalf("Malloc = %#x, %v", a, err)
	}
	b, _ := d.Malloc(3 * mib) // 2 MiB-aligned: the next one starts 4 MiB later
	c, _ := d.Malloc(2 * mib)
	if b != a+20*mib || c != b+4*mib || a%simAddressAlign != 0 {
		t.Fatalf("addresses %#x %#x %#x", a, b, c)
	}
	if d.Used() != 25*mib {
		t.Fatalf("Used = %d", d.Used())
	}
	if err := d.Free(b); err != nil {
		t.Fatal(err)
	}
	if again, _ := d.Malloc(4 * mib); again != b {
		t.Fatalf("freed range not reused first-fit: %#x, want %#x", again, b)
	}
	if err := d.Free(b + 1); err == nil {
		t.Fatal("Free of an unknown address accepted")
	}
	// Exhaust the device.
	if _, err := d.Malloc(8 * gib); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("Malloc beyond capacity: %v", err)
	}
	d.SetNonAllocatorMemory(gib)
	d.SetOtherProcesses([]ProcessMemory{{PID: 99, Used: gib, Self: true}})
	procs := d.Processes()
	if len(procs) != 2 || !procs[0].Self || procs[0].Used != 512*mib+gib+26*mib || procs[1].Self || procs[1].PID != 99 {
		t.Fatalf("Processes = %+v", procs)
	}
	if free, _, _ := d.MemGetInfo(); free != 8*gib-512*mib-2*gib-26*mib {
		t.Fatalf("free %d", free)
	}
}

func TestSimDeviceVirtualMemory(t *testing.T) {
	d := NewSimDevice(0, gib, 0)
	r, err := d.ReserveAddressRange(100 * mib)
	if err != nil || r != simReserveBase {
		t.Fatalf("ReserveAddressRange = %#x, %v", r, err)
	}
	h, err := d.CreatePhysical(20 * mib)
	if err != nil || d.Used() != 20*mib {
		t.Fatalf("CreatePhysical: %v, used %d", err, d.Used())
	}
	if err := d.Map(r+20*mib, 20*mib, h); err != nil {
		t.Fatal(err)
	}
	h2, _ := d.CreatePhysical(20 * mib)
	for name, err := range map[string]error{
		"overlap":            d.Map(r+30*mib, 20*mib, h2),
		"outside":            d.Map(r+90*mib, 20*mib, h2),
		"wrong handle size":  d.Map(r, 10*mib, h2),
		"release mapped":     d.ReleasePhysical(h),
		"unmap unmapped":     d.Unmap(r, 20*mib),
		"free still mapped":  d.FreeAddressRange(r, 100*mib),
		"free unknown range": d.FreeAddressRange(r+mib, 100*mib),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := d.CreatePhysical(gib); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("CreatePhysical beyond capacity: %v", err)
	}
	if d.MappedBytes() != 20*mib {
		t.Fatalf("MappedBytes %d", d.MappedBytes())
	}
	for _, err := range []error{d.Unmap(r+20*mib, 20*mib), d.ReleasePhysical(h), d.ReleasePhysical(h2), d.FreeAddressRange(r, 100*mib)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if d.Used() != 0 {
		t.Fatalf("Used %d after releasing everything", d.Used())
	}
}
