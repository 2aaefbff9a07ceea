/*
 * Counting heap allocations in a test process: alloc_count.c defines
 * malloc and its relatives, forwarding to glibc's, so every allocation of
 * the process (libhvd and the libraries it uses, on every thread) passes
 * through it. Counting is switched on and off around the code measured;
 * the first allocations counted keep their call stacks, so a failing test
 * can say where they come from.
 *
 * Sanitizers that replace the allocator themselves (AddressSanitizer,
 * ThreadSanitizer) leave no room for another: there ALLOC_COUNT_AVAILABLE
 * is 0, nothing is defined and the tests skip.
 */
#ifndef HVD_TEST_ALLOC_COUNT_H
#define HVD_TEST_ALLOC_COUNT_H

#include <stdint.h>
#include <stdio.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(__GLIBC__)
#define ALLOC_COUNT_AVAILABLE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||                       \
    __has_feature(memory_sanitizer)
#define ALLOC_COUNT_AVAILABLE 0
#endif
#endif
#ifndef ALLOC_COUNT_AVAILABLE
#define ALLOC_COUNT_AVAILABLE 1
#endif

/* Loads what recording a call stack needs (the unwinder allocates the
 * first time): call before the first alloc_count_start. */
void alloc_count_init(void);
/* Counts from now on, from zero, on every thread. */
void alloc_count_start(void);
/* Stops counting; the allocations counted since alloc_count_start. */
uint64_t alloc_count_stop(void);
/* Where the first allocations counted came from: thread, size and call
 * stack of each, as module+offset (addr2line -f -i -e MODULE OFFSET). */
void alloc_count_report(FILE *out);

#endif
