// Command rwbench measures how much concurrent writes cut read bandwidth on a
// device, and the reverse: the ReadShareUnderWrites and WriteShareUnderReads
// of sched.DeviceProfile. It runs devbench (O_DIRECT through io_uring) four
// times: reads alone, writes alone, reads while a second process writes,
// writes while a second process reads; each on its own file in -dir.
//
//	go run ./sched/internal/rwbench -dir /var/tmp -bs 1m -qd 16 -runtime 3s
//
// The second process is this program re-executed with -role, killed (by its
// own pid) once the measured phase ends. The two test files are removed.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/tutti-io/tutti/devbench"
)

func main() {
	dir := flag.String("dir", os.TempDir(), "directory on the device to measure (O_DIRECT capable)")
	bs := flag.Int("bs", 1<<20, "block size, bytes")
	qd := flag.Int("qd", 16, "queue depth of each side")
	runtime := flag.Duration("runtime", 3*time.Second, "measuring time per phase")
	size := flag.Int64("size", 1<<30, "test file size, bytes (each of two files)")
	role := flag.String("role", "", "internal: randread or randwrite, run until killed")
	flag.Parse()

	readPath := filepath.Join(*dir, fmt.Sprintf("rwbench-read-%d.dat", os.Getpid()))
	writePath := filepath.Join(*dir, fmt.Sprintf("rwbench-write-%d.dat", os.Getpid()))
	run := func(path, op string, dur time.Duration, keep bool) (devbench.Row, error) {
		rows, err := devbench.Run(context.Background(), devbench.Config{Path: path, BlockSizes: []int{*bs},
			QueueDepths: []int{*qd}, Engines: []string{"uring"}, Ops: []string{op}, Runtime: dur,
			SizeBytes: *size, Keep: keep, Seed: 1})
		if err != nil {
			return devbench.Row{}, fmt.Errorf("%s on %s: %w", op, path, err)
		}
		if len(rows) != 1 {
			return devbench.Row{}, fmt.Errorf("%s on %s: %d rows", op, path, len(rows))
		}
		return rows[0], nil
	}
	if *role != "" {
		// Background load: the file path comes as the only argument; run long,
		// the parent kills us when its phase ends.
		if _, err := run(flag.Arg(0), *role, time.Hour, true); err != nil {
			fmt.Fprintln(os.Stderr, "rwbench background:", err)
			os.Exit(1)
		}
		return
	}
	cleanup = []string{readPath, writePath}
	defer removeFiles()
	// Alone (these also create both files, kept for the next phases).
	readAlone, err := run(readPath, "randread", *runtime, true)
	check(err)
	writeAlone, err := run(writePath, "randwrite", *runtime, true)
	check(err)
	with := func(measure, measurePath, background, backgroundPath string) devbench.Row {
		cmd := exec.Command(os.Args[0], "-role", background, "-bs", fmt.Sprint(*bs), "-qd", fmt.Sprint(*qd),
			"-size", fmt.Sprint(*size), backgroundPath)
		cmd.Stderr = os.Stderr
		check(cmd.Start())
		time.Sleep(500 * time.Millisecond) // let the background reach steady state
		row, err := run(measurePath, measure, *runtime, true)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		check(err)
		return row
	}
	readWith := with("randread", readPath, "randwrite", writePath)
	writeWith := with("randwrite", writePath, "randread", readPath)
	fmt.Printf("device dir %s, O_DIRECT io_uring, bs %d, qd %d each side, %v per phase\n", *dir, *bs, *qd, *runtime)
	fmt.Printf("reads alone        %8.1f MB/s\n", readAlone.BytesPerS/1e6)
	fmt.Printf("reads under writes %8.1f MB/s  ReadShareUnderWrites = %.2f\n", readWith.BytesPerS/1e6, readWith.BytesPerS/readAlone.BytesPerS)
	fmt.Printf("writes alone       %8.1f MB/s\n", writeAlone.BytesPerS/1e6)
	fmt.Printf("writes under reads %8.1f MB/s  WriteShareUnderReads = %.2f\n", writeWith.BytesPerS/1e6, writeWith.BytesPerS/writeAlone.BytesPerS)
}

var cleanup []string

func removeFiles() {
	for _, p := range cleanup {
		os.Remove(p)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "rwbench:", err)
		removeFiles()
		os.Exit(1)
	}
}
