/*
 * The coord module: what turns the collectives of ops into a library that
 * training frameworks can call from many threads in any order. User
 * threads enqueue; one background thread per process negotiates with the
 * coordinator (global rank 0) over the control communicator, which decides
 * when every rank has submitted a tensor, checks that they agree, fuses
 * them and tells every rank the order to run them in; then each rank runs
 * them on its process set's communicator (see docs/coordinator-protocol.md).
 *
 * Lock order: coord_state.lock, then a handle's mu. coord_state.sets_lock,
 * the timeline's lock and the spare handles' and entries' locks (handle.c)
 * are leaves. No lock is held across socket I/O or
 * a user callback except the loop's (drive) and, on a user thread that
 * drives, its read hold on the published state; docs/architecture.md has
 * the whole table.
 */
#ifndef HVD_COORD_H
#define HVD_COORD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/common.h"
#include "coord/gpu_backend.h"
#include "coord/lifecycle.h"
#include "tune/tune.h"
#include "ops/ops.h"
#include "transport/transport.h"

/* ==== requests and responses (message.c) ====================================== */

enum {
  COORD_NAME_MAX = 4096,          /* bytes of a tensor name */
  COORD_MAX_SET_RANKS = 1 << 24,  /* ranks in a process-set list */
  COORD_MAX_MESSAGE = 256u << 20, /* bytes of one encoded list */
  COORD_INLINE_MAX = 64,          /* bytes of an allreduce reduced inside negotiation */
};

/* One rank's submission of one operation. */
struct coord_request {
  uint8_t type;   /* enum coord_type */
  uint8_t dtype;  /* hvd_dtype */
  uint8_t op;     /* hvd_reduce_op */
  int32_t set;    /* process set id */
  int32_t root;   /* BROADCAST: the root's set rank; SET_REMOVE: the set id */
  int32_t device; /* HVD_DEVICE_CPU or a GPU ordinal */
  int32_t rank;   /* the submitting global rank (filled in by the coordinator) */
  uint32_t group_size; /* grouped allreduce: tensors in the group; 0: not grouped */
  double prescale, postscale;
  int32_t ndims;
  int64_t shape[HVD_MAX_DIMS];
  int32_t *ranks; /* SET_ADD: the sorted global ranks */
  uint32_t nranks;
  char *name; /* NUL-terminated, name_len bytes */
  uint32_t name_len;
  char *group; /* grouped: the group's name (its first tensor's), NULL otherwise */
  uint32_t group_len;
  /* A small allreduce's input, sent with the request: rank 0 reduces the
   * values and sends the result in the response (no collective runs). */
  uint32_t inline_len;
  unsigned char inline_data[COORD_INLINE_MAX];
};

/*
 * What every member of a set runs. A response covers ntensors tensors (more
 * than one when fused); counts depends on the type:
 *   ALLREDUCE, BROADCAST, REDUCESCATTER: elements per tensor (ntensors);
 *   ALLGATHER: elements each set rank contributes, per tensor
 *     (ntensors x set size, tensor-major);
 *   others: none.
 */
struct coord_response {
  uint8_t type;
  uint8_t dtype;
  uint8_t op;
  uint8_t status; /* ERROR: the hvd_status the tensors fail with */
  int32_t set;
  int32_t root;
  int32_t device;
  int32_t last_joined; /* JOIN */
  int32_t new_set;     /* SET_ADD, SET_REMOVE: the set id */
  double prescale, postscale;
  uint32_t ntensors;
  char **names;   /* ntensors */
  int32_t *bits;  /* ntensors: each tensor's cache bit, -1: not cached */
  bool cached;    /* on the wire as cache bits only: names and counts come from the cache */
  uint32_t ncounts;
  int64_t *counts;
  int32_t *ranks; /* SET_ADD: sorted global ranks */
  uint32_t nranks;
  char *error; /* ERROR: the message */
  unsigned char *data; /* ALLREDUCE reduced inline: the result (one tensor) */
  uint32_t data_len;
};

enum {
  COORD_FLAG_SHUTDOWN = 1, /* the sender shuts down (request) / everybody does (response) */
  COORD_FLAG_ABORT = 2,    /* the job failed: abort_status and abort_message say how */
  COORD_FLAG_HEARTBEAT = 4, /* response: nothing to run, rank 0 is alive (seq 0, not applied) */
  COORD_FLAG_TUNE = 8,      /* response: the autotuner's next setting follows (autotune.c) */
  COORD_FLAG_LANES = 16,    /* response: cache bits granted a lane follow the retired ones */
};

/* A cached request that carries an inline allreduce's input. */
struct coord_inline_hit {
  int32_t bit;
  uint32_t len;
  unsigned char data[COORD_INLINE_MAX];
};

/* Worker -> coordinator. */
struct coord_request_list {
  uint64_t ack; /* the last response list this rank has applied */
  uint8_t flags;
  uint8_t abort_status;
  char *abort_message;
  unsigned char *hits; /* cache bits of cached requests, bit k = byte k/8, 1 << k%8 */
  uint32_t hits_bytes;
  struct coord_request *reqs;
  uint32_t n;
  struct coord_inline_hit *inline_hits;
  uint32_t ninline_hits;
  /* reqs, hits and inline_hits belong to whoever decoded the list into
   * its space (coord_decode_requests_in): fini frees only what the
   * requests hold. */
  bool borrowed;
};

