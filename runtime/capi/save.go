package main

// Saves: start one, wait until its pages are gathered, release it, drain all.

/*
#include "tutti.h"
*/
import "C"

//export tutti_save
func tutti_save(store C.uint64_t, chain *C.uint64_t, chainLen C.uint32_t, pages *C.int32_t, numPages C.uint32_t, outSave *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_save", &rc)
	return finish("tutti_save", startSave(store, chain, uint64(chainLen), pages, uint64(numPages), outSave))
}

func startSave(store C.uint64_t, chainP *C.uint64_t, chainLen uint64, pagesP *C.int32_t, numPages uint64, out *C.uint64_t) error {
	e, chain, pages, err := requestArgs(store, chainP, chainLen, pagesP, numPages, out, "out_save", false)
	if err != nil {
		return err
	}
	sv, err := e.s.Save(chain, pages)
	if err != nil {
		return err
	}
	se := &saveEntry{owner: e, s: sv}
	return publish(e, kindSave, se, func() error { return releaseSave(se) }, "save", out)
}

func saveArg(h C.uint64_t) (*saveEntry, error) {
	v, err := handles.get(uint64(h), kindSave)
	if err != nil {
		return nil, err
	}
	return v.(*saveEntry), nil
}

//export tutti_save_wait_gathered
func tutti_save_wait_gathered(save C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_save_wait_gathered", &rc)
	return finish("tutti_save_wait_gathered", func() error {
		se, err := saveArg(save)
		if err != nil {
			return err
		}
		return waitGathered(se)
	}())
}

//export tutti_save_gathered
func tutti_save_gathered(save C.uint64_t, outGathered *C.int32_t) (rc C.int32_t) {
	defer guard("tutti_save_gathered", &rc)
	return finish("tutti_save_gathered", func() error {
		if outGathered == nil {
			return errorf(errInvalidArgument, "out_gathered is NULL")
		}
		*outGathered = 0
		se, err := saveArg(save)
		if err != nil {
			return err
		}
		select {
		case <-se.s.Gathered():
			*outGathered = 1
		default:
		}
		return nil
	}())
}

//export tutti_save_release
func tutti_save_release(save C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_save_release", &rc)
	return finish("tutti_save_release", func() error {
		v, err := handles.take(uint64(save), kindSave)
		if err != nil {
			return err
		}
		se := v.(*saveEntry)
		se.owner.dropChild(uint64(save))
		return releaseSave(se)
	}())
}

//export tutti_wait_saves
func tutti_wait_saves(store C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_wait_saves", &rc)
	return finish("tutti_wait_saves", func() error {
		e, err := storeArg(uint64(store))
		if err != nil {
			return err
		}
		return e.s.WaitSaves()
	}())
}
