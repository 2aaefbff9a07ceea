/*
 * Collectives in shared memory, for communicators whose ranks share a host
 * (net_shm_get). Designed for memory rather than as messages: every rank
 * writes what it contributes once into its own buffer of the segment, and
 * the others read it where it lies.
 *
 * Every operation is a sequence of rounds; a round writes into buffer b of
 * the rank's pair, meets the others at a barrier, then reads. Rounds
 * alternate the two buffers, so the next round's writes never race the
 * reads of this one, and rounds do not need a second barrier to end.
 * - allreduce: a round takes up to a buffer of the input; rank r reduces
 *   share r of it straight from every rank's buffer, in rank order (so the
 *   bits are the same whoever computes them), into its own buffer; after a
 *   second barrier every rank copies every share out. Each element's result
 *   is computed once. Small buffers (SMALL_BYTES) skip the second barrier.
 * - reducescatter: each rank lays out its input's pieces for every share
 *   side by side; rank r reduces its piece from every buffer into its output.
 * - allgather, broadcast, alltoall: copies in, barrier, copies out.
 * Large buffers take several rounds of HVD_SHM_BUFFER_BYTES; the data of a
 * round stays in the cache between the write and the reads, and copies
 * into outputs larger than the cache stream past it (stream.c).
 * Allgather, broadcast and allreduce may instead read the
 * others' memory where it lies (single-copy reads): member 0 times both
 * ways and every member takes its choice (shm_choice.c).
 */
#include <string.h>

#include "ops_private.h"

/* Reductions go through a private block of this size when a rank reduces
 * more than two inputs into a buffer that is also one of them. Allreduces
 * up to SMALL_BYTES take one barrier: every rank reduces the whole buffer
 * from every rank's copy, in rank order (so all get the same bits), which
 * costs less than a second barrier. */
enum { BLOCK_BYTES = 16 * 1024, SMALL_BYTES = 8 * 1024, READ_BLOCK_BYTES = 256 * 1024 };