/* Coordinator -> every worker. */
struct coord_response_list {
  uint64_t seq; /* 1, 2, ... */
  uint8_t flags;
  uint8_t abort_status;
  char *abort_message;
  int32_t *retired; /* cache bits dropped after this list's responses */
  uint32_t nretired;
  int32_t *lanes; /* COORD_FLAG_LANES: cache bits whose lanes open after the retirements */
  uint32_t nlanes;
  struct coord_response *resps;
  uint32_t n;
  /* resps, each response's bits and data, and lanes belong to whoever
   * built the list (a list of cached results made without allocating):
   * fini leaves them. */
  bool borrowed;
  unsigned char tune[TUNE_SETTING_BYTES]; /* COORD_FLAG_TUNE: applied before resps */
};

void coord_request_fini(struct coord_request *r);
/* A deep copy (names and rank lists duplicated). */
hvd_status coord_request_copy(struct coord_request *dst, const struct coord_request *src);
void coord_response_fini(struct coord_response *r);
hvd_status coord_response_copy(struct coord_response *dst, const struct coord_response *src);
void coord_request_list_fini(struct coord_request_list *l);
void coord_response_list_fini(struct coord_response_list *l);

/* Little-endian, versioned, every length checked on decode; a decode failure
 * is HVD_ERR_PROTOCOL naming what was wrong, and leaves *out empty. */
hvd_status coord_encode_requests(const struct coord_request_list *l, struct hvd_buf *out);
hvd_status coord_decode_requests(const void *data, size_t len, struct coord_request_list *out);
/* Arrays rank 0 keeps for decoding the workers' request lists (grown,
 * never shrunk): a list of cache bits, a training loop's steady state,
 * is decoded without allocating. */
struct coord_request_space {
  struct coord_request *reqs;
  unsigned char *hits;
  struct coord_inline_hit *inline_hits;
  size_t reqs_cap, hits_cap, inline_hits_cap;
};
/* coord_decode_requests, the list's arrays in space's (out->borrowed,
 * valid until the next decode into space); the requests' names and rank
 * lists are allocated as there. */
hvd_status coord_decode_requests_in(const void *data, size_t len, struct coord_request_list *out,
                                    struct coord_request_space *space);
void coord_request_space_fini(struct coord_request_space *space);
hvd_status coord_encode_responses(const struct coord_response_list *l, struct hvd_buf *out);
hvd_status coord_decode_responses(const void *data, size_t len, struct coord_response_list *out);
/* Arrays a worker keeps for decoding lists of cached responses (bits and
 * inline results only: a training loop's steady state) without allocating. */
struct coord_response_space {
  struct coord_response *resps;
  int32_t *bits;
  unsigned char *data;
  int32_t *lanes;
  size_t resps_cap, bits_cap, data_cap, lanes_cap;
};
/* coord_decode_responses, into space's arrays (out->borrowed, valid until
 * the next decode into space) when every response is cached; other lists
 * are decoded as coord_decode_responses does. */
hvd_status coord_decode_responses_in(const void *data, size_t len, struct coord_response_list *out,
                                     struct coord_response_space *space);
void coord_response_space_fini(struct coord_response_space *space);

/* ==== configuration (config.c) ================================================== */

struct coord_config {
  size_t fusion_threshold;      /* HOROVOD_FUSION_THRESHOLD bytes; 0: no fusion */
  size_t fusion_inplace_bytes;  /* HVD_FUSION_INPLACE_BYTES: larger tensors of a fused
                                   allreduce are reduced in place, not copied */
  int64_t cycle_ns;             /* HOROVOD_CYCLE_TIME: longest wait to batch ready tensors */
  size_t cache_capacity;        /* HOROVOD_CACHE_CAPACITY; 0: no cache */
  size_t inline_bytes;          /* HVD_INLINE_BYTES: allreduces up to this size are reduced
                                   by rank 0 during negotiation; 0: never */
  bool stall_check;             /* !HOROVOD_STALL_CHECK_DISABLE */
  int64_t stall_warn_ns;        /* HOROVOD_STALL_CHECK_TIME_SECONDS */
  int64_t stall_shutdown_ns;    /* HOROVOD_STALL_SHUTDOWN_TIME_SECONDS; 0: never */
  bool hierarchical_allreduce;  /* HOROVOD_HIERARCHICAL_ALLREDUCE */
  bool hierarchical_allgather;  /* HOROVOD_HIERARCHICAL_ALLGATHER */
  bool gpu_host_staged;         /* HVD_GPU_COLLECTIVES=host */
  char timeline[1024];          /* HOROVOD_TIMELINE: a path, "DYNAMIC" or "" */
  bool timeline_mark_cycles;    /* HOROVOD_TIMELINE_MARK_CYCLES */
  int64_t timeline_max_bytes;   /* HVD_TIMELINE_MAX_BYTES; 0: no limit */
  int affinity_core;            /* HOROVOD_THREAD_AFFINITY's entry for this local rank; -1 */
  int64_t spin_ns;              /* HVD_SPIN_US: how long a waiting user thread spins */
  bool lanes;                   /* HVD_SHM_LANES (rank 0's counts): grant lanes (lanes.c) */
  int64_t timeout_ns;           /* HOROVOD_GLOO_TIMEOUT_SECONDS */
  bool metrics;                 /* HVD_METRICS: count (metrics.c) */
  int64_t metrics_push_ms;      /* HVD_METRICS_PUSH_MS; 0: never sent */
};

