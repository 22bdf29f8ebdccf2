package tui

import (
	"errors"

	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
)

// leakBanner is the line under the title once the leak analysis has found a leak: what oomdbg check would
// say of the snapshot, so that nobody has to think of pressing 4. Empty when check would pass.
func (m *Model) leakBanner() string {
	r := m.leaks.res
	if r == nil {
		return ""
	}
	var f *leaks.Failure
	if !errors.As(r.Err(), &f) {
		return ""
	}
	return "FAIL: " + f.Reason + " · 4 shows who keeps it and the fix"
}

// leakTitle is the title's word on a leak: " · LEAK +75.50 KiB per iteration".
func (m *Model) leakTitle() string {
	if r := m.leaks.res; r != nil && r.Verdict == leaks.Leak {
		return " · LEAK +" + units.FormatSize(r.LeakPerIteration) + " per iteration"
	}
	return ""
}

// bannerView renders the banner in the width.
func (m *Model) bannerView() string {
	return m.styles.Error.Render(padRight(ansi.Truncate(m.leakBanner(), m.width, "…"), m.width))
}
