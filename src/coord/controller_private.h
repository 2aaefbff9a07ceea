/* The coordinator's internals, shared by controller.c, dispatch.c and stall.c. */
#ifndef HVD_COORD_CONTROLLER_PRIVATE_H
#define HVD_COORD_CONTROLLER_PRIVATE_H

#include "coord.h"

/* One operation that some ranks have submitted. */
struct pending {
  struct coord_request first; /* the first submission; its name is name_buf */
  int set_size;
  unsigned char *submitted;   /* bit per set rank: submitted_here, or allocated for large sets */
  unsigned char submitted_here[64];
  int count;
  int64_t *elements;          /* ALLGATHER: elements per set rank */
  char *error;                /* the first disagreement, "<op> '<name>': ..." */
  uint8_t error_status;
  int64_t first_ns;
  struct pending *prev, *next; /* the table's list, in arrival order */
  struct pending *next_ready;
  bool in_table;
  int bit; /* kept in by_bit[bit] while in the table (in `table` when -1); once out, the bit it
           * had: a hint for its response (checked before use) */
  bool prepared; /* SET_REMOVE: the set's operations were failed already */
  /* ALLREDUCE inline: each set rank's input (set_size x inline_len); unusable
   * once a submission came without it (then the collective runs). */
  unsigned char *inline_vals;
  size_t inline_cap; /* bytes inline_vals holds (it is kept across reuses) */
  uint32_t inline_len;
  bool inline_broken;
  /* first.name's bytes, kept across reuses too: the request of a cache hit
   * or of rank 0 itself, which the table borrows, is copied without an
   * allocation. */
  char *name_buf;
  size_t name_cap;
};

/* The coordinator's view of a process set. */
struct ctl_set {
  bool used;
  int32_t *ranks; /* sorted */
  int size;
};

/* Ready members of a group, waiting for the rest. */
struct group_wait {
  struct pending **members;
  int count, size;
};

struct coord_controller {
  struct coord_state *s;
  int size; /* ranks in the job */

  struct hvd_map table; /* "<set>:<name>" -> pending, for names without an active cache bit */
  /* Active cache bit -> its operation's pending entry: the table for names
   * the cache knows, looked up without a key (NULL until first used). A
   * retired bit's entry moves to `table` (coord_ctl_retire). */
  struct pending **by_bit;
  struct pending *head, *tail; /* every pending in the table */
  size_t npending;
  struct pending *ready_head, *ready_tail;
  size_t nready;
  size_t ready_bytes;
  int64_t oldest_ready_ns;
  struct hvd_map groups; /* "<set>:<group>" -> group_wait */

  struct ctl_set *sets;
  int nsets;

  bool *joined; /* by global rank */
  int njoined;
  int last_joined;
  bool join_due; /* every rank has joined: send the JOIN response */

  uint64_t *acks; /* by global rank: the last response list it applied */
  uint64_t next_seq;
  int32_t *retired; /* cache bits to announce in the next list */
  uint32_t nretired;
  size_t retired_cap;
  /* dispatch.c's single responses and their sizes while it builds a list,
   * kept across lists (grown, never shrunk; empty between lists) */
  struct coord_response *singles;
  size_t *single_bytes;
  size_t singles_cap, single_bytes_cap;
  /* dispatch.c's lists of cached inline results (light_list): the arrays
   * the list borrows, kept across lists */
  struct coord_response *light;
  int32_t *light_bits;
  unsigned char *light_data; /* COORD_INLINE_MAX a response */
  int32_t *light_lanes;      /* the lanes such a list grants */
  size_t light_cap, light_bits_cap, light_data_cap, light_lanes_cap;

  /* Lanes (lanes.c), the granting side: per cache bit below COORD_LANES,
   * the epoch of its last grant (0: none since its last negotiated
   * completion) and how many negotiated completions to let pass before the
   * next (backoff after a lane closed early). NULL: no lanes. */
  struct lane_grant {
    uint64_t epoch;
    uint32_t skip;
    uint8_t level;
  } *lane_grants;

  bool shutdown;      /* a rank asked to shut down */
  int shutdown_rank;  /* the first that asked: named in the list every rank stops on */
  bool aborting;      /* a rank reported a failure */
  bool cache_paused;  /* the autotuner turned the response cache off */
  uint8_t abort_status;
  char abort_msg[HVD_ERROR_MESSAGE_MAX];

  int64_t next_stall_check;

  /* Finished entries kept for the next operations (linked by next),
   * emptied but for their buffers: an operation's entry is a zeroed
   * allocation of half a kilobyte, its inline inputs and name others. */
  struct pending *spares;
  int nspares;
};

/* Sizes a pending response moves, for fusion. */
size_t coord_ctl_pending_bytes(const struct pending *p);
/* The set rank of a global rank, -1 if not a member. */
int coord_ctl_set_rank(const struct ctl_set *set, int rank);
/* Queues a cache bit for the next list's retired list. */
void coord_ctl_retire(struct coord_controller *c, int bit);
/* Whether every non-joined member has submitted. */
bool coord_ctl_is_ready(const struct coord_controller *c, const struct pending *p);
/* Appends p to the ready FIFO. */
void coord_ctl_push_ready(struct coord_controller *c, struct pending *p);
/* Removes p from the table (not from the ready list). */
void coord_ctl_unlink(struct coord_controller *c, struct pending *p);
/* A new, empty entry (NULL when out of memory). */
struct pending *coord_ctl_pending_new(struct coord_controller *c);
void coord_ctl_pending_destroy(struct pending *p);
/* Destroys p's contents and keeps p for coord_ctl_pending_new. */
void coord_ctl_pending_release(struct coord_controller *c, struct pending *p);
/* The coordinator's copy of the registry, changed as responses are built. */
hvd_status coord_ctl_set_added(struct coord_controller *c, int id, const int32_t *ranks, int n);
void coord_ctl_set_removed(struct coord_controller *c, int id);

#endif
