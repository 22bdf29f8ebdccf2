package layout

import "testing"

// TestOpsHoldWhatInFlightSays runs each stage's schedule and counts the passes whose forward has run and
// backward has not: their most is InFlight's count (Megatron's, in chunk-equivalents under interleaving),
// every pass runs once each way, and each backward follows its own forward.
func TestOpsHoldWhatInFlightSays(t *testing.T) {
	for _, s := range []Schedule{{Kind: GPipe}, {Kind: OneFOneB}, {Kind: Interleaved, Virtual: 2}, {Kind: Interleaved, Virtual: 3}} {
		for _, pp := range []int{2, 4, 8} {
			for _, m := range []int{pp, 2 * pp, 4 * pp} {
				v := max(s.Virtual, 1)
				l := Layout{PP: pp, Schedule: s, MicroBatches: m}
				for i := range pp {
					live := map[Op]bool{}
					most, forwards, backwards := 0, 0, 0
					for _, op := range Ops(s, pp, i, m) {
						key := Op{MicroBatch: op.MicroBatch, Chunk: op.Chunk}
						if op.Backward {
							if !live[key] {
								t.Fatalf("%s pp=%d stage %d m=%d: backward of %+v before its forward", s, pp, i, m, key)
							}
							delete(live, key)
							backwards++
							continue
						}
						if live[key] {
							t.Fatalf("%s pp=%d stage %d m=%d: forward of %+v twice", s, pp, i, m, key)
						}
						live[key] = true
						forwards++
						most = max(most, len(live))
					}
					if forwards != m*v || backwards != m*v {
						t.Errorf("%s pp=%d stage %d m=%d: %d forwards and %d backwards, want %d each", s, pp, i, m, forwards, backwards, m*v)
					}
					if want := InFlight(l, i) * float64(v); float64(most) != want {
						t.Errorf("%s pp=%d stage %d m=%d: %d passes in flight at most, InFlight gives %v", s, pp, i, m, most, want)
					}
				}
			}
		}
	}
}
