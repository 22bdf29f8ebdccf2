#!/usr/bin/env bash
# Opens snapshots in PyTorch's memory_viz, in headless Chromium, in each of its three views, and prints what
# it drew or the errors it raised: a check that oomdbg record's dumps (PyTorch's pickles plus the "oomdbg"
# key) are still files memory_viz reads.
#
#   bash examples/record/memoryviz-check.sh MemoryViz.js d3.min.js SNAPSHOT...
#
# MemoryViz.js is torch/utils/viz/MemoryViz.js of a PyTorch install or checkout (Debian's python3-torch leaves
# it out); its first lines import d3 v5 from a CDN, which this script replaces with d3.min.js (npm pack
# d3@5.16.0: package/dist/d3.min.js), so nothing is fetched. The page is the one torch.cuda._memory_viz's
# trace_plot writes: the pickle in base64, given to add_local_files. Needs chromium and python3.
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n '2,12p' "$0"; exit 2; }
mv=$1 d3=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The CDN imports become the d3 bundle's globals.
grep -v '^import .* from "https://cdn' "$mv" | sed '1a const d3 = window.d3; const {axisLeft, scaleLinear, zoom, zoomIdentity, brushX} = d3;' >"$tmp/MemoryViz.js"
status=0
for snap in "$@"; do
	for view in "Active Memory Timeline" "Allocator State History" "Active Cached Segment Timeline"; do
		python3 - "$snap" "$view" "$d3" "$tmp/MemoryViz.js" "$tmp/page.html" <<'PY'
import base64, json, sys
snap, view, d3, mv, out = sys.argv[1:]
page = """<!DOCTYPE html><html><head><meta charset="utf-8"></head><body><div id="errors"></div>
<script>
window.onerror = (m, s, l, c) => { document.getElementById('errors').textContent += 'ERROR: ' + m + ' (line ' + l + ')'; };
window.addEventListener('unhandledrejection', e => { document.getElementById('errors').textContent += 'ERROR: ' + e.reason; });
</script><script>D3</script><script type="module">
MV
try { add_local_files([{name: NAME, base64: DATA}], VIEW); }
catch (e) { document.getElementById('errors').textContent += 'ERROR: ' + e; }
setTimeout(() => { const d = document.createElement('div'); d.id = 'drawn';
  d.textContent = document.querySelectorAll('polygon').length + ' polygons, ' + document.querySelectorAll('rect').length + ' rects, ' + document.querySelectorAll('pre').length + ' event lines';
  document.body.appendChild(d); }, 1500);
</script></body></html>"""
for k, v in (("D3", open(d3).read()), ("NAME", json.dumps(snap.rsplit("/", 1)[-1])), ("VIEW", json.dumps(view)),
             ("DATA", json.dumps(base64.b64encode(open(snap, "rb").read()).decode())), ("MV", open(mv).read())):
    page = page.replace(k, v, 1)
open(out, "w").write(page)
PY
		dom=$(timeout 120 chromium --headless --no-sandbox --disable-gpu --virtual-time-budget=8000 --dump-dom "file://$tmp/page.html" 2>/dev/null | tr '\n' ' ')
		errors=$(grep -o '<div id="errors">[^<]*' <<<"$dom" | sed 's/<div id="errors">//')
		drawn=$(grep -o '<div id="drawn">[^<]*' <<<"$dom" | sed 's/<div id="drawn">//')
		if [[ -n $errors || -z $drawn ]]; then
			echo "FAIL $snap, $view: ${errors:-nothing drawn}"
			status=1
		else
			echo "ok   $snap, $view: $drawn"
		fi
	done
done
exit $status
