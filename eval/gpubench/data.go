package gpubench

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// writeData writes every layer's object with internal/kvdata content where
// b.lay places its pieces, through the page cache (so the page-cache path
// later reads warm data), then fsyncs. A regular file is cut to the bytes
// its device holds; with reuse, files of exactly those bytes whose
// sidecar (path+".layout") names this model, content and layout are kept.
func (b *gpuBench) writeData(reuse bool) error {
	t0 := time.Now()
	need := b.lay.devBytes()
	fresh := !reuse
	var regular []bool
	for i, p := range b.paths {
		st, err := os.Stat(p)
		isDev := err == nil && st.Mode()&os.ModeDevice != 0
		isReg := err != nil || st.Mode().IsRegular()
		regular = append(regular, isReg)
		if !isReg || err != nil || st.Size() != need[i] {
			fresh = true
		} else if key, kerr := os.ReadFile(p + ".layout"); kerr != nil || string(key) != b.layoutKey(i) {
			fresh = true
		}
		flags := unix.O_RDWR
		if !isDev {
			flags |= unix.O_CREAT
		}
		bf, err := uring.OpenFile(p, flags, 0o644)
		if err != nil {
			return err
		}
		df, err := uring.OpenFile(p, unix.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			bf.Close()
			return err
		}
		b.buffered = append(b.buffered, bf)
		b.direct = append(b.direct, df)
	}
	if !fresh {
		b.logf("reusing %v\n", b.paths)
		return nil
	}
	for i, p := range b.paths {
		if !regular[i] {
			continue
		}
		// the sidecar goes first and comes back last: a file cut short by a
		// crash is never reused
		if err := os.Remove(p + ".layout"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := unix.Ftruncate(int(b.buffered[i].FD), need[i]); err != nil {
			return fmt.Errorf("sizing %s to %d bytes: %w", p, need[i], err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, b.g.Layers)
	work := make(chan int)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf, err := uring.AllocBuffer(int(b.lay.objStride(b.lay.runPages))) // the first piece is the largest
			if err != nil {
				errs <- err
				return
			}
			defer buf.Free()
			var ps []layoutPiece
			for l := range work {
				ps = b.lay.pieces(l, ps[:0])
				for _, pc := range ps {
					n, padded := int64(pc.pages)*b.g.PageBytesPerLayer(), b.lay.objStride(pc.pages)
					if err := testkit.FillObject(buf.Bytes()[:n], b.g, b.seed, l, pc.first, pc.pages); err != nil {
						errs <- err
						return
					}
					clear(buf.Bytes()[n:padded]) // a longer piece's bytes before
					f := b.buffered[pc.dev]
					if got, err := unix.Pwrite(int(f.FD), buf.Bytes()[:padded], pc.off); err != nil || int64(got) != padded {
						errs <- fmt.Errorf("writing layer %d pages [%d,+%d) at %d of %s: %d of %d bytes: %v", l, pc.first, pc.pages, pc.off, f.Path, got, padded, err)
						return
					}
				}
			}
		}()
	}
	for l := 0; l < b.g.Layers && b.ctx.Err() == nil; l++ {
		work <- l
		b.tell("writing data layers", l, b.g.Layers)
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	if err := b.ctx.Err(); err != nil {
		return err // the files are left without their sidecars: never reused
	}
	b.tell("writing data layers", b.g.Layers, b.g.Layers)
	for _, f := range b.buffered {
		if err := unix.Fsync(int(f.FD)); err != nil {
			return fmt.Errorf("fsync %s: %w", f.Path, err)
		}
	}
	for i, p := range b.paths {
		if regular[i] {
			if err := os.WriteFile(p+".layout", []byte(b.layoutKey(i)), 0o644); err != nil {
				return err
			}
		}
	}
	d := time.Since(t0)
	b.logf("wrote %.2f GiB in %.1f s (%.2f GB/s, buffered + fsync)\n", float64(b.totalBytes())/(1<<30), d.Seconds(), float64(b.totalBytes())/d.Seconds()/1e9)
	return nil
}

// layoutKey names what device i of the data files holds: --reuse keeps a
// file only when its sidecar says exactly this.
func (b *gpuBench) layoutKey(i int) string {
	return fmt.Sprintf("tutti gpubench data v1: model %s, %+v, %d pages, content blocks %d.., device %d of %d, %s\n",
		b.model, b.g, b.pages, b.seed, i, len(b.paths), b.lay)
}

func (b *gpuBench) closeFiles() {
	for _, f := range append(b.direct, b.buffered...) {
		f.Close()
	}
}
