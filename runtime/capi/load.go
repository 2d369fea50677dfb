package main

// Loads: start one, wait for its layers, read its plan and failure, release it.

/*
#include "tutti.h"
*/
import "C"

import (
	"fmt"
)

//export tutti_load
func tutti_load(store C.uint64_t, chain *C.uint64_t, chainLen C.uint32_t, pages *C.int32_t, numPages C.uint32_t, outLoad *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_load", &rc)
	return finish("tutti_load", startLoad(store, chain, uint64(chainLen), pages, uint64(numPages), outLoad))
}

func startLoad(store C.uint64_t, chainP *C.uint64_t, chainLen uint64, pagesP *C.int32_t, numPages uint64, out *C.uint64_t) error {
	e, chain, pages, err := requestArgs(store, chainP, chainLen, pagesP, numPages, out, "out_load", true)
	if err != nil {
		return err
	}
	l, err := e.s.Load(chain, pages)
	if err != nil {
		return err
	}
	le := &loadEntry{owner: e, l: l}
	return publish(e, kindLoad, le, func() error { return releaseLoad(le) }, "load", out)
}

// requestArgs checks and copies what tutti_load and tutti_save share: the
// out pointer (zeroed), the store, the chain and its block table (distinct
// pages for a load: two blocks cannot be restored into one page), and that
// KV memory is registered.
func requestArgs(store C.uint64_t, chainP *C.uint64_t, chainLen uint64, pagesP *C.int32_t, numPages uint64,
	out *C.uint64_t, outName string, distinct bool) (*storeEntry, []uint64, []int32, error) {
	if out == nil {
		return nil, nil, nil, errorf(errInvalidArgument, "%s is NULL", outName)
	}
	*out = 0
	e, err := storeArg(uint64(store))
	if err != nil {
		return nil, nil, nil, err
	}
	chain, pages, err := copyChainPages(e.cfg, chainP, chainLen, pagesP, numPages)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := checkPages(e.cfg, len(chain), pages, distinct); err != nil {
		return nil, nil, nil, err
	}
	if err := e.checkRegistered(); err != nil {
		return nil, nil, nil, err
	}
	return e, chain, pages, nil
}

// publish gives the caller a handle of kind k for v, a child of store e; if
// no handle can be made, v is released (so nothing is left running that the
// caller cannot reach) and the error says so.
func publish(e *storeEntry, k kind, v any, release func() error, what string, out *C.uint64_t) error {
	h, err := handles.add(k, v)
	if err == nil {
		if err = e.addChild(h); err != nil {
			handles.take(h, k)
		}
	}
	if err != nil {
		if rerr := release(); rerr != nil {
			return fmt.Errorf("%w (releasing the %s: %v)", err, what, rerr)
		}
		return err
	}
	*out = C.uint64_t(h)
	return nil
}

func loadArg(h C.uint64_t) (*loadEntry, error) {
	v, err := handles.get(uint64(h), kindLoad)
	if err != nil {
		return nil, err
	}
	return v.(*loadEntry), nil
}

//export tutti_load_wait_layer
func tutti_load_wait_layer(load C.uint64_t, layer C.int32_t) (rc C.int32_t) {
	defer guard("tutti_load_wait_layer", &rc)
	return finish("tutti_load_wait_layer", waitLayer(load, int(layer)))
}

func waitLayer(h C.uint64_t, layer int) error {
	le, err := loadArg(h)
	if err != nil {
		return err
	}
	if n := le.owner.cfg.Geometry.Layers; layer < 0 || layer >= n {
		return errorf(errOutOfRange, "layer = %d, want 0..%d", layer, n-1)
	}
	return le.l.WaitLayer(layer)
}

//export tutti_load_stream_wait_layer
func tutti_load_stream_wait_layer(load C.uint64_t, layer C.int32_t, stream C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_load_stream_wait_layer", &rc)
	return finish("tutti_load_stream_wait_layer", func() error {
		le, err := loadArg(load)
		if err != nil {
			return err
		}
		if n := le.owner.cfg.Geometry.Layers; layer < 0 || int(layer) >= n {
			return errorf(errOutOfRange, "layer = %d, want 0..%d", layer, n-1)
		}
		return le.l.StreamWaitLayer(int(layer), uintptr(stream))
	}())
}

//export tutti_load_wait
func tutti_load_wait(load C.uint64_t, outBlocks *C.uint32_t) (rc C.int32_t) {
	defer guard("tutti_load_wait", &rc)
	return finish("tutti_load_wait", waitLoad(load, outBlocks))
}

func waitLoad(h C.uint64_t, out *C.uint32_t) error {
	if out != nil {
		*out = 0
	}
	le, err := loadArg(h)
	if err != nil {
		return err
	}
	if err := le.l.Wait(); err != nil {
		return err
	}
	if out != nil {
		*out = C.uint32_t(le.l.Blocks())
	}
	return nil
}

//export tutti_load_done
func tutti_load_done(load C.uint64_t, outDone *C.int32_t) (rc C.int32_t) {
	defer guard("tutti_load_done", &rc)
	return finish("tutti_load_done", func() error {
		if outDone == nil {
			return errorf(errInvalidArgument, "out_done is NULL")
		}
		*outDone = 0
		le, err := loadArg(load)
		if err != nil {
			return err
		}
		if le.l.Done() {
			*outDone = 1
		}
		return nil
	}())
}

//export tutti_load_plan
func tutti_load_plan(load C.uint64_t, outCached, outPlanned *C.uint32_t) (rc C.int32_t) {
	defer guard("tutti_load_plan", &rc)
	return finish("tutti_load_plan", func() error {
		le, err := loadArg(load)
		if err != nil {
			return err
		}
		if outCached != nil {
			*outCached = C.uint32_t(le.l.Cached())
		}
		if outPlanned != nil {
			*outPlanned = C.uint32_t(le.l.Planned())
		}
		return nil
	}())
}

//export tutti_load_failure
func tutti_load_failure(load C.uint64_t, outStatus *C.int32_t) (rc C.int32_t) {
	defer guard("tutti_load_failure", &rc)
	return finish("tutti_load_failure", func() error {
		if outStatus == nil {
			return errorf(errInvalidArgument, "out_status is NULL")
		}
		*outStatus = C.int32_t(statusOK)
		le, err := loadArg(load)
		if err != nil {
			return err
		}
		if f := le.l.Failure(); f != nil {
			code := classify(f)
			if code == errInternal {
				code = errIO // a miss always comes from reading the store
			}
			*outStatus = C.int32_t(code)
			setError("load: " + f.Error())
		}
		return nil
	}())
}

//export tutti_load_release
func tutti_load_release(load C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_load_release", &rc)
	return finish("tutti_load_release", func() error {
		v, err := handles.take(uint64(load), kindLoad)
		if err != nil {
			return err
		}
		le := v.(*loadEntry)
		le.owner.dropChild(uint64(load))
		return releaseLoad(le)
	}())
}
