package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Bounds of ReadServices: what a replay can produce, with room. A log past
// any of them is refused while it is read, so a crafted file costs neither
// minutes of sweeping nor gigabytes of memory.
const (
	maxLogBytes    = 1 << 30
	maxLogBackends = 64
	maxLogLayers   = 4096
	// maxLogValueBytes bounds one JSON value the reader buffers (a service
	// of maxLogLayers layer-ready times is under 100 KiB).
	maxLogValueBytes = 1 << 20
	// maxLogServices bounds the services of all backends together (a
	// replay has one per request and backend).
	maxLogServices = 1 << 22
	// maxLogSteps bounds what one pass of the timeline over the log costs
	// (Simulate steps once per layer and once per saved block; a sweep
	// runs it about a hundred times per backend): layers plus save_blocks
	// summed over every service.
	maxLogSteps = 1 << 25
	// maxLogSaveBlocks bounds one service's saved blocks (a save is at
	// most a request's blocks).
	maxLogSaveBlocks = 1 << 20
	// maxLogTime bounds one service's load, save and per-layer compute.
	maxLogTime = time.Hour
	// maxLogArrivalMs bounds an arrival (a trace's timestamps, scaled).
	maxLogArrivalMs = 1e15
)

// errValueTooLarge ends a read whose next JSON value exceeds maxLogValueBytes.
var errValueTooLarge = fmt.Errorf("a JSON value longer than %d bytes", maxLogValueBytes)

// boundedReader fails a read past limit (one value's bound, moved on before
// each value) or past maxLogBytes in all.
type boundedReader struct {
	r        io.Reader
	n, limit int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.n >= maxLogBytes {
		return 0, fmt.Errorf("longer than %d bytes", maxLogBytes)
	}
	if b.n >= b.limit {
		return 0, errValueTooLarge
	}
	if rest := min(b.limit, maxLogBytes) - b.n; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := b.r.Read(p)
	b.n += int64(n)
	return n, err
}

// logDecoder streams a ServiceLog token by token: only one service is
// buffered at a time, and every count is checked as it grows.
type logDecoder struct {
	br        *boundedReader
	dec       *json.Decoder
	nServices int // in all backends
	steps     int // layers + save_blocks in all backends
}

// next moves the one-value bound on to what follows.
func (d *logDecoder) next() { d.br.limit = d.br.n + maxLogValueBytes }

func (d *logDecoder) decode(v any) error {
	d.next()
	return d.dec.Decode(v)
}

func (d *logDecoder) delim(want json.Delim, what string) error {
	d.next()
	t, err := d.dec.Token()
	if err != nil {
		return err
	}
	if t != want {
		return fmt.Errorf("%s: want %v, got %v", what, want, t)
	}
	return nil
}

func (d *logDecoder) key() (string, error) {
	d.next()
	t, err := d.dec.Token()
	if err != nil {
		return "", err
	}
	k, ok := t.(string)
	if !ok {
		return "", fmt.Errorf("want a field name, got %v", t)
	}
	return k, nil
}

// ReadServices reads and checks a ServiceLog: every service must be one the
// timeline can replay (finite, non-negative, arrivals in order, layer
// readiness in order and within the layers), and the log within the bounds
// above. The error wraps ErrServiceLog and names the backend, the request
// and the field or bound.
func ReadServices(r io.Reader) (*ServiceLog, error) {
	br := &boundedReader{r: r}
	d := &logDecoder{br: br, dec: json.NewDecoder(br)}
	d.dec.DisallowUnknownFields()
	log, err := d.log()
	if err != nil {
		if errors.Is(err, ErrServiceLog) {
			return nil, err
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // a log ends with its closing brace
		}
		return nil, fmt.Errorf("%w: %v", ErrServiceLog, err)
	}
	if log.Version != ServiceLogVersion {
		return nil, fmt.Errorf("%w: version %d (want %d)", ErrServiceLog, log.Version, ServiceLogVersion)
	}
	if !finite(log.SLOms) || log.SLOms < 0 {
		return nil, fmt.Errorf("%w: slo_ms %v", ErrServiceLog, log.SLOms)
	}
	if len(log.Backends) == 0 {
		return nil, fmt.Errorf("%w: 0 backends (1..%d)", ErrServiceLog, maxLogBackends)
	}
	for _, b := range log.Backends {
		if b.Backend == "" {
			return nil, fmt.Errorf("%w: a backend without a name", ErrServiceLog)
		}
	}
	return log, nil
}

