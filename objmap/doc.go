// Package objmap is tutti's object map: the on-disk layout of a run for a
// KV shape (package kvshape's Geometry), where each run of saved chain
// blocks lives on disk, the free space of a striped, preallocated file
// pool, and the crash-safe metadata (run headers, a journal with group
// commit and checkpoints, recovery, fsck).
//
// # Objects and runs
//
// A run is a span of consecutive chain blocks (chunks) of one prefix saved
// together: a 4 KiB header, a table of one CRC32C per (layer, chunk) padded
// to 4 KiB, and one object per layer. Object l holds layer l of the whole
// run, chunk-major, then page, then plane (K and V of a page side by side).
// Where each lies is the store's Layout (layout.go), the one home of
// placement: a run spreads its objects over the devices, layer l on device
// (home + l) mod Width, in one extent of the same offset in each pool file
// of a stripe group, the header in its home file. Restoring the first k
// chunks of a run is therefore one read per layer (Layout.Span) of exactly
// those chunks (rounded out to 4 KiB), K and V included, on that layer's
// device, the same bytes from each device to within one object; each chunk
// read is verified on its own (RunInfo.VerifySpan, ChunkVerifier): a short
// shared prefix of a long run never reads the rest of the run. Keeping the chunk
// CRCs in RAM costs 4 bytes per (layer, chunk): 4 B per 2 MiB for
// Llama-3-70B at 512-token chunks. K and V are kept together, not in separate objects,
// because the engine always needs both for a layer before it can compute
// it: apart, every restore would issue twice the reads for the same bytes,
// and a K object without its V is useless. MLA models (Planes = 1) have one
// latent plane and the same layout. Objects start on 4 KiB boundaries
// (padded), so every read meets O_DIRECT alignment for any shape.
//
// # API the runtime uses
//
//	m, err := objmap.Open(objmap.Options{Dirs, CapacityBytes, Geometry: g})  // g a kvshape.Geometry; locks, recovers
//	m.Recovery()                          // RecoveryReport: objects, recovered, dropped (reasons)
//	m.Files()                             // []*uring.File, index = Location.File; register with the ring
//	lay := m.Layout()                     // where runs lie: lay.Where(place, layer, chunk) (device, file, offset)
//	m.Runs(func(objmap.RunInfo) bool)     // durable runs, to rebuild the prefix index
//	res, err := m.Allocate(chunks)        // []Reservation, partial when the pool is full; ErrNoSpace when empty
//	  ... write object l at lay.Where(res.Place(), l, 0) (uring, O_DIRECT) ...
//	err = m.Commit([]objmap.CommitRequest{{Res, Chain, ChunkCRCs}})  // header+table, fdatasync, journal: durable
//	m.Abort(res)                          // give an uncommitted reservation back
//	info, ok := m.Lookup(id)              // extent of a durable run, its ChunkCRCs
//	sp, err := lay.Span(info.Place(), layer, first, k) // one read per (layer, run): chunks [first, first+k), in m.Files()[sp.File] at sp.Off
//	err = info.VerifySpan(sp, buf)        // or a ChunkVerifier fed piece by piece
//	m.Trim(id, keep)                      // the run serves only its first keep chunks (its owner evicted the rest)
//	m.Free(id); m.Sync()                  // forget a run; its space is reusable once the free is durable
//	m.Failing()                           // the journal had no room for its last group (commits fail meanwhile)
//	m.Check()                             // fsck: read every payload, verify every chunk CRC32C
//	m.Close()
//
// Allocate, Commit, Abort, Trim, Free, Sync, Lookup, Runs, Stats and Check
// are safe for concurrent use; Close must not race with them.
// SimulateCrash is for crash tests only.
//
// # Commit protocol and recovery
//
// The caller writes a run's objects into its reservation and reaps the
// writes; Commit then writes the run's header (magic, version, geometry
// fingerprint, generation, run id, home file and offset, chain ids,
// per-layer CRC32C derived from the chunk CRCs, the chunk table's CRC,
// header CRC) and chunk table in one write to the home file, fdatasyncs
// every pool file the run spans, and appends a commit record
// to the journal, returning once a group commit made it durable. The
// journal record is the point of no return; the header lets recovery prove
// that the extent still holds that run. Open loads the checkpoint, replays
// the journal (a torn tail, what a crash in the last group commit leaves,
// is dropped: nothing in it was acknowledged), carves every run out of the
// free space and reads its header and chunk table (one read per run): a
// header that is missing, garbled, of another generation, run, place or
// geometry, or a table that fails the CRC the header names, drops the run
// (the reason is in the report) and its space is freed, durably, before
// anything is allocated; a header that cannot be read (EIO) keeps the run,
// unserved, for the next Open. Freed space is quarantined until its free
// record is durable (see allocator). Check additionally reads every
// payload and compares every chunk with the table and every object with
// the header's per-layer CRC.
//
// Trim and Free records are appended without waiting (the next group
// carries them; Close syncs them): after a clean Close every run is
// recovered with exactly the chunks it served (RunInfo.Kept), after a
// crash a run may come back with chunks trimmed or as a whole run freed
// shortly before, whose bytes are intact (a trim frees nothing, and freed
// space is reused only once its free record is durable).
//
// A journal group, checkpoint or next segment the file system has no room
// for (ENOSPC, EDQUOT) does not fail the store (journal.go,
// journalfail.go): a group is undone (the segment truncated back to its
// last durable record, so replay never meets it), the commits it carried
// fail with the error and their space is free again, its frees and trims
// are written with the next group; a checkpoint is retried by the next
// group. Commits work again as soon as a group fits. Stats counts each
// (JournalFailures, AbandonedCommits, CheckpointFailures). Any other
// journal I/O error fails the store closed, as before.
//
// A journal that is damaged rather than torn (missing, zeroed, a bad
// record followed by valid ones, a bad checkpoint; see journalread.go)
// loses no committed run: recovery rebuilds the index from the run headers
// in the pool (rebuild.go: the later of overlapping headers wins, every
// payload is verified), reports it (RecoveryReport.Rebuilt, JournalDamage)
// and, when writable, rewrites checkpoint and journal. A read-only Open
// (fsck) takes a shared lock, writes nothing and does the same in memory.
//
// # Choices
//
//   - Best-fit allocation in a per-file size-ordered B-tree (plus an
//     offset-ordered one for coalescing): runs vary from one chunk to
//     MaxRunChunks, and best-fit keeps large extents whole for long runs.
//   - Journal: buffered pwrite + fdatasync rather than O_DIRECT, so durable
//     bytes are never rewritten (no read-modify-write of a partial tail
//     block), with group commit: one fdatasync covers every record queued
//     while the previous one ran, bounded by Options.MaxGroupBytes.
//   - Checkpoints bound the journal: past Options.SegmentBytes the group
//     leader writes all runs to a temp file, fsyncs, renames, fsyncs the
//     directory, then starts the next segment and deletes the old one.
//   - Generation is the store's open count (journaled at each Open); run ids
//     increase monotonically and are never reused.
//   - Trims are records of their own (RecTrim) rather than a rewrite of the
//     run: the header stays the commit's, so a rebuild still verifies it,
//     and a trim costs one small record. A store whose journal may hold
//     them has MANIFEST version 2, so an older build refuses it by name
//     instead of taking the records for damage; a writable Open upgrades a
//     version 1 store.
//   - Placement (layout.go): a run spreads its layers over Width devices
//     (manifest version 3 records run_width; RunWidth chooses it: every
//     directory for a real model) rather than lying whole on one, so a
//     restore of a few blocks, one run or less, reads every device and not
//     one (a short restore's time was one device reading the whole block).
//     The extent is the same in every file of the run's stripe group, so a
//     run is still one (file, offset, length) in the journal, the
//     checkpoint and its header, recovery and rebuild carve and resolve
//     runs per group, and the allocator keeps one free space per group.
//     The cost: each file of the group keeps ceil(Layers/Width) object
//     slots and the header region, so Layers mod Width slots stay empty
//     (RunWidth keeps them within a third of the layers; none for 32 or 80
//     layers over 2, 4 or 8 devices, 3 of 64 for DeepSeek-V3's 61 over 8).
//     A store made before version 3 (width 1: each run whole in its home
//     file, byte for byte the same rule) is read as it is, and says so
//     (RecoveryReport.LayoutNote); its manifest stays at version 2, as does
//     any store of width 1, so older builds read it too, and a version 2
//     reader refuses a spread store by its version.
//   - Files are created 0600 and directories 0700; each directory is
//     flock'ed (LOCK holds the owner's pid for the error of a second open),
//     exclusively by a writer, shared by a read-only checker. A failed Open
//     removes what it created.
//   - The store records its geometry and pool shape in a MANIFEST in each
//     directory, so fsck needs only the directories.
package objmap
