package tui

// What the tests of package tui_test, which drive the model through tuitest, need of the package's own.

// SetPageEvents sets the events per page of a paged run.
func SetPageEvents(o *Options, n int) { o.pageEvents = n }

// Playback is the Backend that plays back the frozen recordings of testdata/fixtures.
func Playback() Backend { return playback{} }