func (d *logDecoder) log() (*ServiceLog, error) {
	log := &ServiceLog{}
	if err := d.delim('{', "the log"); err != nil {
		return nil, err
	}
	for d.dec.More() {
		k, err := d.key()
		if err != nil {
			return nil, err
		}
		switch k {
		case "version":
			err = d.decode(&log.Version)
		case "model":
			err = d.decode(&log.Model)
		case "slo_ms":
			err = d.decode(&log.SLOms)
		case "slo_source":
			err = d.decode(&log.SLOSource)
		case "backends":
			log.Backends, err = d.backends()
		default:
			err = fmt.Errorf("json: unknown field %q", k)
		}
		if err != nil {
			return nil, err
		}
	}
	return log, d.delim('}', "the log")
}

func (d *logDecoder) backends() ([]BackendServices, error) {
	if err := d.delim('[', "backends"); err != nil {
		return nil, err
	}
	var out []BackendServices
	for d.dec.More() {
		if len(out) == maxLogBackends {
			return nil, fmt.Errorf("%w: more than %d backends", ErrServiceLog, maxLogBackends)
		}
		b, err := d.backend(len(out))
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, d.delim(']', "backends")
}

func (d *logDecoder) backend(i int) (BackendServices, error) {
	var b BackendServices
	if err := d.delim('{', fmt.Sprintf("backend %d", i)); err != nil {
		return b, err
	}
	for d.dec.More() {
		k, err := d.key()
		if err != nil {
			return b, err
		}
		switch k {
		case "backend":
			err = d.decode(&b.Backend)
		case "services":
			b.Services, err = d.services(i, &b)
		default:
			err = fmt.Errorf("json: unknown field %q in backend %d", k, i)
		}
		if err != nil {
			return b, err
		}
	}
	return b, d.delim('}', fmt.Sprintf("backend %d", i))
}

// services reads one backend's services, checking each (checkService) and
// the log's bounds as it goes.
func (d *logDecoder) services(i int, b *BackendServices) ([]Service, error) {
	name := func() string {
		if b.Backend == "" {
			return fmt.Sprintf("backend %d", i)
		}
		return "backend " + b.Backend
	}
	if err := d.delim('[', name()+" services"); err != nil {
		return nil, err
	}
	var out []Service
	prev := 0.0
	for d.dec.More() {
		var s Service
		if err := d.decode(&s); err != nil {
			return nil, fmt.Errorf("%w: %s request %d: %v", ErrServiceLog, name(), len(out), err)
		}
		if err := checkService(s, prev); err != nil {
			return nil, fmt.Errorf("%w: %s request %d: %v", ErrServiceLog, name(), len(out), err)
		}
		d.nServices++
		d.steps += s.Layers + s.SaveBlocks
		switch {
		case d.nServices > maxLogServices:
			return nil, fmt.Errorf("%w: %s request %d: more than %d services in all backends", ErrServiceLog, name(), len(out), maxLogServices)
		case d.steps > maxLogSteps:
			return nil, fmt.Errorf("%w: %s request %d: layers + save_blocks of all services exceed the bound %d", ErrServiceLog, name(), len(out), maxLogSteps)
		}
		prev = s.ArrivalMs
		out = append(out, s)
	}
	return out, d.delim(']', name()+" services")
}
