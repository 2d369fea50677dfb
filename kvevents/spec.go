package kvevents

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// maxSpecBytes bounds a spec string.
const maxSpecBytes = 4096

// ParseSpec reads the one-string form of a Config that the CLI
// (--kv-events), the C ABI (tutti_open_kv_events) and Python (kv_events=)
// take:
//
//	tcp://HOST:PORT[?replay=tcp://HOST:PORT][&topic=TOPIC][&dp_rank=N][&max_queue_events=N][&format=F][&medium=M]
//	engine[?max_queue_events=N][&format=F][&medium=M]
//
// e.g. "tcp://127.0.0.1:5557?replay=tcp://127.0.0.1:5558&topic=kv@pod-0@llama".
// "engine" is Config.Engine: the engine takes the events (Publisher.Take).
// format is vllm-0.26 (the default: maps, medium FS, locality LOCAL) or
// vllm-0.11 (arrays, medium DISK); medium replaces the format's medium.
// Unknown keys, repeated keys and bad values are errors naming them; the
// result is validated.
func ParseSpec(spec string) (Config, error) {
	if len(spec) > maxSpecBytes {
		return Config{}, fmt.Errorf("%w: spec of %d bytes (at most %d)", ErrConfig, len(spec), maxSpecBytes)
	}
	ep, query, _ := strings.Cut(spec, "?")
	c := Config{Endpoint: ep}
	if ep == "engine" {
		c = Config{Engine: true}
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return Config{}, fmt.Errorf("%w: spec %q: %v", ErrConfig, spec, err)
	}
	for k, vs := range q {
		if len(vs) != 1 {
			return Config{}, fmt.Errorf("%w: spec key %q given %d times", ErrConfig, k, len(vs))
		}
		v := vs[0]
		switch k {
		case "replay":
			c.ReplayEndpoint = v
		case "topic":
			c.Topic = v
		case "format":
			f, err := ParseFormat(v)
			if err != nil {
				return Config{}, err
			}
			c.Format = f
		case "medium":
			if v == "" {
				return Config{}, fmt.Errorf("%w: spec key medium is empty", ErrConfig)
			}
			c.Medium = v
		case "dp_rank", "max_queue_events":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return Config{}, fmt.Errorf("%w: spec key %s=%q: want an integer >= 0", ErrConfig, k, v)
			}
			if k == "dp_rank" {
				c.DataParallelRank = n
			} else {
				c.MaxQueueEvents = n
			}
		default:
			return Config{}, fmt.Errorf("%w: unknown spec key %q (replay, topic, dp_rank, max_queue_events, format, medium)", ErrConfig, k)
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}
