package tui

import (
	"bytes"
	"context"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/exp/teatest/v2"
)

// TestProgramStreamsTheWorkloadAndQuits runs the TUI as a program: it records a workload, streams it in,
// lands on the OOM, follows keys and quits.
func TestProgramStreamsTheWorkloadAndQuits(t *testing.T) {
	m := New(context.Background(), Options{Workload: workload(t, "tiny-oom"), Backend: playback{}, Profile: colorprofile.Ascii, Devices: noDriver})
	tm := teatest.NewTestModel(t, m, teatest.WithInitialTermSize(80, 24))
	teatest.WaitFor(t, tm.Output(), func(b []byte) bool { return bytes.Contains(b, []byte("landed on the OOM")) },
		teatest.WithDuration(20*time.Second))
	tm.Send(tea.KeyPressMsg{Code: 'p', Text: "p"})
	tm.Send(tea.KeyPressMsg{Code: '2', Text: "2"})
	tm.Send(tea.KeyPressMsg{Code: 'q', Text: "q"})
	final := tm.FinalModel(t, teatest.WithFinalTimeout(10*time.Second)).(*Model)
	if final.ix == nil || final.Cursor() != final.ix.peak {
		t.Errorf("the program ended at event %d; p should have put it on the peak", final.Cursor())
	}
	if final.Pane() != "Categories" {
		t.Errorf("pane %s, want Categories", final.Pane())
	}
}
