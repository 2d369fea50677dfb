package main

/*
#include "tutti.h"
*/
import "C"

import (
	"time"

	"github.com/tutti-io/tutti/runtime"
)

const (
	loadPromised   = 1 // TUTTI_LOAD_PROMISED
	loadFlagsKnown = loadPromised
	// maxHoldTTLMs bounds a hold: one hour is far beyond any scheduling gap.
	maxHoldTTLMs = 3600 * 1000
)

// holdEntry is what a hold handle names.
type holdEntry struct {
	owner *storeEntry
	h     *runtime.Hold
}

//export tutti_load_with
func tutti_load_with(store C.uint64_t, chain *C.uint64_t, chainLen C.uint32_t, skip C.uint32_t, flags C.uint32_t,
	pages *C.int32_t, numPages C.uint32_t, outLoad *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_load_with", &rc)
	return finish("tutti_load_with", startLoadWith(store, chain, uint64(chainLen), uint64(skip), uint32(flags), pages, uint64(numPages), outLoad))
}

func startLoadWith(store C.uint64_t, chainP *C.uint64_t, chainLen, skip uint64, flags uint32, pagesP *C.int32_t, numPages uint64, out *C.uint64_t) error {
	if out == nil {
		return errorf(errInvalidArgument, "out_load is NULL")
	}
	*out = 0
	if u := flags &^ loadFlagsKnown; u != 0 {
		return errorf(errInvalidArgument, "flags = %#x has bits unknown to ABI %d.%d (%#x); known: TUTTI_LOAD_PROMISED = %d", flags, abiMajor, abiMinor, u, loadPromised)
	}
	if skip >= chainLen {
		return errorf(errInvalidArgument, "skip = %d, want < chain_len (%d)", skip, chainLen)
	}
	e, err := storeArg(uint64(store))
	if err != nil {
		return err
	}
	chain, err := copyU64("chain", chainP, chainLen, maxChainBlocks)
	if err != nil {
		return err
	}
	rest := len(chain) - int(skip)
	if want := uint64(rest * e.cfg.Geometry.ChunkPages); numPages != want {
		return errorf(errGeometry, "num_pages = %d, want (chain_len (%d) - skip (%d)) * chunk_pages (%d) = %d",
			numPages, chainLen, skip, e.cfg.Geometry.ChunkPages, want)
	}
	pages, err := copyI32("pages", pagesP, numPages, maxPagesPerOp)
	if err != nil {
		return err
	}
	if err := checkPages(e.cfg, rest, pages, true); err != nil {
		return err
	}
	if err := e.checkRegistered(); err != nil {
		return err
	}
	l, err := e.s.LoadWith(chain, pages, runtime.LoadOptions{Skip: int(skip), Promised: flags&loadPromised != 0})
	if err != nil {
		return err
	}
	le := &loadEntry{owner: e, l: l}
	return publish(e, kindLoad, le, func() error { return releaseLoad(le) }, "load", out)
}

//export tutti_match
func tutti_match(store C.uint64_t, chain *C.uint64_t, chainLen C.uint32_t, skip C.uint32_t, ttlMs C.uint32_t,
	outHold *C.uint64_t, outBlocks *C.uint32_t) (rc C.int32_t) {
	defer guard("tutti_match", &rc)
	return finish("tutti_match", match(store, chain, uint64(chainLen), uint64(skip), uint32(ttlMs), outHold, outBlocks))
}

func match(store C.uint64_t, chainP *C.uint64_t, chainLen, skip uint64, ttlMs uint32, outHold *C.uint64_t, outBlocks *C.uint32_t) error {
	if outHold == nil || outBlocks == nil {
		return errorf(errInvalidArgument, "out_hold or out_blocks is NULL")
	}
	*outHold, *outBlocks = 0, 0
	if ttlMs == 0 || ttlMs > maxHoldTTLMs {
		return errorf(errInvalidArgument, "ttl_ms = %d, want 1..%d", ttlMs, maxHoldTTLMs)
	}
	if skip > chainLen {
		return errorf(errInvalidArgument, "skip = %d, want <= chain_len (%d)", skip, chainLen)
	}
	e, err := storeArg(uint64(store))
	if err != nil {
		return err
	}
	chain, err := copyU64("chain", chainP, chainLen, maxChainBlocks)
	if err != nil {
		return err
	}
	h, err := e.s.Match(chain, int(skip), time.Duration(ttlMs)*time.Millisecond)
	if err != nil {
		return err
	}
	var out C.uint64_t
	he := &holdEntry{owner: e, h: h}
	if err := publish(e, kindHold, he, func() error { h.Release(); return nil }, "hold", &out); err != nil {
		return err
	}
	*outHold, *outBlocks = out, C.uint32_t(h.Blocks())
	return nil
}

//export tutti_hold_release
func tutti_hold_release(hold C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_hold_release", &rc)
	return finish("tutti_hold_release", func() error {
		v, err := handles.take(uint64(hold), kindHold)
		if err != nil {
			return err
		}
		he := v.(*holdEntry)
		he.owner.dropChild(uint64(hold))
		he.h.Release()
		return nil
	}())
}
