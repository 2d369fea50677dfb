package main

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/internal/abicheck"
	"github.com/tutti-io/tutti/runtime"
)

// knownStats is a runtime.Stats whose every leaf holds a value of its own
// (numbers counted up in field order, strings "s" and that count, enums
// their second value, one element per list), with what each leaf must read
// as at its path of json names ("loads.miss_blocks.crc",
// "devices.probes.0.state").
func knownStats(t *testing.T) (runtime.Stats, map[string]any) {
	var st runtime.Stats
	want := map[string]any{}
	n := 0
	leaf := func(path string, v any) {
		if _, dup := want[path]; dup {
			t.Fatalf("two fields at %s", path)
		}
		want[path] = v
	}
	causes := func(path string, counts []int64, names []string) {
		for i, c := range names {
			n++
			counts[i] = int64(n)
			leaf(path+"."+strings.ReplaceAll(c, "-", "_"), n)
		}
	}
	textType := reflect.TypeFor[encoding.TextMarshaler]()
	var fill func(v reflect.Value, path string)
	fill = func(v reflect.Value, path string) {
		switch x := v.Addr().Interface().(type) {
		case *runtime.MissCounts:
			causes(path, x[:], names(runtime.MissCauses()))
			return
		case *runtime.SkipCounts:
			causes(path, x[:], names(runtime.SkipCauses()))
			return
		}
		if v.Kind() == reflect.Uint8 && v.Type().Implements(textType) {
			v.SetUint(1)
			leaf(path, fmt.Sprint(v.Interface()))
			return
		}
		switch v.Kind() {
		case reflect.Struct:
			for i := range v.NumField() {
				f := v.Type().Field(i)
				name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
				switch {
				case f.Anonymous && name == "":
					fill(v.Field(i), path)
				case name == "" || name == "-":
					t.Fatalf("%s: field %s of %s has no json name", path, f.Name, v.Type())
				case path == "":
					fill(v.Field(i), name)
				default:
					fill(v.Field(i), path+"."+name)
				}
			}
		case reflect.Slice:
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
			fill(v.Index(0), path+".0")
		case reflect.Int, reflect.Int64:
			n++
			v.SetInt(int64(n))
			leaf(path, n)
		case reflect.Uint64:
			n++
			v.SetUint(uint64(n))
			leaf(path, n)
		case reflect.Float64:
			n++
			v.SetFloat(float64(n) + 0.5)
			leaf(path, float64(n)+0.5)
		case reflect.String:
			n++
			v.SetString(fmt.Sprintf("s%d", n))
			leaf(path, fmt.Sprintf("s%d", n))
		case reflect.Bool:
			v.SetBool(true)
			leaf(path, true)
		default:
			t.Fatalf("%s: a %v field; knownStats gives it no value", path, v.Type())
		}
	}
	fill(reflect.ValueOf(&st).Elem(), "")
	return st, want
}

func names[C fmt.Stringer](cs []C) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.String()
	}
	return out
}

// flatten lists the leaves of a decoded JSON value by path, each as its
// JSON text (so 7 and 7.0 compare equal whoever decoded them).
func flatten(t *testing.T, v any, path string, out map[string]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			flatten(t, e, strings.TrimPrefix(path+"."+k, "."), out)
		}
	case []any:
		for i, e := range x {
			flatten(t, e, fmt.Sprintf("%s.%d", path, i), out)
		}
	default:
		b, err := json.Marshal(x)
		if err != nil {
			t.Fatal(err)
		}
		out[path] = string(b)
	}
}

func compareLeaves(t *testing.T, who string, got map[string]string, want map[string]any) {
	t.Helper()
	w := map[string]string{}
	flatten(t, want, "", w)
	for p, v := range w {
		if got[p] != v {
			t.Errorf("%s: %s = %s, want %s", who, p, got[p], v)
		}
	}
	for p, v := range got {
		if _, ok := w[p]; !ok {
			t.Errorf("%s: %s = %s, no Go field", who, p, v)
		}
	}
}

// pyStatsLeaves parses the library's stats JSON as Store.stats does and
// lists every leaf reached through the objects' attributes.
const pyStatsLeaves = `
import json, sys
from tutti.stats import StatsGroup, parse

out = {}
def walk(v, path):
    if isinstance(v, StatsGroup):
        for k in vars(v):
            walk(getattr(v, k), path + "." + k if path else k)
    elif isinstance(v, list):
        for i, e in enumerate(v):
            walk(e, "%s.%d" % (path, i))
    elif isinstance(v, dict):
        raise SystemExit(path + ": a dict, not a StatsGroup")
    else:
        out[path] = v
walk(parse(json.load(sys.stdin)["json"]), "")
print(json.dumps(out))
`

// TestStatsReachPython: every field of runtime.Stats, given a value of its
// own, is in what tutti_get_stats_json hands over (statsJSON) under its
// json name, reads back into the same Stats in Go, and reaches Python's
// Store.stats objects with that value; nothing else does.
func TestStatsReachPython(t *testing.T) {
	st, want := knownStats(t)
	b, err := statsJSON(st)
	if err != nil {
		t.Fatal(err)
	}
	var back runtime.Stats
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
	got := map[string]string{}
	flatten(t, tree, "", got)
	compareLeaves(t, "JSON", got, want)

	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	var py map[string]any
	if err := abicheck.Python(root, pyStatsLeaves, map[string]string{"json": string(b)}, &py); errors.Is(err, abicheck.ErrNoTool) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	gotPy := map[string]string{}
	for p, v := range py {
		flatten(t, v, p, gotPy)
	}
	compareLeaves(t, "Python", gotPy, want)
}
