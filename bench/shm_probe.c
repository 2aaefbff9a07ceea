/*
 * hvd-bench-shm: what moving bytes between processes of one host can reach
 * here, for choosing the mechanism of a shared-memory path (two copies
 * through a shared segment, or one copy with process_vm_readv), and the
 * memory-bandwidth limits a collective on one host is measured against.
 * A benchmark: it asserts nothing about timing.
 *
 *   memcpy   one thread copies a buffer (GB/s of bytes copied)
 *   add      one thread adds two float32 arrays into a third with hvd's
 *            kernel (ops_reduce; GB/s of one operand: the rate at which a
 *            reduction consumes a peer's data)
 *   shm      one thread copies into a memfd segment mapped shared and out
 *            of it again: the two copies of a staging segment, without the
 *            wait between them (GB/s of bytes delivered)
 *   cma      a child process reads its parent's buffer with
 *            process_vm_readv (one copy; needs ptrace permission: Yama's
 *            ptrace_scope, PR_SET_PTRACER, a container's seccomp)
 *
 * Each size is timed as hvd-bench -T does: a batch doubled until it takes
 * the given seconds, after one untimed pass that pages everything in.
 *
 *   hvd-bench-shm [--sizes 4K,64K,1M,16M,64M,256M] [-T 0.3]
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ops/ops.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

enum kind { K_MEMCPY, K_ADD, K_SHM, K_CMA };

struct bufs {
  char *a, *b, *c, *seg;
  pid_t parent;
};

/* One operation of `kind` on `bytes`; false (errno set) when it failed. */
static int once(enum kind kind, const struct bufs *m, size_t bytes) {
  struct iovec local, remote;
  switch (kind) {
  case K_MEMCPY:
    memcpy(m->b, m->a, bytes);
    return 1;
  case K_ADD:
    ops_reduce(m->c, m->a, m->b, bytes / sizeof(float), HVD_FLOAT32, HVD_SUM);
    return 1;
  case K_SHM:
    memcpy(m->seg, m->a, bytes);
    memcpy(m->b, m->seg, bytes);
    return 1;
  case K_CMA:
    local.iov_base = m->b;
    local.iov_len = bytes;
    remote.iov_base = m->a; /* the same address in the parent: the child is its fork */
    remote.iov_len = bytes;
    return process_vm_readv(m->parent, &local, 1, &remote, 1, 0) == (ssize_t)bytes;
  }
  return 0;
}

/* GB/s for kind at bytes, timed for about `seconds`; negative on failure. */
static double rate(enum kind kind, const struct bufs *m, size_t bytes, double seconds) {
  double t0, dt;
  long batch = 1;
  if (!once(kind, m, bytes))
    return -1;
  for (;;) {
    t0 = now_s();
    for (long k = 0; k < batch; k++)
      if (!once(kind, m, bytes))
        return -1;
    dt = now_s() - t0;
    if (dt >= seconds || batch >= (1L << 30))
      break;
    batch *= 2;
  }
  return (double)bytes * (double)batch / dt / 1e9;
}

static size_t parse_size(const char *t) {
  char *end;
  unsigned long long v = strtoull(t, &end, 10);
  switch (*end) {
  case 'K': v <<= 10; end++; break;
  case 'M': v <<= 20; end++; break;
  case 'G': v <<= 30; end++; break;
  default: break;
  }
  return *end == '\0' || *end == ',' ? (size_t)v : 0;
}

static int usage(void) {
  fprintf(stderr, "usage: hvd-bench-shm [--sizes LIST] [-T SECONDS]\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *list = "4K,64K,1M,16M,64M,256M";
  double seconds = 0.3;
  size_t sizes[32], nsizes = 0, max = 0;
  struct bufs m;
  int fd, ptrace_scope = -1;
  FILE *f;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc)
      list = argv[++i];
    else if (strcmp(argv[i], "-T") == 0 && i + 1 < argc && (seconds = atof(argv[++i])) > 0)
      continue;
    else
      return usage();
  }
  for (const char *p = list; *p != '\0' && nsizes < 32;) {
    size_t s = parse_size(p);
    if (s == 0 || s % 16 != 0)
      return usage();
    sizes[nsizes++] = s;
    max = s > max ? s : max;
    p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
  }
  m.a = aligned_alloc(64, max);
  m.b = aligned_alloc(64, max);
  m.c = aligned_alloc(64, max);
  fd = memfd_create("hvd-bench-shm", MFD_CLOEXEC);
  if (m.a == NULL || m.b == NULL || m.c == NULL || fd < 0 || ftruncate(fd, (off_t)max) != 0 ||
      (m.seg = mmap(NULL, max, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
    perror("hvd-bench-shm: setup");
    return 1;
  }
  for (size_t i = 0; i < max / sizeof(float); i++)
    ((float *)m.a)[i] = ((float *)m.b)[i] = (float)(i % 7);
  m.parent = getpid();
  /* Where Yama's ptrace_scope is 1, a process may name who may read it;
   * this benchmark's children are forks of it (hvd would name its peers). */
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  if ((f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) != NULL) {
    if (fscanf(f, "%d", &ptrace_scope) != 1)
      ptrace_scope = -1;
    fclose(f);
  }
  printf("# hvd-bench-shm: %.2f s per size; Yama ptrace_scope %s; uid %d\n", seconds,
         ptrace_scope < 0 ? "absent" : ptrace_scope == 0 ? "0" : ptrace_scope == 1 ? "1" : "2+",
         (int)getuid());
  printf("# %12s %10s %10s %10s %10s   (GB/s)\n", "size", "memcpy", "add", "shm", "cma");
  for (size_t k = 0; k < nsizes; k++) {
    double r[3], cma = -1;
    int fds[2];
    pid_t pid;
    for (int kind = K_MEMCPY; kind <= K_SHM; kind++)
      r[kind] = rate((enum kind)kind, &m, sizes[k], seconds);
    /* A child reads this process's buffer. */
    if (pipe(fds) != 0)
      return 1;
    if ((pid = fork()) == 0) {
      double v = rate(K_CMA, &m, sizes[k], seconds);
      if (v < 0)
        v = -(double)errno;
      if (write(fds[1], &v, sizeof(v)) != sizeof(v))
        _exit(1);
      _exit(0);
    }
    if (pid > 0 && read(fds[0], &cma, sizeof(cma)) != sizeof(cma))
      cma = -1;
    close(fds[0]);
    close(fds[1]);
    if (pid > 0)
      waitpid(pid, NULL, 0);
    printf("  %12zu %10.2f %10.2f %10.2f ", sizes[k], r[0], r[1], r[2]);
    if (cma >= 0)
      printf("%10.2f\n", cma);
    else
      printf("%10s   (process_vm_readv: %s)\n", "-", strerror((int)-cma));
  }
  munmap(m.seg, max);
  close(fd);
  free(m.a);
  free(m.b);
  free(m.c);
  return 0;
}
