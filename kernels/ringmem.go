package kernels

/*
#include <stdint.h>
#include <string.h>
static inline uint32_t rm_load32(uint64_t a) { return __atomic_load_n((uint32_t *)a, __ATOMIC_ACQUIRE); }
static inline void rm_store32(uint64_t a, uint32_t v) { __atomic_store_n((uint32_t *)a, v, __ATOMIC_RELEASE); }
static inline uint64_t rm_load64(uint64_t a) { return *(volatile uint64_t *)a; }
static inline void rm_store64(uint64_t a, uint64_t v) { *(volatile uint64_t *)a = v; }
static inline void rm_zero(uint64_t a, uint64_t n) { memset((void *)a, 0, n); }
*/
import "C"

// Raw access to a ring's shared memory (addresses from uring.RingLayout), the
// way the GPU kernels reach it: acquire loads of indices the other side
// publishes, release stores of our own. Go code outside the GPU never drives
// the ring this way except to stand in for the GPU where none is (tests).
// The addresses are not Go pointers: the memory is the ring's mapping.

func ringLoad32(addr uintptr) uint32     { return uint32(C.rm_load32(C.uint64_t(addr))) }
func ringStore32(addr uintptr, v uint32) { C.rm_store32(C.uint64_t(addr), C.uint32_t(v)) }
func ringLoad64(addr uintptr) uint64     { return uint64(C.rm_load64(C.uint64_t(addr))) }
func ringStore64(addr uintptr, v uint64) { C.rm_store64(C.uint64_t(addr), C.uint64_t(v)) }
func ringZero(addr uintptr, n int)       { C.rm_zero(C.uint64_t(addr), C.uint64_t(n)) }