/* Reads the variables; a malformed value is HVD_ERR_INVALID_ARGUMENT naming it. */
hvd_status coord_config_from_env(int local_rank, int local_size, struct coord_config *out);
/* The settings of the start-up handshake (scope AGREE or SAME in
 * settings.def), in the table's order; returns how many. */
size_t coord_handshake_settings(enum hvd_setting *ids, size_t max);
/* Takes rank 0's value of an AGREE setting (its handshake bits). */
void coord_config_adopt(struct coord_config *c, enum hvd_setting id, uint64_t v);

/* ==== handles and entries (handle.c) ============================================ */

/* An output hvd allocates (allgather, alltoall), one per tensor of a handle. */
struct hvd_handle_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  atomic_bool done;
  int parts;             /* entries not yet finished (a group has several); under mu */
  int waiters;           /* threads in hvd_handle_wait; under mu */
  hvd_status status;     /* the first failure among the parts; under mu until done */
  char *message;
  hvd_callback callback;
  void *callback_arg;
  /* results, written by the background thread before done */
  struct coord_output *outputs; /* allgather, alltoall: one per part; else NULL */
  int noutputs;
  int32_t *recv_splits; /* alltoall */
  size_t nsplits;
  int32_t value; /* join: the last rank to join; set add: the id */
  int64_t spin_ns; /* how long a waiter spins before it sleeps */
};

/* outputs: whether the operation's parts have outputs hvd allocates. */
struct hvd_handle_s *coord_handle_create(int parts, bool outputs, hvd_callback cb, void *arg);
/* One part finished with st (message from this thread's last error when
 * st != HVD_OK, or `message` if not NULL). The last part completes the
 * handle: waiters wake, then the callback runs (no lock held). */
void coord_handle_finish(struct hvd_handle_s *h, hvd_status st, const char *message);
hvd_status coord_handle_wait(struct hvd_handle_s *h, int64_t deadline_ns, int64_t spin_ns);
void coord_handle_destroy(struct hvd_handle_s *h);

/* One tensor of one operation on this rank, from enqueue to completion. */
struct coord_entry {
  struct coord_request req;
  const void *input;
  void *output;
  void *ready_event; /* GPU: the user's event that marks the input ready, or NULL */
  int32_t *splits; /* alltoall: rows to each set rank (set size entries) */
  struct hvd_handle_s *handle;
  int part;                 /* this tensor's index in its handle (its group) */
  struct coord_entry *next; /* in the queue */
  int64_t taken_ns; /* when the loop's driver took it from the queue (metrics) */
  /* req.name when it fits (most do): no allocation per operation. */
  char name_buf[48];
};

/* A zeroed entry (NULL when out of memory); coord_entry_destroy releases it. */
struct coord_entry *coord_entry_alloc(void);
void coord_entry_destroy(struct coord_entry *e);
/* The output slot of the entry's tensor in its handle (allgather, alltoall). */
static inline struct coord_output *coord_entry_output(const struct coord_entry *e) {
  return &e->handle->outputs[e->part];
}

/* ==== process sets (process_set.c) =============================================== */

struct coord_set {
  int id;
  int32_t *ranks; /* sorted global ranks */
  int size;
  int rank;              /* this rank's place, -1: not a member */
  struct net_comm *comm; /* members only; the global set uses the world's */
  bool owns_comm;
  uint32_t comm_id; /* unique per registration in this generation */
  int8_t path;      /* enum coord_path its collectives take; 0: not looked at yet (metrics.c) */
};

struct coord_sets {
  pthread_mutex_t lock; /* protects everything below */
  struct coord_set **sets; /* by id; NULL: free */
  int cap;
  uint32_t registrations; /* communicator ids of new sets */
};

hvd_status coord_sets_init(struct coord_sets *s, struct net_comm *global, int size);
void coord_sets_fini(struct coord_sets *s);
/* Copies what a user thread needs to validate an operation; false if no such set. */
bool coord_sets_lookup(struct coord_sets *s, int id, int *size, int *rank);
/* The set (background thread only; sets change only on that thread). */
struct coord_set *coord_sets_get(struct coord_sets *s, int id);
/* The id a set with exactly these ranks has, -1 if none. */
int coord_sets_find(struct coord_sets *s, const int32_t *ranks, uint32_t n);
/* The lowest free id (>= 1). */
int coord_sets_free_id(struct coord_sets *s);
/* Registers a set (background thread); derives its communicator on members. */
hvd_status coord_sets_add(struct coord_sets *s, struct net_comm *global, int id,
                          const int32_t *ranks, uint32_t n);
