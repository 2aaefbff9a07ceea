/*
 * The allocation counter of alloc_count.h. glibc lets a program replace
 * malloc, free, calloc and realloc (and the aligned forms): the
 * executable's definitions win over libc's for every caller, libc's own
 * internal calls included, and glibc's implementations stay reachable
 * under their __libc_ names. Only allocations are counted; free is
 * defined so that memory from either side is released by the same
 * allocator.
 */
#include "alloc_count.h"

#if ALLOC_COUNT_AVAILABLE

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t size);
void __libc_free(void *p);
void *__libc_memalign(size_t alignment, size_t size);
void *__libc_valloc(size_t size);
void *__libc_pvalloc(size_t size);

enum { TRACES = 16, FRAMES = 32 };

struct trace {
  long tid;
  size_t bytes;
  void *frames[FRAMES];
  atomic_int depth; /* written last: 0 while the stack is being recorded */
};

static atomic_bool counting;
static atomic_uint_fast64_t counted;
static struct trace traces[TRACES];
/* This thread is recording a stack: the unwinder's own allocations are
 * counted but not traced. */
static _Thread_local bool recording;

__attribute__((noinline)) static void count(size_t bytes) {
  uint_fast64_t n;
  struct trace *t;

  if (!atomic_load_explicit(&counting, memory_order_relaxed))
    return;
  n = atomic_fetch_add(&counted, 1);
  if (n >= TRACES || recording)
    return;
  recording = true;
  t = &traces[n];
  t->tid = syscall(SYS_gettid);
  t->bytes = bytes;
  atomic_store(&t->depth, backtrace(t->frames, FRAMES));
  recording = false;
}

void *malloc(size_t size) {
  count(size);
  return __libc_malloc(size);
}

void *calloc(size_t n, size_t size) {
  count(n * size);
  return __libc_calloc(n, size);
}

void *realloc(void *p, size_t size) {
  count(size);
  return __libc_realloc(p, size);
}

void *reallocarray(void *p, size_t n, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(n, size, &bytes)) {
    errno = ENOMEM;
    return NULL;
  }
  return realloc(p, bytes);
}

void free(void *p) { __libc_free(p); }

void *memalign(size_t alignment, size_t size) {
  count(size);
  return __libc_memalign(alignment, size);
}

void *aligned_alloc(size_t alignment, size_t size) { return memalign(alignment, size); }

int posix_memalign(void **out, size_t alignment, size_t size) {
  void *p;
  if (alignment % sizeof(void *) != 0 || (alignment & (alignment - 1)) != 0 || alignment == 0)
    return EINVAL;
  if ((p = memalign(alignment, size)) == NULL)
    return ENOMEM;
  *out = p;
  return 0;
}

void *valloc(size_t size) {
  count(size);
  return __libc_valloc(size);
}

void *pvalloc(size_t size) {
  count(size);
  return __libc_pvalloc(size);
}

void alloc_count_init(void) {
  void *frames[2];
  backtrace(frames, 2);
}

void alloc_count_start(void) {
  for (int i = 0; i < TRACES; i++)
    atomic_store(&traces[i].depth, 0);
  atomic_store(&counted, 0);
  atomic_store(&counting, true);
}

uint64_t alloc_count_stop(void) {
  atomic_store(&counting, false);
  return atomic_load(&counted);
}

static void print_frame(FILE *out, void *frame) {
  Dl_info info;
  /* A return address points past its call: one byte back is inside it. */
  const char *at = (const char *)frame - 1;
  if (dladdr(at, &info) == 0 || info.dli_fname == NULL) {
    fprintf(out, "    %p\n", frame);
    return;
  }
  fprintf(out, "    %s +%#lx %s\n", info.dli_fname, (unsigned long)(at - (char *)info.dli_fbase),
          info.dli_sname != NULL ? info.dli_sname : "");
}

void alloc_count_report(FILE *out) {
  uint64_t n = atomic_load(&counted);
  for (uint64_t i = 0; i < n && i < TRACES; i++) {
    const struct trace *t = &traces[i];
    int depth = atomic_load(&t->depth);
    fprintf(out, "  allocation %llu: %zu bytes on %s %ld\n", (unsigned long long)i + 1, t->bytes,
            t->tid == getpid() ? "the main thread" : "thread", t->tid);
    for (int k = 1; k < depth; k++) /* frames[0] is count() */
      print_frame(out, t->frames[k]);
  }
  if (n > TRACES)
    fprintf(out, "  (%llu more)\n", (unsigned long long)(n - TRACES));
}

#else /* !ALLOC_COUNT_AVAILABLE: the test skips; these keep it linking */

void alloc_count_init(void) {}
void alloc_count_start(void) {}
uint64_t alloc_count_stop(void) { return 0; }
void alloc_count_report(FILE *out) { (void)out; }

#endif
