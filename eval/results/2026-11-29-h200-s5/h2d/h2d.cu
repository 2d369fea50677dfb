// h2d: host-to-device copies from pinned memory at a paced rate (GB/s, 0 = as fast as possible)
// for a number of seconds; prints the achieved rate. A load generator for run 19.
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
int main(int argc, char **argv) {
  double target = argc > 1 ? atof(argv[1]) : 0, secs = argc > 2 ? atof(argv[2]) : 2;
  const size_t chunk = 64 << 20, total = 1ull << 30;
  void *h, *d;
  if (cudaHostAlloc(&h, total, cudaHostAllocDefault) || cudaMalloc(&d, total)) { printf("alloc failed\n"); return 1; }
  memset(h, 1, total);
  cudaStream_t s;
  cudaStreamCreate(&s);
  auto t0 = std::chrono::steady_clock::now();
  size_t n = 0;
  for (;;) {
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (el >= secs) break;
    if (target > 0) {
      double due = n * (double)chunk / (target * 1e9);
      if (due > el) { std::this_thread::sleep_for(std::chrono::duration<double>(due - el)); continue; }
    }
    size_t off = (n * chunk) % total;
    cudaMemcpyAsync((char *)d + off, (char *)h + off, chunk, cudaMemcpyHostToDevice, s);
    cudaStreamSynchronize(s);
    n++;
  }
  double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("h2d target %.1f GB/s: %.2f GB/s over %.2f s\n", target, n * (double)chunk / el / 1e9, el);
  return 0;
}