hvd_status ops_shm_group(struct ops_ctx *o, struct net_comm *c, struct net_shm **out) {
  *out = NULL;
  if (!o->t.shm || net_comm_size(c) < 2 || net_comm_size(c) > OPS_SHM_MAX_MEMBERS)
    return HVD_OK;
  return net_shm_get(c, o->t.shm_buffer_bytes, 0, out);
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* The largest of n counts: every rank knows them all, so all take the
 * same number of rounds, as many as the longest part needs. */
static size_t longest(const size_t *counts, int n) {
  size_t most = 0;
  for (int q = 0; q < n; q++)
    most = counts[q] > most ? counts[q] : most;
  return most;
}

/* Elements left from lo within a part of `count`, at most cap. */
static size_t piece(size_t count, size_t lo, size_t cap) {
  return lo < count ? min_size(count - lo, cap) : 0;
}

/* dst = src[0] op src[1] op ... op src[n-1], in that order; dst may be
 * one of the sources (then a private block holds the partial results). */
static hvd_status reduce_sources(struct ops_ctx *o, char *dst, char *const *src, int n,
                                 size_t count, hvd_dtype dtype, hvd_reduce_op op) {
  size_t esize = hvd_dtype_size(dtype);
  size_t block = BLOCK_BYTES / esize;
  char *tmp;

  if (n == 2) {
    ops_reduce(dst, src[0], src[1], count, dtype, op);
    return HVD_OK;
  }
  if ((tmp = ops_scratch(o, SCRATCH_TMP, BLOCK_BYTES)) == NULL)
    return hvd_error_status();
  for (size_t i = 0; i < count; i += block) {
    size_t len = min_size(block, count - i), at = i * esize;
    ops_reduce(tmp, src[0] + at, src[1] + at, len, dtype, op);
    for (int q = 2; q < n - 1; q++)
      ops_reduce(tmp, tmp, src[q] + at, len, dtype, op);
    ops_reduce(dst + at, tmp, src[n - 1] + at, len, dtype, op);
  }
  return HVD_OK;
}

static hvd_status small_allreduce(struct ops_ctx *o, struct net_shm *s, const void *in, void *out,
                                  size_t count, hvd_dtype dtype, hvd_reduce_op op) {
  int n = net_comm_size(net_shm_comm(s)), r = net_comm_rank(net_shm_comm(s));
  unsigned b = net_shm_next_round(s);
  char *src[OPS_SHM_MAX_MEMBERS];
  hvd_status st;

  for (int q = 0; q < n; q++)
    src[q] = net_shm_buffer(s, q, b);
  memcpy(src[r], in, count * hvd_dtype_size(dtype));
  if ((st = net_shm_barrier(s)) != HVD_OK)
    return st;
  if ((st = reduce_sources(o, out, src, n, count, dtype, op)) != HVD_OK)
    return net_shm_fail(s, st);
  return HVD_OK;
}

static hvd_status copy_allreduce(struct ops_ctx *o, struct net_shm *s, const void *in, void *out,
                                 size_t count, hvd_dtype dtype, hvd_reduce_op op);

/* Every member posts where its input lies, the others read it from there,
 * and a second barrier keeps it in place until all have. */
static hvd_status post_address(struct net_shm *s, const void *at, unsigned *b) {
  *b = net_shm_next_round(s);
  net_shm_post(s, *b, (uint64_t)(uintptr_t)at);
  return net_shm_barrier(s);
}

static hvd_status all_have_read(struct net_shm *s, hvd_status st) {
  if (st != HVD_OK)
    return net_shm_fail(s, st);
  (void)net_shm_next_round(s);
  return net_shm_barrier(s);
}

/* With single-copy reads (in is not out): every rank reads every other's
 * input, a block at a time, and reduces the whole buffer in rank order (so
 * all get the same bits). Nothing goes through the segment: where the
 * inputs sit in their owners' caches, this reads each once. */
static hvd_status read_allreduce(struct ops_ctx *o, struct net_shm *s, const char *in, char *out,
                                 size_t count, hvd_dtype dtype, hvd_reduce_op op) {
  int n = net_comm_size(net_shm_comm(s)), r = net_comm_rank(net_shm_comm(s));
  size_t esize = hvd_dtype_size(dtype), block = READ_BLOCK_BYTES / esize;
  char *tmp = ops_scratch(o, SCRATCH_READS, 2 * READ_BLOCK_BYTES);
  unsigned b;
  hvd_status st;

  if (tmp == NULL)
    return net_shm_fail(s, hvd_error_status());
  if ((st = post_address(s, in, &b)) != HVD_OK)
    return st;
  for (size_t lo = 0; lo < count && st == HVD_OK; lo += block) {
    size_t len = min_size(block, count - lo), at = lo * esize;
    const char *x[2];
    for (int q = 0; q < n && st == HVD_OK; q++) {
      const char *src = in + at;
      if (q != r) {
        src = tmp + (size_t)(q & 1) * READ_BLOCK_BYTES;
        st = net_shm_read(s, q, (char *)src, net_shm_value(s, q, b) + at, len * esize);
      }
      if (q < 2)
        x[q] = src;
      if (st == HVD_OK && q == 1)
        ops_reduce(out + at, x[0], x[1], len, dtype, op);
      else if (st == HVD_OK && q > 1)
        ops_reduce(out + at, out + at, src, len, dtype, op);
    }
  }
  return all_have_read(s, st);
}

hvd_status ops_shm_allreduce(struct ops_ctx *o, struct net_shm *s, const void *in, void *out,
                             size_t count, hvd_dtype dtype, hvd_reduce_op op) {
  int n = net_comm_size(net_shm_comm(s));
  size_t bytes = count * hvd_dtype_size(dtype);
  struct ops_shm_way way;
  hvd_status st;

  if (bytes <= SMALL_BYTES)
    return copy_allreduce(o, s, in, out, count, dtype, op);
  if ((st = ops_shm_choose(o, s, &way, OPS_SHM_ALLREDUCE, bytes, (size_t)n * bytes)) != HVD_OK)
    return st;
  /* In place, the others would read what this rank overwrites: they read
   * a copy. (The way must not depend on it: ranks may differ there.) */
  if (way.reads && in == out) {
    void *copy = ops_scratch(o, SCRATCH_STASH, bytes);
    if (copy == NULL)
      return net_shm_fail(s, hvd_error_status());
    in = memcpy(copy, in, bytes);
  }
  if (way.reads)
    st = read_allreduce(o, s, in, out, count, dtype, op);
  else
    st = copy_allreduce(o, s, in, out, count, dtype, op);
  if (st == HVD_OK)
    ops_shm_chosen_done(o, s, &way);
  return st;
}

static hvd_status copy_allreduce(struct ops_ctx *o, struct net_shm *s, const void *in, void *out,
                                 size_t count, hvd_dtype dtype, hvd_reduce_op op) {
  int n = net_comm_size(net_shm_comm(s)), r = net_comm_rank(net_shm_comm(s));
  size_t esize = hvd_dtype_size(dtype);
  size_t per_round = net_shm_buffer_bytes(s) / esize;
  char *src[OPS_SHM_MAX_MEMBERS];
  hvd_status st = HVD_OK;

  if (count * esize <= SMALL_BYTES)
    return small_allreduce(o, s, in, out, count, dtype, op);
  for (size_t base = 0; base < count && st == HVD_OK; base += per_round) {
    size_t m = min_size(per_round, count - base);
    unsigned b = net_shm_next_round(s);
    size_t off = ops_share_offset(m, n, r), len = ops_share_count(m, n, r);

    for (int q = 0; q < n; q++)
      src[q] = net_shm_buffer(s, q, b);
    memcpy(src[r], (const char *)in + base * esize, m * esize);
    if ((st = net_shm_barrier(s)) != HVD_OK)
      break;
    if (len > 0) {
      char *at[OPS_SHM_MAX_MEMBERS];
      for (int q = 0; q < n; q++)
        at[q] = src[q] + off * esize;
      if ((st = reduce_sources(o, at[r], at, n, len, dtype, op)) != HVD_OK)
        return net_shm_fail(s, st);
    }
    if ((st = net_shm_barrier(s)) != HVD_OK)
      break;
    for (int q = 0; q < n; q++) {
      size_t qo = ops_share_offset(m, n, q);
      memcpy((char *)out + (base + qo) * esize, src[q] + qo * esize,
             ops_share_count(m, n, q) * esize);
    }
  }
  return st;
}

hvd_status ops_shm_reducescatterv(struct ops_ctx *o, struct net_shm *s, const void *in,
                                  void *out, const size_t *offsets, const size_t *counts,
                                  hvd_dtype dtype, hvd_reduce_op op) {
  int n = net_comm_size(net_shm_comm(s)), r = net_comm_rank(net_shm_comm(s));
  size_t esize = hvd_dtype_size(dtype);
  size_t cap = net_shm_buffer_bytes(s) / esize / (size_t)n; /* per share and round */
  size_t most = longest(counts, n);
  char *src[OPS_SHM_MAX_MEMBERS];
  hvd_status st = HVD_OK;

  for (size_t lo = 0; lo < most && st == HVD_OK; lo += cap) {
    unsigned b = net_shm_next_round(s);
    char *mine = net_shm_buffer(s, r, b);
    size_t len = piece(counts[r], lo, cap);

    for (int q = 0; q < n; q++)
      memcpy(mine + (size_t)q * cap * esize, (const char *)in + (offsets[q] + lo) * esize,
             piece(counts[q], lo, cap) * esize);
    if ((st = net_shm_barrier(s)) != HVD_OK || len == 0)
      continue;
    for (int q = 0; q < n; q++)
      src[q] = (char *)net_shm_buffer(s, q, b) + (size_t)r * cap * esize;
    if ((st = reduce_sources(o, (char *)out + lo * esize, src, n, len, dtype, op)) != HVD_OK)
      return net_shm_fail(s, st);
  }
  return st;
}

/* Copies into an output: streaming when the outputs of the host's ranks
 * together are larger than the cache would keep (ops_streams). */
static void copy_out(bool stream, void *dst, const void *src, size_t bytes) {
  if (stream)
    ops_copy_streaming(dst, src, bytes);
  else
    memcpy(dst, src, bytes);
}

static bool overlap(const char *a, const char *b, size_t bytes) {
  return a < b + bytes && b < a + bytes;
}

static hvd_status read_allgather(struct net_shm *s, const char *src, char *out,
                                 const size_t *offsets, const size_t *counts, size_t esize) {
  int n = net_comm_size(net_shm_comm(s)), r = net_comm_rank(net_shm_comm(s));
  char *own = out + offsets[r] * esize;
  unsigned b;
  hvd_status st;

  if ((st = post_address(s, src, &b)) != HVD_OK)
    return st;
  if (src != own)
    memcpy(own, src, counts[r] * esize);
  for (int q = 0; q < n && st == HVD_OK; q++) {
    if (q != r)
      st = net_shm_read(s, q, out + offsets[q] * esize, net_shm_value(s, q, b), counts[q] * esize);
  }
  return all_have_read(s, st);
}

/* Each round: this rank's piece into its buffer and (read again from the
 * cache) into its own block, then the others' pieces out. */
static hvd_status copy_allgather(struct net_shm *s, const char *src, char *out,
                                 const size_t *offsets, const size_t *counts, size_t esize,
                                 bool stream) {
  int n = net_comm_size(net_shm_comm(s)), r = net_comm_rank(net_shm_comm(s));
  size_t cap = net_shm_buffer_bytes(s) / esize;
  size_t most = longest(counts, n);
  char *own = out + offsets[r] * esize;
  hvd_status st = HVD_OK;

  for (size_t lo = 0; lo < most && st == HVD_OK; lo += cap) {
    unsigned b = net_shm_next_round(s);
    size_t len = piece(counts[r], lo, cap) * esize;

    memcpy(net_shm_buffer(s, r, b), src + lo * esize, len);
    if (src != own)
      copy_out(stream, own + lo * esize, src + lo * esize, len);
    if ((st = net_shm_barrier(s)) != HVD_OK)
      break;
    for (int q = 0; q < n; q++) {
      if (q != r)
        copy_out(stream, (char *)out + (offsets[q] + lo) * esize, net_shm_buffer(s, q, b),
                 piece(counts[q], lo, cap) * esize);
    }
  }
  return st;
}

hvd_status ops_shm_allgatherv(struct ops_ctx *o, struct net_shm *s, const void *in, void *out,
                              const size_t *offsets, const size_t *counts, size_t esize) {
  int n = net_comm_size(net_shm_comm(s)), r = net_comm_rank(net_shm_comm(s));
  size_t total = 0;
  char *own = (char *)out + offsets[r] * esize;
  const char *src = in;
  struct ops_shm_way way;
  hvd_status st;

  for (int q = 0; q < n; q++)
    total += counts[q];
  st = ops_shm_choose(o, s, &way, OPS_SHM_ALLGATHER, total * esize, (size_t)n * total * esize);
  if (st != HVD_OK)
    return st;
  if (src != own && overlap(src, own, counts[r] * esize)) {
    memmove(own, src, counts[r] * esize);
    src = own;
  }
  if (way.reads)
    st = read_allgather(s, src, out, offsets, counts, esize);
  else
    st = copy_allgather(s, src, out, offsets, counts, esize, way.stream);
  if (st == HVD_OK)
    ops_shm_chosen_done(o, s, &way);
  return st;
}

static hvd_status copy_broadcast(struct net_shm *s, void *buf, size_t bytes, int root,
                                 bool stream) {
  int r = net_comm_rank(net_shm_comm(s));
  size_t cap = net_shm_buffer_bytes(s);
  hvd_status st = HVD_OK;

  for (size_t lo = 0; lo < bytes && st == HVD_OK; lo += cap) {
    unsigned b = net_shm_next_round(s);
    size_t len = min_size(cap, bytes - lo);

    if (r == root)
      memcpy(net_shm_buffer(s, root, b), (char *)buf + lo, len);
    if ((st = net_shm_barrier(s)) == HVD_OK && r != root)
      copy_out(stream, (char *)buf + lo, net_shm_buffer(s, root, b), len);
  }
  return st;
}

/* The root writes the first 1/n of the buffer into every other member's
 * while each of them reads the rest from the root: every member copies
 * (n-1)/n of it, all at once, where reads alone would leave the root idle
 * (at two ranks, half the time). */
static hvd_status read_broadcast(struct net_shm *s, char *buf, size_t bytes, int root, unsigned b) {
  int n = net_comm_size(net_shm_comm(s)), r = net_comm_rank(net_shm_comm(s));
  size_t pushed = bytes / (size_t)n / 64 * 64;
  hvd_status st = HVD_OK;

  if (r != root)
    return net_shm_read(s, root, buf + pushed, net_shm_value(s, root, b) + pushed,
                        bytes - pushed);
  for (int q = 0; q < n && st == HVD_OK && pushed > 0; q++) {
    if (q != root)
      st = net_shm_write(s, q, net_shm_value(s, q, b), buf, pushed);
  }
  return st;
}

hvd_status ops_shm_broadcast(struct ops_ctx *o, struct net_shm *s, void *buf, size_t bytes,
                             int root) {
  int n = net_comm_size(net_shm_comm(s));
  struct ops_shm_way way;
  unsigned b;
  hvd_status st = ops_shm_choose(o, s, &way, OPS_SHM_BROADCAST, bytes, (size_t)n * bytes);

  if (st != HVD_OK)
    return st;
  if (way.reads) {
    if ((st = post_address(s, buf, &b)) != HVD_OK)
      return st;
    st = read_broadcast(s, buf, bytes, root, b);
    st = all_have_read(s, st);
  } else {
    st = copy_broadcast(s, buf, bytes, root, way.stream);
  }
  if (st == HVD_OK)
    ops_shm_chosen_done(o, s, &way);
  return st;
}

hvd_status ops_shm_alltoallv(struct net_shm *s, const void *in, const size_t *send_offsets,
                             const size_t *send_counts, void *out, const size_t *recv_offsets,
                             const size_t *recv_counts, size_t esize) {
  int n = net_comm_size(net_shm_comm(s)), r = net_comm_rank(net_shm_comm(s));
  size_t cap = net_shm_buffer_bytes(s) / esize / (size_t)n; /* per destination and round */
  size_t most = 0, rounds = 1;
  hvd_status st = HVD_OK;

  /* Nobody knows every split: each rank posts its longest block in the
   * first round, and all take as many rounds as the longest needs. */
  for (int q = 0; q < n; q++) {
    if (q != r) {
      most = send_counts[q] > most ? send_counts[q] : most;
      most = recv_counts[q] > most ? recv_counts[q] : most;
    }
  }
  for (size_t k = 0; k < rounds && st == HVD_OK; k++) {
    unsigned b = net_shm_next_round(s);
    char *mine = net_shm_buffer(s, r, b);
    size_t lo = k * cap;

    for (int q = 0; q < n; q++) {
      if (q != r)
        memcpy(mine + (size_t)q * cap * esize, (const char *)in + (send_offsets[q] + lo) * esize,
               piece(send_counts[q], lo, cap) * esize);
    }
    if (k == 0)
      net_shm_post(s, b, most);
    if ((st = net_shm_barrier(s)) != HVD_OK)
      break;
    if (k == 0) {
      for (int q = 0; q < n; q++) {
        size_t need = (net_shm_value(s, q, b) + cap - 1) / cap;
        rounds = need > rounds ? need : rounds;
      }
    }
    for (int q = 0; q < n; q++) {
      if (q != r)
        memcpy((char *)out + (recv_offsets[q] + lo) * esize,
               (char *)net_shm_buffer(s, q, b) + (size_t)r * cap * esize,
               piece(recv_counts[q], lo, cap) * esize);
    }
  }
  return st;
}

hvd_status ops_shm_barrier(struct net_shm *s) {
  (void)net_shm_next_round(s);
  return net_shm_barrier(s);
}
