// Package kvshape is the KV cache's shape as an engine pages it: the model's
// tensors (layers, KV heads, head dim, element type, K and V planes or one
// MLA latent plane), the engine's paging (tokens per page, pages per chain
// block), and how its paged KV memory is laid out (one tensor per layer or
// one cross-layer tensor), with the byte arithmetic of both: page, block and
// tensor sizes and the offset of every (layer, plane, page).
//
// It is the one statement of that shape. It imports nothing of the module,
// so an engine configures a store (package runtime) and the kernels address
// KV memory with it alone; the store's disk format (package objmap) builds
// its run layout on it. The copies outside Go are held to it by this
// package's tests: python/tutti's Geometry (TestPythonGeometryMatches) and
// the dtype and layout codes of the C ABI and the kernels
// (TestCHeaderEnumsMatch).
package kvshape
