package kvevents

import (
	"errors"
	"testing"
)

func TestParseSpec(t *testing.T) {
	for _, c := range []struct {
		spec string
		want Config
	}{
		{"tcp://127.0.0.1:5557?replay=tcp://127.0.0.1:5558&topic=kv@pod-0@llama&dp_rank=2",
			Config{Endpoint: "tcp://127.0.0.1:5557", ReplayEndpoint: "tcp://127.0.0.1:5558", Topic: "kv@pod-0@llama", DataParallelRank: 2}},
		{"tcp://h:1?format=vllm-0.11", Config{Endpoint: "tcp://h:1", Format: FormatVLLM011}},
		{"tcp://h:1?format=vllm-0.26&medium=DISK", Config{Endpoint: "tcp://h:1", Medium: "DISK"}},
		{"engine", Config{Engine: true}},
		{"engine?max_queue_events=9&format=vllm-0.11", Config{Engine: true, MaxQueueEvents: 9, Format: FormatVLLM011}},
	} {
		got, err := ParseSpec(c.spec)
		if err != nil || got != c.want {
			t.Errorf("%q: %+v, %v; want %+v", c.spec, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "127.0.0.1:5557", "tcp://h:1?replay=udp://x", "tcp://h:1?x=1", "tcp://h:1?dp_rank=-1",
		"tcp://h:1?topic=a&topic=b", "tcp://h:1?max_queue_events=abc", "tcp://h:1?%zz", "tcp://h:1?format=vllm-0.20",
		"tcp://h:1?medium=", "engine?topic=t", "engine?replay=tcp://h:2", "engine?dp_rank=1", "engines"} {
		if _, err := ParseSpec(bad); !errors.Is(err, ErrConfig) {
			t.Errorf("%q: %v, want ErrConfig", bad, err)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	for _, c := range []struct {
		in                     Config
		medium, locality, name string
	}{
		{Config{}, MediumFS, LocalityLocal, "vllm-0.26"},
		{Config{Format: FormatVLLM011}, MediumDisk, "", "vllm-0.11"},
		{Config{Medium: "NVME", Locality: LocalityRemote}, "NVME", LocalityRemote, "vllm-0.26"},
	} {
		got := c.in.withDefaults()
		if got.Medium != c.medium || got.Locality != c.locality || got.Format.String() != c.name {
			t.Errorf("%+v: medium %q locality %q format %v", c.in, got.Medium, got.Locality, got.Format)
		}
	}
	for _, bad := range []Config{
		{Endpoint: "tcp://h:1", Format: 7},
		{Endpoint: "tcp://h:1", Format: FormatVLLM011, Locality: LocalityLocal},
		{Endpoint: "tcp://h:1", Locality: "NEAR"},
		{Engine: true, Endpoint: "tcp://h:1"},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", bad, err)
		}
	}
}

func FuzzParseSpec(f *testing.F) {
	f.Add("tcp://127.0.0.1:5557?replay=tcp://127.0.0.1:5558&topic=kv@p@m")
	f.Add("engine?format=vllm-0.11&medium=DISK")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseSpec(s)
		if err == nil {
			if verr := c.Validate(); verr != nil {
				t.Fatalf("%q parsed to an invalid config: %v", s, verr)
			}
		}
	})
}
