package triage

import "encoding/json"

// ForRanks returns the part of r a RankTable reads for its row: the source, devices and peaks with memory by
// category, the OOM without what was alive at it and its replays, the leak verdict, the model states and host memory. A job
// of a thousand ranks keeps one of these per rank, a few kilobytes, where whole reports took about 85 KB
// each; the two ranks a table compares in detail (Typical and Worst, whose scopes at the peak it sets side by
// side) are reported whole. The copy shares nothing with r: a report's strings point into its snapshot's
// string table, which one kept string would keep alive whole.
func (r *Report) ForRanks() *Report {
	s := &Report{Format: r.Format, Source: r.Source, Devices: r.Devices, ModelStates: r.ModelStates, Host: r.Host}
	s.Source.EventsByAction, s.Source.ReconstructedByAction = nil, nil
	s.Leaks.Verdict = r.Leaks.Verdict // the job's problem names the ranks that leak
	s.Peak = r.Peak
	s.Peak.Alive = Alive{ByCategory: r.Peak.ByCategory}
	if r.OOM != nil {
		oom := *r.OOM
		oom.Stack, oom.Replays, oom.ServedBy, oom.Alive = nil, nil, nil, Alive{ByCategory: oom.ByCategory}
		s.OOM = &oom
	}
	// Through the report's JSON form (its schema, which holds every field a row reads): fresh strings and maps.
	b, err := json.Marshal(s)
	if err != nil {
		return s
	}
	var c Report
	if json.Unmarshal(b, &c) != nil {
		return s
	}
	return &c
}
