package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestRecordExitCodes: oomdbg record exits with the job's own status (128+N for a signal), 127 for a command
// that does not exist and 2 for its own bad usage, each failure with one line on stderr.
func TestRecordExitCodes(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]struct {
		args []string
		code int
		says string
	}{
		"no command":      {[]string{"record"}, 2, "no command to record"},
		"bad stacks":      {[]string{"record", "-o", dir + "/a", "--stacks", "some", "--", "true"}, 2, "--stacks"},
		"not found":       {[]string{"record", "-o", dir + "/b", "--", "oomdbg-no-such-command"}, 127, "command not found"},
		"the job's code":  {[]string{"record", "-o", dir + "/c", "--", "sh", "-c", "exit 7"}, 7, "exited with status 7"},
		"a signal":        {[]string{"record", "-o", dir + "/d", "--", "sh", "-c", "kill -TERM $$"}, 143, "ended by terminated"},
		"success":         {[]string{"record", "-o", dir + "/e", "--", "true"}, 0, "no snapshot in"},
		"flags after cmd": {[]string{"record", "-o", dir + "/f", "sh", "-c", "exit 3", "--every", "2"}, 3, "exited with status 3"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), c.args, &stdout, &stderr)
			if code != c.code || !strings.Contains(stderr.String(), c.says) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr.String(), c.code, c.says)
			}
			if n := strings.Count(strings.TrimSpace(stderr.String()), "\n"); code != 0 && n > 1 {
				t.Errorf("%d lines on stderr: %q", n+1, stderr.String())
			}
		})
	}
}
