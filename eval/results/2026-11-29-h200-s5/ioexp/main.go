// ioexp: one io_uring over several block devices, the GPU path's read pattern
// (pieces of -run consecutive 1 MiB reads per device, window, batch waits),
// into a destination of -span MiB; or one ring per device (-rings).
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

func iouWorkers() int {
	ts, _ := filepath.Glob("/proc/self/task/*/comm")
	n := 0
	for _, t := range ts {
		b, _ := os.ReadFile(t)
		if strings.HasPrefix(string(b), "iou-wrk") {
			n++
		}
	}
	return n
}

func drive(files []*uring.File, window, run, batch, spanMiB int, random bool, secs float64, sizeMiB int) (int64, int, error) {
	runtime.LockOSThread()
	r, err := uring.New(uring.Config{Entries: 1024, SQThreadCPU: -1})
	if err != nil {
		return 0, 0, err
	}
	defer r.Close()
	span := max(spanMiB, window)
	buf, err := uring.AllocBuffer(span << 20)
	if err != nil {
		return 0, 0, err
	}
	defer buf.Free()
	huge := buf.HugeNow()
	if !huge {
		fmt.Println("WARNING: buffer not on huge pages")
	}
	comps := make([]uring.Completion, window)
	free := []int{}
	var firstErr error
	for i := range comps {
		free = append(free, i)
		comps[i].UserData = uint64(i)
		comps[i].Callback = func(c *uring.Completion) {
			if c.Err != nil && firstErr == nil {
				firstErr = c.Err
			}
			free = append(free, int(c.UserData))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	seq, dst := 0, 0
	var done int64
	maxW := 0
	t0 := time.Now()
	devOff := make([]int, len(files))
	for time.Since(t0).Seconds() < secs && firstErr == nil {
		for len(free) > 0 {
			k := free[len(free)-1]
			free = free[:len(free)-1]
			dev := (seq / run) % len(files)
			var off uint64
			if random {
				off = uint64(rng.IntN(sizeMiB)) << 20
			} else {
				off = uint64(devOff[dev]%sizeMiB) << 20
				devOff[dev]++
			}
			comps[k].PrepRead(files[dev], buf.Addr()+uintptr(dst<<20), 1<<20, off)
			dst = (dst + 1) % span
			if err := r.Submit(&comps[k]); err != nil {
				return 0, 0, err
			}
			seq++
		}
		before := len(free)
		if err := r.Flush(min(batch, max(1, r.InFlight()/4))); err != nil {
			return 0, 0, err
		}
		done += int64(len(free) - before)
		if w := iouWorkers(); w > maxW {
			maxW = w
		}
	}
	for r.InFlight() > 0 {
		r.Flush(1)
	}
	return done, maxW, firstErr
}

func main() {
	devs := flag.String("devs", "", "")
	window := flag.Int("window", 256, "in flight per ring")
	run := flag.Int("run", 32, "reads per device piece")
	batch := flag.Int("batch", 32, "flush wait")
	secs := flag.Float64("secs", 2, "")
	span := flag.Int("span", 0, "destination MiB per ring")
	rings := flag.Int("rings", 1, "1: one ring over all devices; N = devices: one ring per device")
	random := flag.Bool("random", false, "random offsets")
	size := flag.Int("size", 1024, "MiB of each device read")
	flag.Parse()
	var files []*uring.File
	for _, d := range strings.Split(*devs, ",") {
		f, err := uring.OpenFile(d, unix.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			panic(err)
		}
		files = append(files, f)
	}
	groups := [][]*uring.File{files}
	if *rings > 1 {
		groups = nil
		for _, f := range files {
			groups = append(groups, []*uring.File{f})
		}
	}
	var wg sync.WaitGroup
	var total int64
	var mu sync.Mutex
	maxW := 0
	t0 := time.Now()
	for _, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, w, err := drive(g, *window/len(groups), *run, *batch, *span, *random, *secs, *size)
			if err != nil {
				fmt.Println("error:", err)
			}
			mu.Lock()
			total += n
			maxW = max(maxW, w)
			mu.Unlock()
		}()
	}
	wg.Wait()
	d := time.Since(t0).Seconds()
	fmt.Printf("rings %d window %d run %d batch %d span %d random %v: %.2f GB/s, iou-wrk max %d\n", len(groups), *window, *run, *batch, *span, *random, float64(total)*(1<<20)/d/1e9, maxW)
}
