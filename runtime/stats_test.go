package runtime

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"regexp"
	"strconv"
	"testing"
)

// TestStatsJSON: a live store's Stats survive JSON unchanged, every key is
// snake_case, and no value is null (lists are empty, not missing); a
// closed store still reports what it did.
func TestStatsJSON(t *testing.T) {
	g := tinyGeometry()
	cfg := testConfig(t, g, 0, 16*g.ChunkPages)
	s, kv := openKV(t, cfg)
	rng := rand.New(rand.NewPCG(3, 3))
	c := chainOf(77<<32, 3)
	p := pageTable(rng, g, cfg.NumPages, len(c))
	fill(kv, g, c, p)
	saveWait(t, s, c, p)
	loadWait(t, s, c, pageTable(rng, g, cfg.NumPages, len(c)))

	st := s.Stats()
	if st.Saves.SavedBlocks != 3 || st.Loads.RestoredBlocks != 3 || st.Index.Blocks != 3 || st.Map.LiveRuns != 1 {
		t.Fatalf("stats %+v", st)
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var back Stats
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, st) {
		t.Fatalf("through JSON:\n%+v\nwant\n%+v", back, st)
	}
	var tree any
	if err := json.Unmarshal(b, &tree); err != nil {
		t.Fatal(err)
	}
	key := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case nil:
			t.Errorf("%s is null", path)
		case map[string]any:
			for k, e := range x {
				if !key.MatchString(k) {
					t.Errorf("%s.%s: not a snake_case key", path, k)
				}
				walk(path+"."+k, e)
			}
		case []any:
			for i, e := range x {
				walk(path+"."+strconv.Itoa(i), e)
			}
		}
	}
	walk("stats", tree)

	closeKV(t, s, kv)
	if after := s.Stats(); after.Saves.SavedBlocks != 3 || after.Map.LiveRuns != 1 {
		t.Fatalf("after Close: %+v", after)
	}
}

// TestStatsEnumText: each enum's text is its String and reads back; text
// that names no value, or a cause that does not exist, is an error.
func TestStatsEnumText(t *testing.T) {
	check := func(v interface{ MarshalText() ([]byte, error) }, back any) {
		t.Helper()
		b, err := v.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		u := back.(interface{ UnmarshalText([]byte) error })
		if err := u.UnmarshalText(b); err != nil {
			t.Fatalf("%T %q: %v", v, b, err)
		}
		if got := reflect.ValueOf(back).Elem().Interface(); got != v {
			t.Fatalf("%T %q read back as %v", v, b, got)
		}
		if err := u.UnmarshalText([]byte("no-such-value")); err == nil {
			t.Fatalf("%T: unknown text accepted", v)
		}
	}
	for _, p := range []Path{PathCPU, PathGPU} {
		check(p, new(Path))
	}
	for c := range numStageCauses {
		check(c, new(StageCause))
	}
	for m := range numGPUReadModes {
		check(m, new(GPUReadMode))
	}
	for r := range numGPURings {
		check(r, new(GPURing))
	}
	for p := range numProbeStates {
		check(p, new(ProbeState))
	}
	for p := range numPrewriteStates {
		check(p, new(PrewriteState))
	}
	var m MissCounts
	if err := json.Unmarshal([]byte(`{"crc":2,"io_error":1}`), &m); err != nil || m[MissCRC] != 2 || m[MissIOError] != 1 || m.Total() != 3 {
		t.Fatalf("%v %v", m, err)
	}
	if err := json.Unmarshal([]byte(`{"crc":2,"io-error":1}`), &m); err == nil {
		t.Fatal("a cause key that is no cause's accepted")
	}
}
