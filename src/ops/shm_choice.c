/*
 * How a shared-memory allgather, broadcast or allreduce moves its bytes: copied
 * through the segment (the writer's copy in, every reader's copy out) or
 * read where they lie with single-copy reads (net_shm_read). Which is
 * faster is not fixed: a copy through the segment reads lines another core
 * just wrote, which costs what the caches allow (on the virtual machines
 * measured, 3 to 4 times more while both cores' private caches hold the
 * lines, and it changed with the host's placement of the vCPUs), while a
 * single-copy read pays a system call and the kernel's page lookups.
 * So member 0 times both, per collective and power-of-two size class, side
 * by side: while it explores, the ways alternate every BLOCK operations
 * until each has TRIAL timed ones (the first few of a block pay for the
 * switch and are not counted, nor are a class's first WARMUP operations),
 * so both are measured in the same minutes;
 * a machine whose speed changes from one minute to the next (as the
 * virtual machines measured do) moves both figures alike. (Trials one
 * after the other, each way's figure kept until its next trial, compared
 * figures from different machine states, and the first trial of a class
 * took the first, slowest operations.) A way's figure is the lower
 * quartile of its operations' time per byte (the longest any member took,
 * from what each reports with net_shm_report, since a broadcast's root
 * finishes long before its readers; or, back to back, the time from one
 * start to the next). The way chosen before stays unless the other's
 * figure is below SWITCH_MARGIN times its own. After EXPLORE_OPS
 * operations and EXPLORE_NS, member 0 explores again.
 * The choice reaches the others in the word member 0 publishes at every
 * barrier (net_shm_hint), one bit per kind and class, so every member takes
 * the same way without a message of its own. Sizes below the agreed
 * single-copy size (net_shm_read_from) always copy; so do outputs larger
 * than the cache, which member 0 does not time (they stream through the
 * segment, ops_copy_streaming).
 */
#include <stdlib.h>
#include <string.h>

#include "ops_private.h"

enum { CLASSES = 21 }; /* 1 KiB ... 1 GiB and up: 3 kinds fit in 64 bits */
/* Exploring, the ways alternate every BLOCK operations; the first SETTLE
 * of a run of one way are not counted: they pay for the change (copies
 * find the segment's lines in other caches after reads left them; a waiter
 * may be asleep), which a way that stays does not. A choice reaches the
 * members one operation late, which the runs absorb. */
#define EXPLORE_NS INT64_C(1000000000)
#define SWITCH_MARGIN 0.9
/* A class's first WARMUP operations are not timed: they touch its buffers
 * for the first time, and take several times longer for as many as eight
 * operations (page faults, cold caches). */
enum { TRIAL = 8, BLOCK = 8, SETTLE = 3, EXPLORE_OPS = 256, WARMUP = 8 };

struct way {
  float ns_per_byte[TRIAL]; /* this exploration's operations */
  int count;
};

struct size_class {
  struct way way[2]; /* copies, single-copy reads */
  bool settled;      /* false: exploring */
  int chosen;        /* the way settled on (0: copies) */
  int last;          /* the way of the last operation */
  int run;           /* operations in a row that took it */
  int seen;          /* operations of the class, up to WARMUP */
  uint64_t ops;      /* operations since exploring or settling began */
  int64_t since;     /* when it settled (member 0's clock) */
  int64_t started;   /* when the last operation started */
};

/* Member 0's figures for one group. */
struct ops_shm_figures {
  const struct net_shm *s;
  uint64_t hint; /* the choices, one bit per kind and class (1: single-copy reads) */
  struct size_class cls[OPS_SHM_KINDS][CLASSES];
};

static int size_class(size_t bytes) {
  int c = 0;
  while (c < CLASSES - 1 && (bytes >> (c + 10)) > 1)
    c++;
  return c;
}

static int hint_bit(int kind, int c) { return kind * CLASSES + c; }

/* The figures for s, the least recently added replaced when all are taken
 * (a group's figures are only estimates: losing them costs a few tries). */
static struct ops_shm_figures *figures(struct ops_ctx *o, const struct net_shm *s) {
  struct ops_shm_figures *f;

  for (int i = 0; i < OPS_SHM_FIGURES; i++) {
    if (o->figures[i] != NULL && o->figures[i]->s == s)
      return o->figures[i];
  }
  f = o->figures[o->next_figures];
  if (f == NULL && (f = malloc(sizeof(*f))) == NULL)
    return NULL;
  memset(f, 0, sizeof(*f));
  f->s = s;
  o->figures[o->next_figures] = f;
  o->next_figures = (o->next_figures + 1) % OPS_SHM_FIGURES;
  return f;
}