hvd_status coord_sets_remove(struct coord_sets *s, int id);
/* The set's ranks (any thread): up to cap into out, the count in *n. */
hvd_status coord_sets_ranks(struct coord_sets *s, int id, int *out, size_t cap, size_t *n);
/* The ids in use, ascending (any thread): up to cap into out, the count in *n. */
void coord_sets_ids(struct coord_sets *s, int *out, size_t cap, size_t *n);

/* ==== response cache (cache.c) ================================================== */

/*
 * Both sides keep the same table of single-tensor responses by bit. The
 * coordinator assigns bits (in the responses it sends) and retires them
 * (in the retired list); every rank applies both in list order. A worker
 * whose request equals its cached one sends the bit instead of the request;
 * the coordinator turns it back into the request. A retired bit is reused
 * only once every rank has acknowledged the list that retired it, so a
 * bit in flight always means what its sender thought.
 */
struct coord_cache_entry {
  int state; /* COORD_CACHE_FREE, _ACTIVE, _RETIRED */
  struct coord_response resp; /* one tensor */
  struct coord_request req;   /* coordinator: the tensor's request; worker: this rank's */
  bool have_req;
  uint64_t assigned_seq, retired_seq;
  uint64_t used; /* LRU stamp */
};

enum { COORD_CACHE_FREE = 0, COORD_CACHE_ACTIVE = 1, COORD_CACHE_RETIRED = 2 };

struct coord_cache {
  size_t capacity;
  struct coord_cache_entry *entries; /* capacity of them, allocated on first use */
  size_t nentries;                   /* highest bit in use + 1 */
  struct hvd_map by_name;            /* "<set>:<name>" -> bit + 1 (ACTIVE only) */
  uint64_t clock;
};

void coord_cache_init(struct coord_cache *c, size_t capacity);
void coord_cache_fini(struct coord_cache *c);
/* Whether a response of this type and request can be cached. */
bool coord_cache_eligible(const struct coord_request *req);
/* The ACTIVE bit for (set, name), or -1. */
int coord_cache_find(const struct coord_cache *c, int set, const char *name, size_t len);
/* Worker: the bit whose request equals req exactly, or -1. */
int coord_cache_hit(struct coord_cache *c, const struct coord_request *req);
/* Both: stores a single-tensor response (and the request, may be NULL)
 * under bit; replaces what was there. */
hvd_status coord_cache_put(struct coord_cache *c, int bit, const struct coord_response *resp,
                           const struct coord_request *req, uint64_t seq);
/* Worker: drops a bit. Coordinator: marks it retired at seq. */
void coord_cache_drop(struct coord_cache *c, int bit);
void coord_cache_retire(struct coord_cache *c, int bit, uint64_t seq);
/* Coordinator: a free bit, freeing retired ones every rank has acknowledged
 * (min_ack), or evicting the least recently used (its bit goes to
 * *evicted, -1 if none); -1 if there is none to be had now. */
int coord_cache_take_bit(struct coord_cache *c, uint64_t min_ack, uint64_t seq, int *evicted);
const struct coord_cache_entry *coord_cache_entry(const struct coord_cache *c, int bit);
void coord_cache_touch(struct coord_cache *c, int bit);

/* ==== lanes: cached inline allreduces through shared memory (lanes.c) ============ */

enum {
  COORD_LANES = 512,         /* cache bits below this may have a lane */
  COORD_LANE_VALUE_MAX = 56, /* bytes of an input a lane carries */
};

/* One cache bit's lane, as this rank knows it. */
struct coord_lane {
  uint64_t epoch;  /* low 40 bits of the sequence number of the list that opened it */
  uint32_t number; /* submissions posted in this epoch */
  bool open;
};

/* A submission posted to a lane, waiting for the others. */
struct coord_lane_ticket {
  int bit;
  uint64_t epoch;
  uint32_t number;
  size_t len;
};

enum coord_lane_state { COORD_LANE_WAITING, COORD_LANE_DONE, COORD_LANE_CLOSED };

struct coord_lanes;
struct coord_state;
struct coord_entry;

/* Bytes of each rank's data buffer the lanes take. */
size_t coord_lanes_bytes(void);
/* Lanes in the control communicator's segment (every rank of the job is
 * its member); *out stays NULL when its buffers are too small. */
hvd_status coord_lanes_create(struct net_shm *shm, int rank, int size, struct coord_lanes **out);
/* The same over given memory, zeroed, 64-byte aligned: slots[r] (rank r's,
 * coord_lanes_bytes()) and words (COORD_LANES lines). */
hvd_status coord_lanes_create_at(unsigned char *const *slots, void *words, int rank, int size,
                                 struct coord_lanes **out);
