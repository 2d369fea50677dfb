package uring

import (
	"bytes"
	"os"
	"strconv"
)

// hugeBacked reports whether [addr, addr+n) is entirely backed by anonymous
// transparent huge pages, from /proc/self/smaps. Any read or parse failure
// answers false (the buffer then counts as 4 KiB pages: the safe reading).
func hugeBacked(addr uintptr, n int) bool {
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return false
	}
	kb, ok := anonHugeKB(b, addr)
	return ok && kb*1024 >= int64(n)
}

// anonHugeKB finds the mapping of smaps (the text of /proc/PID/smaps) that
// contains addr and returns its AnonHugePages in kB; ok is false when no
// mapping contains addr or the mapping has no well-formed AnonHugePages line.
func anonHugeKB(smaps []byte, addr uintptr) (kb int64, ok bool) {
	in := false
	for len(smaps) > 0 {
		line := smaps
		if i := bytes.IndexByte(smaps, '\n'); i >= 0 {
			line, smaps = smaps[:i], smaps[i+1:]
		} else {
			smaps = nil
		}
		if lo, hi, isHeader := smapsRange(line); isHeader {
			if in {
				return 0, false // the mapping ended without the field
			}
			in = uint64(addr) >= lo && uint64(addr) < hi
			continue
		}
		if !in {
			continue
		}
		rest, found := bytes.CutPrefix(line, []byte("AnonHugePages:"))
		if !found {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, false
		}
		v, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil || v < 0 {
			return 0, false
		}
		return v, true
	}
	return 0, false
}

// smapsRange parses a mapping header ("7f12a0000000-7f12a0400000 rw-p ...").
func smapsRange(line []byte) (lo, hi uint64, ok bool) {
	sp := bytes.IndexByte(line, ' ')
	if sp < 0 {
		return 0, 0, false
	}
	a, b, found := bytes.Cut(line[:sp], []byte("-"))
	if !found {
		return 0, 0, false
	}
	lo, err1 := strconv.ParseUint(string(a), 16, 64)
	hi, err2 := strconv.ParseUint(string(b), 16, 64)
	if err1 != nil || err2 != nil || hi < lo {
		return 0, 0, false
	}
	return lo, hi, true
}