hvd_status ops_shm_choose(struct ops_ctx *o, struct net_shm *s, struct ops_shm_way *w,
                          int kind, size_t bytes, size_t host_bytes) {
  bool never = o->t.shm_single_copy == OPS_SINGLE_COPY_NEVER;
  size_t from = 0;
  hvd_status st;

  /* Member 0's "always" reaches the others with the agreement's barriers. */
  if (o->t.shm_single_copy == OPS_SINGLE_COPY_ALWAYS && net_comm_rank(net_shm_comm(s)) == 0)
    net_shm_hint(s, ~UINT64_C(0));
  st = net_shm_read_from(s, never ? 0 : o->t.shm_single_copy_bytes, &from);
  memset(w, 0, sizeof(*w));
  if (st != HVD_OK)
    return st;
  w->kind = kind;
  w->size_class = size_class(bytes);
  w->bytes = bytes;
  /* The way depends only on what every member agreed (the size, member
   * 0's word); whether to time it may differ, as the cache's size read
   * here could, and only member 0 learns from it. */
  w->reads = from > 0 && bytes >= from &&
             (net_shm_hint_seen(s) >> hint_bit(kind, w->size_class) & 1) != 0;
  w->stream = ops_streams(host_bytes);
  w->timed = from > 0 && bytes >= from && !w->stream;
  if (w->timed)
    w->start_ns = hvd_now_ns();
  return HVD_OK;
}

static int by_value(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* A way's figure: the lower quartile of its operations, which a preempted
 * rank or a waiter woken from sleep does not move. */
static double figure(const struct way *w) {
  float v[TRIAL];

  if (w->count == 0)
    return 0;
  memcpy(v, w->ns_per_byte, sizeof(float) * (size_t)w->count);
  qsort(v, (size_t)w->count, sizeof(float), by_value);
  return v[w->count / 4];
}

/* A member's report: what it timed (kind, class, way) and how long it took. */
static uint64_t report(const struct ops_shm_way *w, int64_t ns) {
  uint64_t capped = ns < (INT64_C(1) << 48) ? (uint64_t)ns : (UINT64_C(1) << 48) - 1;
  return (uint64_t)hint_bit(w->kind, w->size_class) << 49 | (uint64_t)w->reads << 48 | capped;
}

void ops_shm_chosen_done(struct ops_ctx *o, struct net_shm *s, const struct ops_shm_way *w) {
  int n = net_comm_size(net_shm_comm(s));
  struct ops_shm_figures *f;
  struct size_class *c;
  struct way *way;
  int64_t now, took;
  uint64_t bit, mine;
  bool reads;

  if (!w->timed || o->t.shm_single_copy == OPS_SINGLE_COPY_ALWAYS)
    return;
  now = hvd_now_ns();
  took = now - w->start_ns;
  mine = report(w, took);
  if (net_comm_rank(net_shm_comm(s)) != 0) {
    net_shm_report(s, mine);
    return;
  }
  if ((f = figures(o, s)) == NULL)
    return;
  /* The others' last reports of this kind, class and way: of this
   * operation, or of the last one like it where they have not finished. */
  for (int q = 1; q < n; q++) {
    uint64_t theirs = net_shm_report_of(s, q);
    if (theirs >> 48 == mine >> 48 && (int64_t)(theirs & ((UINT64_C(1) << 48) - 1)) > took)
      took = (int64_t)(theirs & ((UINT64_C(1) << 48) - 1));
  }
  c = &f->cls[w->kind][w->size_class];
  way = &c->way[w->reads];
  reads = c->chosen;
  if (c->seen < WARMUP) {
    c->seen++;
  } else if (!c->settled) {
    /* Counted unless it is among the first after a change of way. */
    c->run = c->ops > 0 && c->last == w->reads ? c->run + 1 : 0;
    if (c->run >= SETTLE && way->count < TRIAL) {
      /* Back to back, an operation overlaps the previous one's tail (the
       * readers' last copies): what a run of them costs is the time from
       * one start to the next, when that is less than one's latency. */
      if (w->start_ns - c->started < took)
        took = w->start_ns - c->started;
      way->ns_per_byte[way->count++] = (float)((double)took / (double)w->bytes);
    }
    c->ops++;
    if (c->way[0].count >= TRIAL && c->way[1].count >= TRIAL) {
      /* The other way must be clearly faster: noise alone does not switch. */
      double copying = figure(&c->way[0]), reading = figure(&c->way[1]);
      c->chosen = c->chosen ? copying > SWITCH_MARGIN * reading : reading < SWITCH_MARGIN * copying;
      c->settled = true;
      c->ops = 0;
      c->since = now;
      reads = c->chosen;
      HVD_LOG_DEBUG("shared-memory %ss of about %zu bytes: %s (copies %.3f ns/B, single-copy "
                    "reads %.3f ns/B)",
                    w->kind == OPS_SHM_ALLGATHER   ? "allgather"
                    : w->kind == OPS_SHM_BROADCAST ? "broadcast"
                                                   : "allreduce",
                    w->bytes, reads ? "single-copy reads" : "copies", copying, reading);
    } else {
      reads = (c->ops / BLOCK) % 2 != 0 ? !c->chosen : c->chosen;
    }
  } else if (++c->ops >= EXPLORE_OPS && now - c->since >= EXPLORE_NS) {
    c->settled = false;
    c->ops = 0;
    c->way[0].count = c->way[1].count = 0;
  }
  c->last = w->reads;
  c->started = w->start_ns;
  bit = UINT64_C(1) << hint_bit(w->kind, w->size_class);
  f->hint = reads ? f->hint | bit : f->hint & ~bit;
  net_shm_hint(s, f->hint);
}