void coord_lanes_destroy(struct coord_lanes *l);
/* bit's lane, or NULL (no lanes, or a bit beyond them). */
const struct coord_lane *coord_lane(const struct coord_lanes *l, int bit);
/* The epoch a list with this sequence number opens lanes in (0: none). */
uint64_t coord_lane_epoch(uint64_t seq);
/* Every rank, applying a list that grants bit: opens its lane in epoch. */
void coord_lane_open(struct coord_lanes *l, int bit, uint64_t epoch);
/* Closes bit's lane, if open, from this rank's next submission on (every
 * rank then takes that one and later ones to rank 0). */
void coord_lane_close(struct coord_lanes *l, int bit);
/* Posts this rank's input as the lane's next submission; false (nothing
 * posted) if the lane is not open or the input too long, or when its
 * numbers ran out (the lane then closes). */
bool coord_lane_post(struct coord_lanes *l, int bit, const void *value, size_t len,
                     struct coord_lane_ticket *t);
/* Whether the submission completed (every rank posted it), closed (it goes
 * to rank 0) or still waits; give_up closes it unless it completed. */
enum coord_lane_state coord_lane_poll(struct coord_lanes *l, const struct coord_lane_ticket *t,
                                      bool give_up);
/* A completed submission's input from rank. */
const unsigned char *coord_lane_value(const struct coord_lanes *l,
                                      const struct coord_lane_ticket *t, int rank);
/* The number bit's lane reached in epoch (0 once another epoch began). */
uint32_t coord_lane_closed_at(const struct coord_lanes *l, int bit, uint64_t epoch);

/* Operations through lanes (lane_ops.c), on the loop's driver. */
struct coord_lane_wait {
  struct coord_entry *e;
  struct coord_lane_ticket t;
  int64_t give_up; /* then it goes to rank 0 */
};
struct coord_lane_waits {
  struct coord_lane_wait *w;
  size_t n, cap;
  int64_t wait_ns;
  _Atomic uint64_t completed; /* submissions finished through lanes (tests read it) */
};

enum { COORD_LANE_FIND = -2 }; /* coord_lanes_submit: look the cache bit up */

void coord_lanes_init(struct coord_state *s);
void coord_lanes_fini(struct coord_state *s);
/* Posts e to its cache bit's lane, if open (true: it waits there). Else e
 * goes to rank 0, and the lane of e's name closes if it was open: e no
 * longer matches its cached request (bit < 0), or it cannot be posted.
 * bit: e's cache hit, or COORD_LANE_FIND. */
bool coord_lanes_submit(struct coord_state *s, struct coord_entry *e, int bit, int64_t now);
/* Finishes the waits that completed; those whose lane closed, or that
 * waited long enough, go back to the front of the queue. */
void coord_lanes_progress(struct coord_state *s, int64_t now, bool *worked);
/* Whether a wait has an outcome; the earliest give-up time. */
bool coord_lanes_ready(struct coord_state *s);
int64_t coord_lanes_deadline(const struct coord_state *s);
/* A list's retirements close lanes and its grants open them. */
hvd_status coord_lanes_apply(struct coord_state *s, const struct coord_response_list *list);

/* An inline allreduce's result, built in acc (count elements) from the
 * inputs in rank order: coord_inline_fold for each input (first: the
 * first one), then coord_inline_finish (any: whether there was one; a
 * rank that joined gives none). The same bits on every rank. */
void coord_inline_fold(unsigned char *acc, const unsigned char *in, bool first, size_t count,
                       int dtype, int op, double prescale);
void coord_inline_finish(unsigned char *acc, bool any, size_t count, int dtype, int op,
                         double postscale, int set_size);

/* ==== the coordinator (controller.c, validate.c, fusion.c) ====================== */

struct coord_state;
struct coord_controller;

hvd_status coord_controller_create(struct coord_state *s, struct coord_controller **out);
void coord_controller_destroy(struct coord_controller *c);
/* A request from rank (its own or a worker's); the controller takes ownership
 * of req's allocations. */
void coord_controller_submit(struct coord_controller *c, struct coord_request *req);
/* The same for a request the caller keeps (copied only if the table must
 * keep it). */
void coord_controller_submit_borrowed(struct coord_controller *c, const struct coord_request *req);
/* A worker's list: acknowledgement, cached bits and requests. */
hvd_status coord_controller_receive(struct coord_controller *c, int rank,
                                    struct coord_request_list *l);
/* Builds the next response list if one is due at `now`; *due says when the
 * next one may be (HVD_NO_DEADLINE: nothing pending). Returns false when
 * there is nothing to send now. */
bool coord_controller_next(struct coord_controller *c, int64_t now, struct coord_response_list *out,
                           int64_t *due);
/* A rank asked to shut down: the next list says so. */
void coord_controller_request_shutdown(struct coord_controller *c);
/* When a list may next be due (HVD_NO_DEADLINE: when something arrives). */
int64_t coord_controller_due(const struct coord_controller *c);
/* When the stall inspector next wants to look (HVD_NO_DEADLINE: nothing pending). */
int64_t coord_controller_next_check(const struct coord_controller *c);
/* Turns every pending tensor of a set into an error (set removal). */
void coord_controller_fail_set(struct coord_controller *c, int set, const char *why);
/* The stall inspector (stall.c): warns about old pending tensors; returns
 * HVD_ERR_TIMEOUT with a message when one passed the shutdown time. */
