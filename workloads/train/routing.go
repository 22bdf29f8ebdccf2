package train

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/workloads/nn"
)

// Routing is how a mixture of experts routes its tokens where the device computes no router scores (the
// meta and cuda devices; on the cpu device the router's top-k does): --routing uniform (every expert equally
// likely, the zero value), skewed:ALPHA (in each layer the experts' chances fall as 1/rank^ALPHA, Zipf's law),
// or file:PATH (measured loads: one line per layer, each expert's tokens or share separated by spaces or
// commas; the last line stands for the layers past it). Each token goes to ExpertsPerToken distinct experts,
// drawn from the run's seed. The memory of a layer follows the busiest expert's tokens; the run's summary
// says how busy it was.
type Routing struct {
	kind  routingKind
	alpha float64
	file  *RoutingFile
}

type routingKind uint8

const (
	routeUniform routingKind = iota
	routeSkewed
	routeFile
)

// Bounds on a routing file.
const (
	MaxRoutingFileBytes = 1 << 20
	maxRoutingRows      = 1 << 12
	maxRoutingExperts   = 1 << 12
	maxSkew             = 64
)

// RoutingFile is the loads of a file:PATH routing.
type RoutingFile struct {
	Path  string
	Loads [][]float64
}

// ParseRouting reads a --routing setting; a file is read here, once.
func ParseRouting(s string) (Routing, error) {
	if path, ok := strings.CutPrefix(s, "file:"); ok {
		data, err := readBounded(path, MaxRoutingFileBytes)
		if err != nil {
			return Routing{}, fmt.Errorf("routing file:%s: %w", path, err)
		}
		loads, err := parseLoads(data)
		if err != nil {
			return Routing{}, fmt.Errorf("routing file:%s: %w", path, err)
		}
		return Routing{kind: routeFile, file: &RoutingFile{Path: path, Loads: loads}}, nil
	}
	return parseRoutingWord(s)
}

func parseRoutingWord(s string) (Routing, error) {
	switch kind, arg, _ := strings.Cut(s, ":"); kind {
	case "", "uniform":
		if arg != "" {
			break
		}
		return Routing{}, nil
	case "skewed":
		a, err := strconv.ParseFloat(arg, 64)
		if err != nil || !(a >= 0 && a <= maxSkew) {
			return Routing{}, fmt.Errorf("routing %q: want skewed:ALPHA with 0 <= ALPHA <= %d", s, maxSkew)
		}
		return Routing{kind: routeSkewed, alpha: a}, nil
	}
	return Routing{}, fmt.Errorf("unknown routing %q (want uniform, skewed:ALPHA or file:PATH)", s)
}

// readBounded reads at most limit bytes of the file at path.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, unwrapPath(err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, unwrapPath(err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return data, nil
}

// parseLoads reads the lines of a routing file: each a layer's loads, non-negative, some positive.
func parseLoads(data []byte) ([][]float64, error) {
	var loads [][]float64
	for i, line := range bytes.Split(data, []byte{'\n'}) {
		fields := strings.FieldsFunc(string(line), func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\r' })
		if len(fields) == 0 {
			continue
		}
		row := make([]float64, len(fields))
		for j, f := range fields {
			v, err := strconv.ParseFloat(f, 64)
			if err != nil || !(v >= 0) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("line %d: %q is not a load (a number >= 0)", i+1, f)
			}
			row[j] = v
		}
		loads = append(loads, row)
	}
	return loads, checkLoads(loads)
}

func checkLoads(loads [][]float64) error {
	switch {
	case len(loads) == 0:
		return fmt.Errorf("no loads: give one line of experts' loads per layer")
	case len(loads) > maxRoutingRows:
		return fmt.Errorf("%d lines: at most %d", len(loads), maxRoutingRows)
	}
	for i, row := range loads {
		if len(row) != len(loads[0]) || len(row) > maxRoutingExperts {
			return fmt.Errorf("line %d has %d loads, the first %d (at most %d experts)", i+1, len(row), len(loads[0]), maxRoutingExperts)
		}
		var sum float64
		for _, v := range row {
			sum += v
		}
		if !(sum > 0) || math.IsInf(sum, 0) {
			return fmt.Errorf("line %d: no expert has a load", i+1)
		}
	}
	return nil
}

// check says whether the routing fits a model of the given experts.
func (r Routing) check(experts int) error {
	if r.kind == routeFile && len(r.file.Loads[0]) != experts {
		return fmt.Errorf("routing file:%s gives %d experts' loads, the model has %d experts", r.file.Path, len(r.file.Loads[0]), experts)
	}
	return nil
}

// nn returns the runtime's routing.
func (r Routing) nn() nn.Routing {
	switch r.kind {
	case routeSkewed:
		return nn.SkewedRouting{Alpha: r.alpha}
	case routeFile:
		return nn.LoadRouting{Loads: r.file.Loads}
	}
	return nn.UniformRouting{}
}

func (r Routing) String() string {
	switch r.kind {
	case routeSkewed:
		return "skewed:" + strconv.FormatFloat(r.alpha, 'g', -1, 64)
	case routeFile:
		return "file:" + r.file.Path
	}
	return "uniform"
}

// IsZero reports whether r is uniform, so that a configuration's JSON leaves it out.
func (r Routing) IsZero() bool { return r.kind == routeUniform }

// MarshalText writes the setting as it is given on the command line.
func (r Routing) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads the setting as given on the command line; file:PATH reads the file.
func (r *Routing) UnmarshalText(text []byte) error { return parseInto(r, ParseRouting, text) }

type routingJSON struct {
	File  string      `json:"file"`
	Loads [][]float64 `json:"loads"`
}

// MarshalJSON writes the setting as its word, or a file's path and loads: a snapshot reproduces its run
// without the file.
func (r Routing) MarshalJSON() ([]byte, error) {
	if r.kind != routeFile {
		return json.Marshal(r.String())
	}
	return json.Marshal(routingJSON{File: r.file.Path, Loads: r.file.Loads})
}

// UnmarshalJSON reads what MarshalJSON writes; a stored configuration never makes oomdbg open a file.
func (r *Routing) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		if strings.HasPrefix(s, "file:") {
			return fmt.Errorf("routing %q: a stored configuration carries a file's loads, not its path", s)
		}
		v, err := parseRoutingWord(s)
		if err != nil {
			return err
		}
		*r = v
		return nil
	}
	var in routingJSON
	if err := json.Unmarshal(data, &in); err != nil {
		return fmt.Errorf("routing: %w", err)
	}
	for _, row := range in.Loads {
		for _, v := range row {
			if !(v >= 0) || math.IsInf(v, 0) {
				return fmt.Errorf("routing: a load %v is not a number >= 0", v)
			}
		}
	}
	if err := checkLoads(in.Loads); err != nil {
		return fmt.Errorf("routing: %w", err)
	}
	*r = Routing{kind: routeFile, file: &RoutingFile{Path: in.File, Loads: in.Loads}}
	return nil
}
