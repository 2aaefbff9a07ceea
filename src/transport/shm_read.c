/*
 * Single-copy transfers between the members of a shared segment: a member
 * reads another's memory where it lies (process_vm_readv), or writes into
 * it (process_vm_writev), one copy where the segment takes two. The kernel
 * allows it only where this process may ptrace the other: the same user,
 * and neither Yama's ptrace_scope nor a container's seccomp profile
 * refusing. So the members agree once, together, before the first use:
 * every member posts the address of a word it holds, reads every other
 * member's and writes it back, and posts the size from which it wants
 * single-copy transfers (0: never, or it could not). They are used from the
 * largest posted size when no member posted 0; otherwise never, with the
 * reason logged.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>

#include "transport_private.h"

static const uint64_t probe_word = UINT64_C(0x68766420726561dd);
/* Written by the others (with the value it holds) to prove they can. */
static uint64_t probe_slot = UINT64_C(0x68766420726561dd);

/* One direction of a single-copy transfer: from (or, writing, into) member
 * r's memory at addr. */
static hvd_status transfer(struct net_shm *s, int r, void *here_at, uint64_t addr, size_t bytes,
                           bool writing) {
  pid_t pid = s->comm->records[r].pid;

  while (bytes > 0) {
    struct iovec here = {here_at, bytes}, there = {(void *)(uintptr_t)addr, bytes};
    ssize_t got = writing ? process_vm_writev(pid, &here, 1, &there, 1, 0)
                          : process_vm_readv(pid, &here, 1, &there, 1, 0);

    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return hvd_error(HVD_ERR_IO, "communicator %s: %s %zu bytes of rank %d's memory "
                                   "(pid %d): %s",
                       s->comm->scope, writing ? "writing" : "reading", bytes, r, (int)pid,
                       got < 0 ? strerror(errno) : "nothing moved");
    here_at = (char *)here_at + got;
    addr += (uint64_t)got;
    bytes -= (size_t)got;
  }
  return HVD_OK;
}

hvd_status net_shm_read(struct net_shm *s, int r, void *dst, uint64_t addr, size_t bytes) {
  return transfer(s, r, dst, addr, bytes, false);
}

hvd_status net_shm_write(struct net_shm *s, int r, uint64_t addr, const void *src, size_t bytes) {
  return transfer(s, r, (void *)src, addr, bytes, true);
}

/* Reads every other member's probe word and writes it back; false with
 * the reason in why. */
static bool can_reach_all(struct net_shm *s, unsigned b, char *why, size_t why_len) {
  for (int q = 0; q < s->size; q++) {
    uint64_t word = 0, at = net_shm_value(s, q, b);
    if (q == s->rank)
      continue;
    if (net_shm_read(s, q, &word, at, sizeof word) != HVD_OK ||
        net_shm_write(s, q, at, &probe_word, sizeof probe_word) != HVD_OK) {
      snprintf(why, why_len, "%s", hvd_last_error_message());
      hvd_error_clear();
      return false;
    }
    if (word != probe_word) {
      snprintf(why, why_len, "rank %d's probe read back as %#llx", q, (unsigned long long)word);
      return false;
    }
  }
  return true;
}

hvd_status net_shm_read_from(struct net_shm *s, size_t wanted, size_t *from) {
  char why[256] = "";
  uint64_t most = 0;
  int refused_by = -1;
  unsigned b;
  hvd_status st;

  if (s->read_state != 0) {
    *from = s->read_from;
    return HVD_OK;
  }
  b = net_shm_next_round(s);
  net_shm_post(s, b, (uint64_t)(uintptr_t)&probe_slot);
  if ((st = net_shm_barrier(s)) != HVD_OK)
    return st;
  if (wanted > 0 && !can_reach_all(s, b, why, sizeof why))
    wanted = 0;
  b = net_shm_next_round(s);
  net_shm_post(s, b, wanted);
  if ((st = net_shm_barrier(s)) != HVD_OK)
    return st;
  for (int q = 0; q < s->size; q++) {
    uint64_t v = net_shm_value(s, q, b);
    if (v == 0 && refused_by < 0)
      refused_by = q;
    most = v > most ? v : most;
  }
  s->read_from = refused_by < 0 ? (size_t)most : 0;
  s->read_state = 1;
  if (why[0] != 0)
    HVD_LOG_WARN("communicator %s: single-copy reads and writes refused here (%s; allow "
                 "ptrace between the ranks, e.g. kernel.yama.ptrace_scope=0): collectives copy "
                 "through the segment",
                 s->comm->scope, why);
  else if (refused_by >= 0 && s->rank == 0)
    HVD_LOG_INFO("communicator %s: no single-copy reads (rank %d cannot reach the others' "
                 "memory, or set HVD_SHM_SINGLE_COPY=never)",
                 s->comm->scope, refused_by);
  else if (s->read_from > 0 && s->rank == 0)
    HVD_LOG_INFO("communicator %s: single-copy reads from %zu bytes", s->comm->scope,
                 s->read_from);
  *from = s->read_from;
  return HVD_OK;
}
