/*
 * Building a communicator through the rendezvous store.
 *
 * DESIGN. Every member PUTs one record (addresses, port, host, pid,
 * generation) under its rank in the communicator's scope, then fetches the
 * whole scope with one long-poll that the server answers once all `size`
 * records are there: O(1) requests per rank, whatever the size. Members then
 * pass a token twice around the ring. The first pass connects every ring
 * link (eagerly, as collectives need them at once: each rank dials its right
 * neighbour and is dialled by its left one) and proves that every member has
 * read the scope; the second tells everybody so. Only then does a
 * member delete its key (which lets a planned scope clear itself), because a
 * deleted key in an unplanned scope would hide it from a member still
 * fetching. In etcd, which plans nothing, the keys stay until the job's
 * lease ends: they show hvdrun who came. Other pairs connect lazily, on
 * their first message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport_private.h"

static hvd_status publish(struct net_comm *comm) {
  struct net_ctx *ctx = comm->ctx;
  struct rdzv_record rec;
  struct hvd_buf text;
  char key[16];
  hvd_status st;

  memset(&rec, 0, sizeof(rec));
  rec.rank = comm->rank;
  rec.global_rank = ctx->rank;
  snprintf(rec.host, sizeof(rec.host), "%s", ctx->hostname);
  rec.local_rank = -1;
  rec.pid = (int)getpid();
  rec.generation = ctx->generation;
  rec.port = ctx->port;
  rec.shm = ctx->shm ? 1 : 0;
  for (size_t i = 0; i < ctx->naddrs && i < RDZV_RECORD_MAX_ADDRS; i++)
    net_addr_format(&ctx->addrs[i], rec.addrs[rec.naddrs++], sizeof(rec.addrs[0]));
  hvd_buf_init(&text, 0);
  st = rdzv_record_encode(&rec, &text);
  snprintf(key, sizeof(key), "%d", comm->rank);
  if (st == HVD_OK)
    st = rdzv_client_set(ctx->store, comm->scope, key, text.data, text.len);
  hvd_buf_fini(&text);
  return st;
}

static hvd_status collect(struct net_comm *comm) {
  struct rdzv_scope_view view;
  hvd_status st;

  st = rdzv_client_get_scope(comm->ctx->store, comm->scope, (size_t)comm->size, -1, &view);
  if (st != HVD_OK)
    return st;
  for (int r = 0; r < comm->size && st == HVD_OK; r++) {
    char key[16];
    const struct rdzv_entry *e;
    struct rdzv_record *rec = &comm->records[r];

    snprintf(key, sizeof(key), "%d", r);
    e = rdzv_scope_find(&view, key);
    if (e == NULL)
      st = hvd_error(HVD_ERR_PROTOCOL,
                     "scope '%s' holds %zu keys but none for rank %d (do all ranks agree on the "
                     "size %d?)",
                     comm->scope, view.count, r, comm->size);
    else if (e->value_len == strlen(RDZV_RECORD_ABANDONED) &&
             memcmp(e->value, RDZV_RECORD_ABANDONED, e->value_len) == 0)
      st = hvd_error(HVD_ERR_ABORTED,
                     "scope '%s': the elastic driver abandoned this round before rank %d came "
                     "(a worker failed); the next round follows",
                     comm->scope, r);
    else if (rdzv_record_decode(e->value, e->value_len, rec) != HVD_OK)
      st = hvd_error_prefix("scope '%s', rank %d", comm->scope, r);
    else if (rec->rank != r)
      st = hvd_error(HVD_ERR_PROTOCOL, "scope '%s': the record under key %d says rank %d",
                     comm->scope, r, rec->rank);
    else if (rec->generation != comm->ctx->generation)
      st = hvd_error(HVD_ERR_PRECONDITION,
                     "scope '%s': rank %d published generation %llu, this rank is in generation "
                     "%llu (a stale record from an earlier job or round?)",
                     comm->scope, r, (unsigned long long)rec->generation,
                     (unsigned long long)comm->ctx->generation);
    else if (rec->shm >= 0 && rec->shm != (comm->ctx->shm ? 1 : 0))
      /* Said here, by every rank, before any of them waits for a shared-
       * memory set-up the others will never join. */
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HVD_SHM is %d here but %d on rank %d (global rank %d on %s): every rank "
                     "must have the same value",
                     comm->ctx->shm ? 1 : 0, rec->shm, r, rec->global_rank, rec->host);
  }
  rdzv_scope_view_fini(&view);
  return st;
}

/* Each rank dials both neighbours and hears from both before the token
 * goes round. Without this, a rank waited for its left neighbour's dial
 * before dialling right, so when a rank died before dialling, the one to
 * its right waited for a connection that never came until the timeout
 * (and an elastic driver waited for it to leave the round). Now the ranks
 * beside a dead one learn at once (a refused dial, or a connection that
 * ends), fail, and their failure travels around the ring the same way. */
static hvd_status greet_neighbours(struct net_comm *comm) {
  int peers[2] = {(comm->rank + 1) % comm->size, (comm->rank + comm->size - 1) % comm->size};
  int npeers = peers[0] == peers[1] ? 1 : 2;
  struct net_req sends[2], recvs[2];
  struct net_req *all[4];
  size_t n = 0;
  hvd_status st = HVD_OK;

  for (int i = 0; i < npeers && st == HVD_OK; i++) {
    st = net_isend(comm, peers[i], NULL, 0, &sends[i]);
    if (st == HVD_OK) {
      all[n++] = &sends[i];
      st = net_irecv(comm, peers[i], NULL, 0, &recvs[i]);
    }
    if (st == HVD_OK)
      all[n++] = &recvs[i];
  }
  return st == HVD_OK ? net_wait(comm, all, n) : st;
}