hvd_status coord_controller_check_stalls(struct coord_controller *c, int64_t now);
/* The autotuner turns the response cache off (every entry retired, no new
 * bits) or back on (dispatch.c). */
void coord_ctl_pause_cache(struct coord_controller *c, bool paused);

/* ==== the autotuner in the loop (autotune.c) ====================================== */

/* Every rank checks HOROVOD_AUTOTUNE_*; rank 0 with HOROVOD_AUTOTUNE=1 makes
 * the tuner, whose first setting goes out with the first response list. */
hvd_status coord_autotune_init(struct coord_state *s);
void coord_autotune_fini(struct coord_state *s);
/* Rank 0: puts a new setting, if there is one, into the list to send. */
void coord_autotune_attach(struct coord_state *s, struct coord_response_list *list);
/* Every rank, before a list's responses: applies the setting it carries. */
hvd_status coord_autotune_apply(struct coord_state *s, const struct coord_response_list *list);
/* Rank 0, after running a list: its bytes count towards the tuner's sample. */
void coord_autotune_record(struct coord_state *s, const struct coord_response_list *list);

/* Whether two devices are both the CPU or both GPUs: ranks must agree on
 * that, each rank uses its own GPU. */
static inline bool coord_same_device_kind(int a, int b) {
  return (a == HVD_DEVICE_CPU) == (b == HVD_DEVICE_CPU);
}

/* Checks a request against the first one submitted for its name; writes a
 * message ("mismatched shapes: ...") and returns false on a mismatch. */
bool coord_validate(const struct coord_request *first, const struct coord_request *req,
                    char *msg, size_t size);

/* Fuses single-tensor responses (in order) into as few as the threshold
 * allows; consumes the responses in[0 .. n) (the array stays the caller's).
 * bytes[i] is the size of in[i]'s data. */
hvd_status coord_fuse(struct coord_response *in, const size_t *bytes, size_t n, size_t threshold,
                      struct coord_response **out, size_t *nout);

/* ==== running responses (execute.c) ================================================ */



/* Runs one response on this rank and finishes the entries it covers.
 * Returns a failure of the job (a communicator failed); a failed operation
 * whose ranks go on (a mismatch) is not one. */
hvd_status coord_execute(struct coord_state *s, const struct coord_response *r);

/* ==== timeline (timeline.c) ======================================================= */

struct coord_timeline;

/* A file is cut into parts of max_bytes (0: never; HVD_TIMELINE_MAX_BYTES). */
hvd_status coord_timeline_create(struct coord_timeline **out, int64_t max_bytes);
void coord_timeline_destroy(struct coord_timeline *t);
/* Writes the file's header before it returns, then a writer thread adds
 * what is recorded within a millisecond; HVD_ERR_PRECONDITION while one is
 * written, HVD_ERR_IO for a file that cannot be opened or written. */
hvd_status coord_timeline_start(struct coord_timeline *t, const char *path, bool mark_cycles);
/* Writes what is left, closes the array and the file; HVD_ERR_IO if a
 * write failed since the start (the file keeps every whole event before). */
hvd_status coord_timeline_stop(struct coord_timeline *t);
bool coord_timeline_active(const struct coord_timeline *t);
/* Events, from any thread: tensor is the tensor's name; phase names are
 * ours and follow Horovod's (NEGOTIATE_ALLREDUCE, ALLREDUCE,
 * MEMCPY_IN_FUSION_BUFFER, ...), written as they are. */
void coord_timeline_begin(struct coord_timeline *t, const char *tensor, const char *phase);
void coord_timeline_end(struct coord_timeline *t, const char *tensor);
/* Rank's submission of the tensor reached rank 0 (on that rank's row). */
void coord_timeline_arrival(struct coord_timeline *t, const char *tensor, int rank);
void coord_timeline_cycle(struct coord_timeline *t);

/* ==== metrics (metrics.c) ======================================================== */

/* How a collective's bytes move on this rank (a label of its metrics). */
enum coord_path {
  COORD_PATH_LOCAL = 1, /* a set of one rank */
  COORD_PATH_SHM,       /* the set's ranks share a host: shared memory (HVD_SHM) */
  COORD_PATH_TCP,       /* the set spans hosts (or HVD_SHM=0) */
  COORD_PATH_NCCL,      /* GPU tensors through the backend's collectives */
  COORD_PATH_INLINE,    /* reduced by rank 0 during negotiation */
  COORD_PATH_LANE,      /* agreed through a shared-memory lane (lanes.c) */
  COORD_PATH_COUNT
};

/*
 * The counters are the process's, kept across hvd_init/hvd_shutdown and
 * elastic resets (Prometheus counters only grow). The loop's driver, one
 * thread at a time, updates them without locks; coord_metrics_format reads
 * them from any thread. Nothing here allocates.
 */
