// Memory read speed in the order the kernel's decode tiles read, without the kernel
// (issue 29, docs/benchmarks.md "Round 9"):
//
//   cc -O2 -mavx512f bench/read_order.c -o /tmp/read_order && /tmp/read_order 576
//
// Sums three 32 MiB buffers, one thread, four ways, for rows of the given bytes: in
// order; 8 rows interleaved 64 bytes at a time (a decode tile's order); interleaved with
// each tile's bytes prefetched into L1, then into L2, `ahead` tiles on (default 2).
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kCopies = 3, kRows = 8 };
static const long kBytes = 32L << 20;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// hint: -1 no prefetch; else the _MM_HINT_ to prefetch the tile `ahead` tiles on with.
static double interleaved(char** bufs, long row_bytes, int ahead, int hint, int* sink) {
  __m512i acc = _mm512_setzero_si512();
  double started = now();
  for (int b = 0; b < kCopies; ++b) {
    long rows = kBytes / row_bytes;
    for (long n = 0; n + kRows <= rows; n += kRows) {
      const char* tile = bufs[b] + n * row_bytes;
      const char* next = tile + ahead * kRows * row_bytes;
      long line = 0;
      for (long at = 0; at < row_bytes; at += 64) {
        for (int j = 0; j < kRows && hint >= 0; ++j, ++line) {
          if (hint == _MM_HINT_T0) {
            _mm_prefetch(next + 64 * line, _MM_HINT_T0);
          } else {
            _mm_prefetch(next + 64 * line, _MM_HINT_T1);
          }
        }
        for (int j = 0; j < kRows; ++j) {
          acc = _mm512_add_epi32(acc, _mm512_loadu_si512(tile + j * row_bytes + at));
        }
      }
    }
  }
  double seconds = now() - started;
  *sink += _mm512_reduce_add_epi32(acc);
  return kCopies * kBytes / seconds / 1e9;
}

static double in_order(char** bufs, int* sink) {
  __m512i acc = _mm512_setzero_si512();
  double started = now();
  for (int b = 0; b < kCopies; ++b) {
    for (long i = 0; i < kBytes; i += 64) {
      acc = _mm512_add_epi32(acc, _mm512_load_si512(bufs[b] + i));
    }
  }
  double seconds = now() - started;
  *sink += _mm512_reduce_add_epi32(acc);
  return kCopies * kBytes / seconds / 1e9;
}

int main(int argc, char** argv) {
  long row_bytes = argc > 1 ? atol(argv[1]) : 576;
  int ahead = argc > 2 ? atoi(argv[2]) : 2;
  if (row_bytes < 64 || row_bytes % 32 != 0) {
    fprintf(stderr, "row bytes: a multiple of 32, at least 64\n");
    return 2;
  }
  char* bufs[kCopies];
  for (int b = 0; b < kCopies; ++b) {
    // Slack: a row that is not a whole number of lines reads a little past its last one.
    bufs[b] = aligned_alloc(64, kBytes + 4096);
    memset(bufs[b], 1, kBytes + 4096);
  }
  int sink = 0;
  for (int round = 0; round < 3; ++round) {
    printf("rows of %ld bytes: in order %.1f GB/s, interleaved %.1f, prefetched into L1 %.1f,"
           " into L2 %.1f\n",
           row_bytes, in_order(bufs, &sink), interleaved(bufs, row_bytes, ahead, -1, &sink),
           interleaved(bufs, row_bytes, ahead, _MM_HINT_T0, &sink),
           interleaved(bufs, row_bytes, ahead, _MM_HINT_T1, &sink));
  }
  return sink == 42;  // keeps the sums alive
}
