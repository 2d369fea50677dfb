// Package runtime is the Go API an LLM serving engine links to keep its KV
// cache on local SSDs and restore it faster than recomputing it.
//
// An engine opens a Store over one or more directories, registers its paged
// KV memory, and then per request: Lookup (how many leading chain blocks are
// cached), Load (restore them into the request's pages, layer by layer,
// asynchronously), Save (store the blocks that are new, asynchronously).
//
//	s, err := runtime.Open(runtime.Config{Dirs: dirs, CapacityBytes: capBytes,
//		Geometry: g, Layout: objmap.LayoutPerLayer, NumPages: numPages})
//	err = s.RegisterKV(runtime.KVMemory{Layers: perLayerTensors})
//	n := s.Lookup(chain)                 // cached leading blocks, no I/O
//	l, err := s.Load(chain, blockTable)  // restore in the background
//	err = l.WaitLayer(0)                 // before layer 0's attention
//	err = l.Wait(); restored := l.Blocks() // final; recompute the rest
//	sv, err := s.Save(chain, blockTable) // pages unchanged until <-sv.Gathered()
//	err = s.WaitSaves(); err = s.Close()
//
// See docs/integration.md for costs and what is asynchronous.
package runtime
