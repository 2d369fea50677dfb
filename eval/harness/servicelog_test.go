package harness

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func logFixture() *Result {
	svc := func(layerMs float64, ready bool) []Service {
		var out []Service
		for i := 0; i < 12; i++ {
			s := Service{ArrivalMs: float64(i) * 40, Layers: 4, LayerCompute: time.Duration(layerMs * float64(1+i%3) * 1e6),
				Save: 3 * time.Millisecond, SaveBlocks: 2}
			if ready && i%2 == 1 {
				s.LayerReady = []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond, 4 * time.Millisecond}
				s.Load, s.Bytes = 4*time.Millisecond, 1<<20
			}
			out = append(out, s)
		}
		return out
	}
	return &Result{Model: "tiny", SLOms: 7, SLOSource: "model", Backends: []BackendResult{
		{Backend: "tutti-cpu", Services: svc(2, true)},
		{Backend: "recompute", Services: svc(3, false)},
	}}
}

// services.json round-trips, and Resweep gives what the replay itself
// computes from the same services at the same SLO.
func TestServiceLogRoundTripAndResweep(t *testing.T) {
	res := logFixture()
	var buf bytes.Buffer
	if err := WriteServices(&buf, res); err != nil {
		t.Fatal(err)
	}
	log, err := ReadServices(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if log.Model != "tiny" || len(log.Backends) != 2 || len(log.Backends[0].Services) != 12 ||
		log.Backends[0].Services[1].LayerReady[3] != 4*time.Millisecond {
		t.Fatalf("round trip lost data: %+v", log)
	}
	rows, slo, source := Resweep(log, 0)
	if want := RecomputeSLO(res.Backends[1].Services); slo != want || source != RecomputeSLOSource {
		t.Fatalf("default SLO %v (%s), want %v from the recompute backend", slo, source, want)
	}
	for i, b := range res.Backends {
		_, rate := Sweep(b.Services, slo)
		if rows[i].Backend != b.Backend || rows[i].MaxRateAtSLO != rate || rows[i].TTFTmsP50 <= 0 {
			t.Fatalf("row %d %+v, want backend %s rate %v", i, rows[i], b.Backend, rate)
		}
	}
	if _, slo, source := Resweep(log, 123); slo != 123 || source != "given" {
		t.Fatalf("given SLO: %v (%s)", slo, source)
	}
}

func TestReadServicesRejects(t *testing.T) {
	for _, tc := range []struct{ name, json, want string }{
		{"not json", `{`, "unexpected EOF"},
		{"unknown field", `{"version":1,"bogus":1}`, "bogus"},
		{"version", `{"version":2,"backends":[{"backend":"a"}]}`, "version 2"},
		{"no backends", `{"version":1,"backends":[]}`, "0 backends"},
		{"unnamed", `{"version":1,"backends":[{"backend":""}]}`, "without a name"},
		{"arrival order", `{"version":1,"backends":[{"backend":"a","services":[{"arrival_ms":5,"layers":1},{"arrival_ms":4,"layers":1}]}]}`, "request 1: arrival 4"},
		{"layers", `{"version":1,"backends":[{"backend":"a","services":[{"arrival_ms":0,"layers":0}]}]}`, "0 layers"},
		{"ready count", `{"version":1,"backends":[{"backend":"a","services":[{"layers":1,"layer_ready_ns":[1,2]}]}]}`, "2 layer-ready times"},
		{"ready order", `{"version":1,"backends":[{"backend":"a","services":[{"layers":2,"layer_ready_ns":[5,4]}]}]}`, "layer 1 ready"},
		{"negative", `{"version":1,"backends":[{"backend":"a","services":[{"layers":1,"load_ns":-1}]}]}`, "negative"},
		{"slo", `{"version":1,"slo_ms":-1,"backends":[{"backend":"a"}]}`, "slo_ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadServices(strings.NewReader(tc.json))
			if !errors.Is(err, ErrServiceLog) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrServiceLog naming %q", err, tc.want)
			}
		})
	}
}