/* Two passes of a token around the ring (see DESIGN). */
static hvd_status ring_barrier(struct net_comm *comm) {
  int left = (comm->rank + comm->size - 1) % comm->size;
  int right = (comm->rank + 1) % comm->size;
  hvd_status st = HVD_OK;

  for (int round = 0; round < 2 && st == HVD_OK; round++) {
    if (comm->rank == 0) {
      st = net_send(comm, right, NULL, 0);
      if (st == HVD_OK)
        st = net_recv(comm, left, NULL, 0);
    } else {
      st = net_recv(comm, left, NULL, 0);
      if (st == HVD_OK)
        st = net_send(comm, right, NULL, 0);
    }
  }
  return st;
}

static hvd_status alloc_comm(struct net_ctx *ctx, const char *scope, uint32_t comm_id, int rank,
                             int size, struct net_comm **out) {
  struct net_comm *comm = calloc(1, sizeof(*comm));

  if (comm == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate a communicator");
  comm->ctx = ctx;
  snprintf(comm->scope, sizeof(comm->scope), "%s", scope);
  comm->id = comm_id;
  comm->rank = rank;
  comm->size = size;
  comm->records = calloc((size_t)size, sizeof(*comm->records));
  comm->conns = calloc((size_t)size, sizeof(*comm->conns));
  comm->active = calloc((size_t)size, sizeof(*comm->active));
  if (comm->records == NULL || comm->conns == NULL || comm->active == NULL) {
    net_comm_destroy(comm);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate a communicator of %d ranks", size);
  }
  for (int i = 0; i < size; i++) {
    comm->conns[i].peer = i;
    comm->conns[i].tx_fd = -1;
    comm->conns[i].rx_fd = -1;
  }
  *out = comm;
  return HVD_OK;
}

hvd_status net_comm_create(struct net_ctx *ctx, const char *scope, uint32_t comm_id, int rank,
                           int size, struct net_comm **out) {
  struct net_comm *comm = NULL;
  char key[16];
  hvd_status st;

  if (size < 1 || rank < 0 || rank >= size)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "communicator %s: rank %d is not in a size of %d",
                     scope, rank, size);
  if (size > 1 && ctx->store == NULL)
    return hvd_error(HVD_ERR_PRECONDITION,
                     "communicator %s has %d ranks but there is no rendezvous store to meet in",
                     scope, size);
  st = alloc_comm(ctx, scope, comm_id, rank, size, &comm);
  if (st != HVD_OK)
    return st;
  if (size == 1) {
    snprintf(comm->records[0].host, sizeof(comm->records[0].host), "%s", ctx->hostname);
    comm->records[0].global_rank = ctx->rank;
    *out = comm;
    return HVD_OK;
  }
  st = publish(comm);
  if (st == HVD_OK)
    st = collect(comm);
  if (st == HVD_OK && size > 1)
    st = greet_neighbours(comm);
  if (st == HVD_OK)
    st = ring_barrier(comm);
  snprintf(key, sizeof(key), "%d", rank);
  if (st == HVD_OK && rdzv_client_plans_scopes(ctx->store))
    st = rdzv_client_delete(ctx->store, scope, key);
  if (st != HVD_OK) {
    hvd_error_prefix("communicator %s (rank %d of %d)", scope, rank, size);
    net_comm_destroy(comm);
    return hvd_error_status();
  }
  HVD_LOG_DEBUG("communicator %s: rank %d of %d connected to its ring", scope, rank, size);
  *out = comm;
  return HVD_OK;
}

hvd_status net_comm_derive(struct net_comm *parent, uint32_t comm_id, const int *members, int n,
                           struct net_comm **out) {
  struct net_comm *comm = NULL;
  char scope[sizeof(comm->scope)];
  int rank = -1;
  hvd_status st;

  for (int i = 0; i < n; i++) {
    if (members[i] < 0 || members[i] >= parent->size)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "communicator %s has no rank %d (size %d) to derive a communicator from",
                       parent->scope, members[i], parent->size);
    for (int j = 0; j < i; j++) {
      if (members[j] == members[i])
        return hvd_error(HVD_ERR_INVALID_ARGUMENT, "rank %d is listed twice", members[i]);
    }
    if (members[i] == parent->rank)
      rank = i;
  }
  if (rank < 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "rank %d of %s is not among the members of the communicator it derives",
                     parent->rank, parent->scope);
  /* The parent's scope, shortened if need be, names the new one in messages. */
  snprintf(scope, sizeof(scope), "%.*s#%u", (int)(sizeof(scope) - 12), parent->scope, comm_id);
  st = alloc_comm(parent->ctx, scope, comm_id, rank, n, &comm);
  if (st != HVD_OK)
    return st;
  for (int i = 0; i < n; i++) {
    comm->records[i] = parent->records[members[i]];
    comm->records[i].rank = i;
  }
  *out = comm;
  return HVD_OK;
}

void net_comm_destroy(struct net_comm *comm) {
  if (comm == NULL)
    return;
  if (comm->conns != NULL) {
    for (int i = 0; i < comm->size; i++) {
      net_conn_close(&comm->conns[i]);
      free(comm->conns[i].fail_msg);
    }
  }
  net_shm_destroy(comm->shm); /* after the links that live in it */
  free(comm->pfds);
  free(comm->active);
  free(comm->conns);
  free(comm->records);
  free(comm);
}

int net_comm_rank(const struct net_comm *comm) { return comm->rank; }
int net_comm_size(const struct net_comm *comm) { return comm->size; }

const char *net_comm_hostname(const struct net_comm *comm, int r) {
  return r >= 0 && r < comm->size ? comm->records[r].host : NULL;
}
