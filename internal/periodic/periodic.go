// Package periodic finds where a sequence repeats itself: a training loop's iterations in a trace's
// allocations (snapshot/torch), a model's repeated blocks within one forward pass (whatif/transform).
package periodic

// Prefix returns the longest prefix of the n tokens at gives that repeats one period at least repeats
// times, a partial period at its end included: its length and its period, the shortest that fits (0, 0:
// none). A period of one token does not count: a run of one token is not a loop. It takes O(n) time and
// 4n bytes.
func Prefix[T comparable](n int, at func(i int) T, repeats int) (span, period int) {
	if n < 2*max(repeats, 1) {
		return 0, 0
	}
	// The prefix function: pi[i] is the length of the longest proper prefix of tokens[:i+1] that is also
	// its suffix, so tokens[:l] has period l - pi[l-1].
	pi := make([]int32, n)
	for i := 1; i < n; i++ {
		k := int(pi[i-1])
		for k > 0 && at(i) != at(k) {
			k = int(pi[k-1])
		}
		if at(i) == at(k) {
			k++
		}
		pi[i] = int32(k)
	}
	for l := 1; l <= n; l++ {
		if p := l - int(pi[l-1]); p > 1 && l >= repeats*p {
			span, period = l, p
		}
	}
	return span, period
}
