package tui

import (
	"errors"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
)

// The banner is the line under the title when something must be read before the rest: the leak check's
// failure, what oomdbg check would say of the snapshot, so that nobody has to think of pressing 4; else,
// for a PyTorch snapshot of one moment, that the timeline climbing to it is rebuilt in an order nobody
// recorded.

// bannerText is the banner's text; "" when there is none. It is made once per analysis or snapshot
// (relayout), not per frame: the leak check's reason is a report of its own.
func (m *Model) bannerText() string {
	if r := m.leaks.res; r != nil {
		var f *leaks.Failure
		if errors.As(r.Err(), &f) {
			return "FAIL: " + f.Reason + " · 4 shows who keeps it and the fix"
		}
	}
	if m.ix != nil && m.ix.singleMoment() {
		return "final state only: the climb to it is rebuilt, in an invented order"
	}
	return ""
}

// leakTitle is the title's word on a leak: " · LEAK +75.50 KiB per iteration".
func (m *Model) leakTitle() string {
	if r := m.leaks.res; r != nil && r.Verdict == leaks.Leak {
		return " · LEAK +" + units.FormatSize(r.LeakPerIteration) + " per iteration"
	}
	return ""
}

// bannerView renders the banner in the width: a failure as an error, a notice as a warning.
func (m *Model) bannerView() string {
	st := m.styles.Warn
	if strings.HasPrefix(m.banner, "FAIL:") {
		st = m.styles.Error
	}
	return st.Render(padRight(ansi.Truncate(m.banner, m.width, "…"), m.width))
}