// Whatever the bytes, ReadServices returns a log the timeline can replay or
// an ErrServiceLog; it never panics, and Resweep of what it accepts neither.
func FuzzReadServices(f *testing.F) {
	var buf bytes.Buffer
	if err := WriteServices(&buf, logFixture()); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte(`{"version":1,"backends":[{"backend":"a","services":[{"layers":3,"layer_ready_ns":[0,1]}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		log, err := ReadServices(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrServiceLog) {
				t.Fatalf("error %v is not an ErrServiceLog", err)
			}
			return
		}
		total, steps := 0, 0
		for _, b := range log.Backends {
			total += len(b.Services)
			for _, s := range b.Services {
				steps += s.Layers + s.SaveBlocks
				if s.SaveBlocks > maxLogSaveBlocks || s.Layers > maxLogLayers || len(s.LayerReady) > s.Layers {
					t.Fatalf("accepted a service out of bounds: %+v", s)
				}
			}
		}
		if len(log.Backends) > maxLogBackends || total > maxLogServices || steps > maxLogSteps {
			t.Fatalf("accepted a log out of bounds: %d backends, %d services, %d steps", len(log.Backends), total, steps)
		}
		if total > 200 {
			return // the sweep's cost grows with the services; the checks above are what is fuzzed
		}
		Resweep(log, 0)
	})
}

func TestSpreadArrivals(t *testing.T) {
	for _, c := range []struct {
		in    []float64
		width float64
		want  []float64
	}{
		{[]float64{0, 0, 0}, 3000, []float64{0, 1000, 2000}},
		{[]float64{0, 0, 10, 20, 20}, 6, []float64{0, 3, 10, 20, 23}},
		{[]float64{0, 5, 9}, 100, []float64{0, 5, 9}},
		{[]float64{0, 0}, 0, []float64{0, 0}},
	} {
		svc := make([]Service, len(c.in))
		for i, a := range c.in {
			svc[i].ArrivalMs = a
		}
		SpreadArrivals(svc, c.width)
		for i := range svc {
			if svc[i].ArrivalMs != c.want[i] {
				t.Fatalf("%v over %v: got %v at %d, want %v", c.in, c.width, svc[i].ArrivalMs, i, c.want)
			}
		}
	}
	// A log recorded all at once has no rate curve; spread, it has one.
	svc := []Service{{Layers: 1, LayerCompute: time.Millisecond}, {Layers: 1, LayerCompute: time.Millisecond}, {Layers: 1, LayerCompute: time.Millisecond}}
	if _, r := Sweep(svc, 10); r != 0 {
		t.Fatalf("simultaneous arrivals swept to %v req/s", r)
	}
	SpreadArrivals(svc, 3000)
	if _, r := Sweep(svc, 10); r <= 0 {
		t.Fatal("spread arrivals: no rate meets a 10 ms SLO for 1 ms services")
	}
}

// endless is an io.Reader that repeats its pattern forever.
type endless struct {
	head, pattern []byte
	off           int
}

func (e *endless) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(e.head) > 0 {
			c := copy(p[n:], e.head)
			e.head, n = e.head[c:], n+c
			continue
		}
		c := copy(p[n:], e.pattern[e.off:])
		n += c
		e.off = (e.off + c) % len(e.pattern)
	}
	return n, nil
}

// TestReadServicesBounds: crafted logs past a bound are refused while they
// are read, naming the field or bound; endless input ends at the one-value
// bound instead of growing memory.
func TestReadServicesBounds(t *testing.T) {
	one := func(svc string) string {
		return `{"version":1,"backends":[{"backend":"a","services":[` + svc + `]}]}`
	}
	many := func(n int, svc string) string {
		return one(strings.TrimSuffix(strings.Repeat(svc+",", n), ","))
	}
	for _, tc := range []struct {
		name string
		r    io.Reader
		want string
	}{
		{"save_blocks", strings.NewReader(one(`{"layers":1,"save_ns":1,"save_blocks":3000000000}`)), "save_blocks 3000000000 beyond the bound 1048576"},
		{"arrival", strings.NewReader(one(`{"layers":1,"arrival_ms":1e308}`)), "arrival_ms 1e+308 beyond the bound"},
		{"load", strings.NewReader(one(`{"layers":1,"load_ns":9000000000000000000}`)), "beyond the bound"},
		{"layers", strings.NewReader(one(`{"layers":100000}`)), "100000 layers (1..4096)"},
		{"backends", strings.NewReader(`{"version":1,"backends":[` + strings.TrimSuffix(strings.Repeat(`{"backend":"a"},`, 65), ",") + `]}`), "more than 64 backends"},
		{"steps", strings.NewReader(many(1<<25/4096+1, `{"layers":4096}`)), "layers + save_blocks of all services exceed the bound 33554432"},
		{"huge array", &endless{head: []byte(`{"version":1,"backends":[{"backend":"a","services":[{"layers":1,"layer_ready_ns":[`), pattern: []byte("0,")}, "longer than 1048576 bytes"},
		{"endless blanks", &endless{head: []byte(`{"version":1,`), pattern: []byte(" ")}, "longer than 1048576 bytes"},
		{"endless nesting", &endless{head: []byte(`{"version":1,"backends":[{"backend":"a","services":[`), pattern: []byte("[")}, "backend a request 0"},
		{"unknown service field", strings.NewReader(one(`{"layers":1,"x":1}`)), `unknown field "x"`},
		{"unknown backend field", strings.NewReader(`{"version":1,"backends":[{"backend":"a","y":[]}]}`), `unknown field "y"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadServices(tc.r)
			if !errors.Is(err, ErrServiceLog) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrServiceLog naming %q", err, tc.want)
			}
		})
	}
	// At the bounds themselves the log is read.
	if _, err := ReadServices(strings.NewReader(many(1<<25/4096, `{"layers":4096}`))); err != nil {
		t.Fatalf("a log at the steps bound: %v", err)
	}
	if _, err := ReadServices(strings.NewReader(one(`{"layers":1,"save_ns":1,"save_blocks":1048576}`))); err != nil {
		t.Fatalf("save_blocks at the bound: %v", err)
	}
}
