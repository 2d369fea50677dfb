package kvevents

import (
	"errors"
	"testing"
)

func TestParseSpec(t *testing.T) {
	c, err := ParseSpec("tcp://127.0.0.1:5557?replay=tcp://127.0.0.1:5558&topic=kv@pod-0@llama&dp_rank=2")
	if err != nil {
		t.Fatal(err)
	}
	if c.Endpoint != "tcp://127.0.0.1:5557" || c.ReplayEndpoint != "tcp://127.0.0.1:5558" || c.Topic != "kv@pod-0@llama" || c.DataParallelRank != 2 {
		t.Fatalf("%+v", c)
	}
	for _, bad := range []string{"", "127.0.0.1:5557", "tcp://h:1?replay=udp://x", "tcp://h:1?x=1", "tcp://h:1?dp_rank=-1",
		"tcp://h:1?topic=a&topic=b", "tcp://h:1?max_queue_events=abc", "tcp://h:1?%zz"} {
		if _, err := ParseSpec(bad); !errors.Is(err, ErrConfig) {
			t.Errorf("%q: %v, want ErrConfig", bad, err)
		}
	}
}

func FuzzParseSpec(f *testing.F) {
	f.Add("tcp://127.0.0.1:5557?replay=tcp://127.0.0.1:5558&topic=kv@p@m")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseSpec(s)
		if err == nil {
			if verr := c.Validate(); verr != nil {
				t.Fatalf("%q parsed to an invalid config: %v", s, verr)
			}
		}
	})
}