/* A response ran on this rank from start to end (ns; end < 0: no
 * collective ran, its result came reduced inline); ok: it succeeded.
 * entries: its tensors (NULL where this rank has none). */
void coord_metrics_op(struct coord_state *s, struct coord_set *set,
                      const struct coord_response *r, struct coord_entry *const *entries,
                      int64_t start, int64_t end, bool ok);
/* A submission completed through its lane at now. */
void coord_metrics_lane(const struct coord_entry *e, int64_t now);
void coord_metrics_cache(bool hit);
void coord_metrics_stalls(int tensors);
void coord_metrics_job_error(void);
void coord_metrics_reset(void);
/* The exposition text of this rank's series (TYPE and HELP lines, no rank
 * or host label: the server adds them), after a first line
 * "# hvd-metrics round=<round> host=<host>". */
hvd_status coord_metrics_format(struct hvd_buf *out, uint64_t round, const char *host);
/* The thread that sends the snapshot to the store every
 * cfg.metrics_push_ms (hvd's own store only); stop sends a last one after
 * a clean shutdown. A sender that cannot start is a warning, not a failure:
 * only out of memory fails. */
hvd_status coord_metrics_start(struct coord_state *s);
void coord_metrics_stop(struct coord_state *s);

/* ==== GPU tensors (gpu.c; the CUDA backend in cuda/) ============================== */

struct coord_gpu; /* a backend's per-process state: its device, streams, communicators */
struct coord_set;

/* Tests: the backend later hvd_inits use instead (NULL: the built-in). */
void coord_gpu_override(const struct coord_gpu_backend *b);
/* The backend hvd_init picks: the override, else the built-in. */
const struct coord_gpu_backend *coord_gpu_backend(void);
/* HVD_GPU_COLLECTIVES: "nccl" (the backend's own, default) or "host". */
/* HVD_GPU_COLLECTIVES's words, in settings.def's order. */
enum { COORD_GPU_NCCL, COORD_GPU_HOST };
hvd_status coord_gpu_mode_from_env(bool *host_staged);

/* Opens the device on first use, makes the stream wait for the inputs'
 * ready events and runs the response with the backend's own collectives;
 * *ran is false (and HVD_OK returned) when the response is to be staged
 * instead: HVD_GPU_COLLECTIVES=host, or a type the backend lacks. */
hvd_status coord_gpu_run(struct coord_state *s, const struct coord_set *set,
                         const struct coord_response *r, struct coord_entry **entries,
                         bool *ran);
/* Host staging: copies of the entries with host buffers (entries[i] NULL
 * where this rank has none), the inputs copied in. */
struct coord_gpu_staging {
  struct coord_entry *copies;
  struct coord_entry **entries; /* what the CPU collectives run on */
  size_t *out_bytes;            /* output bytes the caller gave; 0: hvd allocates */
  size_t n;
  bool pinned; /* the copies' buffers are the backend's staging buffer, not malloc'd */
};
hvd_status coord_gpu_stage_in(struct coord_state *s, const struct coord_set *set,
                              const struct coord_response *r, struct coord_entry **entries,
                              struct coord_gpu_staging *out);
/* The outputs back to the device (outputs hvd allocated move there). */
hvd_status coord_gpu_stage_out(struct coord_state *s, const struct coord_response *r,
                               struct coord_entry **entries,
                               const struct coord_gpu_staging *staging);
void coord_gpu_staging_free(struct coord_gpu_staging *g);

/* ==== the state of an initialized process (lifecycle.c, loop.c) =================== */

enum coord_phase {
  COORD_RUNNING = 0,
  COORD_STOPPED, /* shut down or failed: `failure` says which */
};

struct coord_state {
  /* set by hvd_init, then read-only */
  struct coord_config cfg;
  struct coord_round round;   /* rank, size, generation of this state */
  struct rdzv_client *store;
  struct net_world *world;
  struct net_comm *control;
  /* A job on several hosts: rank 0 and the ranks of its host, whose
   * segment lends control its rings (NULL elsewhere, and on one host). */
  struct net_comm *control_host;
  int rank, size;
  bool homogeneous; /* every host runs as many ranks (rank 0 learns it in the handshake) */
  pthread_t thread;
  int wake_fd; /* eventfd: wakes the background thread from poll() */

  /* user threads <-> background thread; under lock */
  pthread_mutex_t lock;
  struct coord_entry *queue_head, *queue_tail;
  struct hvd_map inflight;    /* "<set>:<name>" -> entry, from enqueue to completion */
  struct hvd_map noname;      /* "<set>:<kind>" -> calls so far, for generated names */
  bool stop_requested;        /* hvd_shutdown asked */
  _Atomic enum coord_phase phase; /* written under lock; the loop looks without it */
  hvd_status failure;         /* COORD_STOPPED: why */
  char failure_msg[HVD_ERROR_MESSAGE_MAX];
  atomic_bool queued;         /* the queue is not empty, or stop was requested */
  atomic_bool sleeping;       /* the loop's driver is (about to be) in poll() */
  atomic_bool closing;        /* hvd_shutdown has begun: user threads stop driving */

  struct coord_sets sets;
  struct coord_timeline *timeline;
  struct coord_metrics_pusher *metrics; /* NULL: nothing sent (metrics.c) */

  /* the loop's driver only (the background thread, or a user thread
   * waiting for its handle: whoever holds the loop's drive lock) */
  struct ops_ctx *ops;
  struct coord_cache cache;
  struct coord_lanes *lanes;           /* one host with a control segment; else NULL */
  struct coord_lane_waits lane_waits;  /* submissions waiting in lanes */
  struct coord_controller *controller; /* rank 0 */
  uint64_t applied_seq;                /* the last response list applied */
  int64_t apply_ns; /* when applying the current list began (the loop's clock; metrics) */
  void *fusion;                        /* fusion buffer */
  size_t fusion_cap;
  void *identity; /* a joined rank's contribution */
  size_t identity_cap;
  void *fused_counts; /* an Adasum fusion's tensor counts (size_t) */
  size_t fused_counts_cap;
  /* the autotuner (autotune.c): rank 0's tuner and the setting it will
   * send next; every rank's last applied setting number */
  struct tune_tuner *tuner;
  struct tune_setting tune_next;
  bool tune_due;
  uint64_t tune_applied;
  struct coord_loop *loop;

  /* GPU tensors: the backend (NULL: none), its state once a GPU response
   * ran (the loop's driver), and the one device this rank's GPU tensors
   * use (-1 until the first; any thread, atomically). */
  const struct coord_gpu_backend *gpu_backend;
  struct coord_gpu *gpu;
  bool clean_stop;      /* the loop's driver: stopped by a shutdown all ranks agreed on */
  atomic_int gpu_device;
};

/* Starts and stops the background thread (loop.c). */
hvd_status coord_loop_start(struct coord_state *s);
void coord_loop_join(struct coord_state *s);
/* Wakes the loop's driver (any thread). */
void coord_wake(struct coord_state *s);
/* A user thread waiting for h runs the loop itself until h completes, the
 * deadline passes, the job stops or hvd_shutdown begins, unless another
 * user thread drives (then it returns soon and h is waited for as usual). */
void coord_loop_drive(struct coord_state *s, struct hvd_handle_s *h, int64_t deadline_ns);
/* Whether this thread is running the loop (so it is in a completion callback). */
bool coord_loop_driving(void);
/* User threads driving the loop or asking to (tests wait on it). */
int coord_loop_drivers(const struct coord_state *s);
/* Has the background thread take over at once (hvd_shutdown). */
void coord_loop_unpark(struct coord_state *s);

/* Enqueue (api_ops.c uses it): validates locally, registers the name and
 * queues the entries; on failure nothing is queued and the entries are
 * destroyed. */
hvd_status coord_enqueue(struct coord_state *s, struct coord_entry **entries, size_t n);

/* Finishing entries (background thread): removes them from the in-flight
 * map and finishes their handle part. */
void coord_finish_entry(struct coord_state *s, struct coord_entry *e, hvd_status st,
                        const char *message);
/* The same for an entry already out of the map (coord_take_entries). */
void coord_complete_entry(struct coord_entry *e, hvd_status st, const char *message);
/* Takes the entries of set `set` named names[0 .. n) out of the in-flight
 * map, under one hold of the lock (NULL where this rank has none): the
 * caller completes each (background thread). */
void coord_take_entries(struct coord_state *s, int set, char *const *names, uint32_t n,
                        struct coord_entry **out);
/* Puts an entry back at the front of the queue; it stays in the in-flight
 * map (background thread: a lane's submission that goes to rank 0). */
void coord_requeue(struct coord_state *s, struct coord_entry *e);
/* Looks an entry up by set and name (background thread). */
struct coord_entry *coord_find_entry(struct coord_state *s, int set, const char *name);
/* Fails every in-flight entry and stops the job (background thread). */
void coord_stop(struct coord_state *s, hvd_status st, const char *message);

/* The published state, read-locked (lifecycle.c): NULL (and an error set) when
 * hvd is not initialized; coord_release ends the lock. */
struct coord_state *coord_acquire(void);
/* The same without an error (the queries that answer -1). */
struct coord_state *coord_acquire_quiet(void);
void coord_release(void);
/* coord_acquire without waiting and without an error: NULL when hvd is not
 * initialized or is being shut down. */
struct coord_state *coord_try_acquire(void);

/* The name of a rank's join request (one at a time per rank). */
#define COORD_JOIN_NAME "hvd.join"

/* Generated names (names.c): the next number of this kind in this set,
 * and, on a joined rank, a response that ran under a generated name
 * advances the counter past it. */
uint64_t coord_name_number(struct coord_state *s, int set, const char *kind);
void coord_names_seen(struct coord_state *s, int set, const char *name);

/* "<set>:<name>" keys of the in-flight map and the cache. */
size_t coord_key(char *out, size_t size, int set, const char *name, size_t len);
enum { COORD_KEY_MAX = COORD_NAME_MAX + 16 };

#endif /* HVD_COORD_H */
