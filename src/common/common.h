/*
 * The common layer: status messages, logging, environment parsing, clocks,
 * buffers and a string map. Every other module builds on it; it uses libc only.
 *
 * Names: every function, variable or type that one file shares with
 * another carries its module's prefix: hvd_ (common, and the public API in
 * hvd.h), rdzv_ (rendezvous), net_ (transport), ops_, coord_, elastic_,
 * launch_, tune_, cuda_. Only hvd_ symbols leave libhvd.so (-fvisibility=hidden,
 * HVD_API); ctest symbols.prefixes checks both rules on every build.
 */
#ifndef HVD_COMMON_H
#define HVD_COMMON_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hvd/hvd.h"
#include "settings.h"

#define HVD_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define HVD_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* ---- errors (error.c) ----------------------------------------------------
 * Each thread keeps the status and message of its last failure. Functions set
 * it where the failure happens and return the status, so callers can write
 * `return hvd_error(HVD_ERR_IO, "open %s: %s", path, strerror(errno));`.
 */
enum { HVD_ERROR_MESSAGE_MAX = 1024 };

/* The arguments must not include hvd_last_error_message(); use
 * hvd_error_prefix to add context to the current message. */
hvd_status hvd_error(hvd_status status, const char *fmt, ...) HVD_PRINTF(2, 3);
/* Prepends "<context>: " to this thread's message; returns its status. */
hvd_status hvd_error_prefix(const char *fmt, ...) HVD_PRINTF(1, 2);
hvd_status hvd_error_status(void);
void hvd_error_clear(void);

/* ---- logging (log.c) ------------------------------------------------------
 * One line per call on stderr, written with a single write(2) so that lines
 * of concurrent threads and processes do not interleave:
 *   [2026-11-21 19:30:01.123456: W rank 3 client.c:120] message
 * HOROVOD_LOG_LEVEL picks the threshold (default warning) and
 * HOROVOD_LOG_HIDE_TIME drops the timestamp.
 */
enum hvd_log_level {
  HVD_LOG_TRACE = 0,
  HVD_LOG_DEBUG,
  HVD_LOG_INFO,
  HVD_LOG_WARNING,
  HVD_LOG_ERROR,
  HVD_LOG_FATAL,
};

/* Reads HOROVOD_LOG_LEVEL and HOROVOD_LOG_HIDE_TIME; rejects bad values. */
hvd_status hvd_log_configure_from_env(void);
void hvd_log_set_level(enum hvd_log_level level);
enum hvd_log_level hvd_log_get_level(void);
void hvd_log_set_hide_time(bool hide);
/* Every line names the rank once it is known, otherwise the program name. */
void hvd_log_set_rank(int rank);
void hvd_log_set_name(const char *program);
bool hvd_log_enabled(enum hvd_log_level level);
void hvd_log_write(enum hvd_log_level level, const char *file, int line, const char *fmt, ...)
    HVD_PRINTF(4, 5);

#define HVD_LOG(level, ...)                                      \
  do {                                                           \
    if (hvd_log_enabled(level))                                  \
      hvd_log_write((level), __FILE__, __LINE__, __VA_ARGS__);   \
  } while (0)
#define HVD_LOG_TRACE(...) HVD_LOG(HVD_LOG_TRACE, __VA_ARGS__)
#define HVD_LOG_DEBUG(...) HVD_LOG(HVD_LOG_DEBUG, __VA_ARGS__)
#define HVD_LOG_INFO(...) HVD_LOG(HVD_LOG_INFO, __VA_ARGS__)
#define HVD_LOG_WARN(...) HVD_LOG(HVD_LOG_WARNING, __VA_ARGS__)
#define HVD_LOG_ERROR(...) HVD_LOG(HVD_LOG_ERROR, __VA_ARGS__)
#define HVD_LOG_FATAL(...) HVD_LOG(HVD_LOG_FATAL, __VA_ARGS__)

/* ---- parsing (parse.c) ----------------------------------------------------
 * Strict parsers: the whole text must be the value (no trailing bytes, no
 * empty text), and out-of-range values fail instead of saturating.
 * They return false without touching *out on failure.
 */
bool hvd_parse_int64(const char *text, size_t len, int64_t *out);
bool hvd_parse_double(const char *text, double *out);
bool hvd_parse_bool(const char *text, bool *out);
/* HVD_PORT_RANGE's syntax: "A" or "A-B", 1 <= A <= B <= 65535; an error
 * naming the variable otherwise. */
hvd_status hvd_parse_port_range(const char *text, int *lo, int *hi);

/* ---- environment (env.c) --------------------------------------------------
 * Raw text by name. hvd's own variables are read through the settings
 * table (settings.h), which parses and checks them; these serve it, and the
 * launch module's reads of a launcher's variables (SLURM_*, RANK).
 */
/* Returns the value, or NULL when unset or empty: the environment's, else
 * the one provided (below). */
const char *hvd_env_str(const char *name);
/* The environment's value alone, or NULL when unset or empty. */
const char *hvd_env_real(const char *name);
/* A value for a variable the environment does not set: the launch module
 * translates what Slurm or torchrun gave this process into hvd's own
 * variables this way (the environment itself is left alone, so children
 * do not inherit them). Thread-safe; a value handed out stays valid. */
hvd_status hvd_env_provide(const char *name, const char *value);

/* ---- clocks and deadlines (clock.c) --------------------------------------
 * Deadlines are absolute CLOCK_MONOTONIC nanoseconds; HVD_NO_DEADLINE never
 * passes.
 */
#define HVD_NO_DEADLINE INT64_MAX

int64_t hvd_now_ns(void);
/* The same clock as of its last tick (milliseconds behind, never ahead),
 * for a third of the cost: for timers of seconds on a hot path. */
int64_t hvd_coarse_now_ns(void);
int64_t hvd_deadline_after_ms(int64_t ms);
/* Milliseconds left until the deadline, rounded up, never negative. */
int64_t hvd_remaining_ms(int64_t deadline_ns);
void hvd_sleep_ns(int64_t ns);
/* Condition variables in hvd wait on CLOCK_MONOTONIC. */
int hvd_cond_init(pthread_cond_t *cond);
/* Waits until signalled or the deadline; returns ETIMEDOUT at the deadline. */
int hvd_cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *mu, int64_t deadline_ns);
/* A spinning thread's turn (a sched_yield()) that took longer than this
 * lost its core to another process for a scheduler slice: spinning on a
 * contended core costs milliseconds, sleeping costs a wake-up. */
#define HVD_SPIN_LOST_CORE_NS INT64_C(500000)

/* ---- growable capped buffer (buf.c) --------------------------------------
 * Grows on demand up to `max` bytes; growth beyond fails with
 * HVD_ERR_TOO_LARGE before anything is allocated. The data is always
 * NUL-terminated (not counted in len) so text can be used directly.
 * A zeroed struct is a valid empty buffer with no cap.
 */
struct hvd_buf {
  char *data;
  size_t len;
  size_t cap;
  size_t max; /* 0: no cap */
};

void hvd_buf_init(struct hvd_buf *b, size_t max);
void hvd_buf_fini(struct hvd_buf *b);
void hvd_buf_reset(struct hvd_buf *b);
hvd_status hvd_buf_reserve(struct hvd_buf *b, size_t extra);
/* Bytes that can be appended without growing the buffer, within its cap. */
size_t hvd_buf_room(const struct hvd_buf *b);
hvd_status hvd_buf_append(struct hvd_buf *b, const void *data, size_t len);
hvd_status hvd_buf_printf(struct hvd_buf *b, const char *fmt, ...) HVD_PRINTF(2, 3);
/* Hands the data to the caller (who frees it) and leaves the buffer empty;
 * NULL if nothing was ever stored. */
char *hvd_buf_detach(struct hvd_buf *b, size_t *len);

/* Growing arrays: room for `need` elements of `size` bytes in the array
 * that `array` points to (a T **), whose capacity is *cap elements. The
 * capacity doubles from at least `first`; the contents are kept. On
 * HVD_ERR_NO_MEMORY (or an overflow) the array and *cap are unchanged. */
hvd_status hvd_array_reserve(void *array, size_t *cap, size_t need, size_t size, size_t first);

/* ---- string-keyed hash map (map.c) ---------------------------------------
 * Open addressing with linear probing. Keys are byte strings copied into the
 * map; values are caller pointers. Not thread-safe.
 */
struct hvd_map_slot;
enum { HVD_MAP_SPARE_KEYS = 8 };
struct hvd_map {
  struct hvd_map_slot *slots;
  size_t cap; /* a power of two, or 0 */
  size_t count;
  size_t tombstones;
  /* Blocks of removed short keys, for the next ones: a map of operations in
   * flight gains and loses a key per operation. */
  char *spare_keys[HVD_MAP_SPARE_KEYS];
  int nspare_keys;
};

struct hvd_map_iter {
  size_t next;
};

void hvd_map_init(struct hvd_map *m);
/* Frees the map's own memory; values are the caller's to free first. */
void hvd_map_fini(struct hvd_map *m);
void *hvd_map_get(const struct hvd_map *m, const char *key, size_t key_len);
/* Inserts or replaces; *old (if not NULL) receives the replaced value or NULL. */
hvd_status hvd_map_put(struct hvd_map *m, const char *key, size_t key_len, void *value,
                       void **old);
/* Removes the key and returns its value, or NULL if absent. */
void *hvd_map_remove(struct hvd_map *m, const char *key, size_t key_len);
/* Visits every entry; the map must not change during the walk, except through
 * hvd_map_iter_remove of the entry just returned. */
bool hvd_map_iter_next(const struct hvd_map *m, struct hvd_map_iter *it, const char **key,
                       size_t *key_len, void **value);
void hvd_map_iter_remove(struct hvd_map *m, struct hvd_map_iter *it);

/* ---- little-endian wire integers ------------------------------------------
 * Every integer hvd puts on a wire is fixed width and little-endian. One
 * unaligned load or store each (memcpy; byte-swapped on a big-endian host):
 * byte loops were tens of instructions a field, and every message has many.
 */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HVD_LE16(v) __builtin_bswap16(v)
#define HVD_LE32(v) __builtin_bswap32(v)
#define HVD_LE64(v) __builtin_bswap64(v)
#else
#define HVD_LE16(v) (v)
#define HVD_LE32(v) (v)
#define HVD_LE64(v) (v)
#endif
static inline void hvd_put_le16(unsigned char *p, uint16_t v) {
  v = HVD_LE16(v);
  memcpy(p, &v, sizeof(v));
}
static inline void hvd_put_le32(unsigned char *p, uint32_t v) {
  v = HVD_LE32(v);
  memcpy(p, &v, sizeof(v));
}
static inline void hvd_put_le64(unsigned char *p, uint64_t v) {
  v = HVD_LE64(v);
  memcpy(p, &v, sizeof(v));
}
static inline uint16_t hvd_get_le16(const unsigned char *p) {
  uint16_t v;
  memcpy(&v, p, sizeof(v));
  return HVD_LE16(v);
}
static inline uint32_t hvd_get_le32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, sizeof(v));
  return HVD_LE32(v);
}
static inline uint64_t hvd_get_le64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, sizeof(v));
  return HVD_LE64(v);
}

/* ---- shapes (dtype.c, beside hvd_dtype_size) ------------------------------ */
/* Elements of a tensor of this shape (the product; 1 for none); false,
 * with *out untouched, on a negative dimension or overflow. */
bool hvd_shape_elements(const int64_t *shape, int ndims, int64_t *out);

/* ---- small helpers (util.c) ----------------------------------------------- */
/* Copies exactly len bytes (NULs included) and adds a terminating NUL. */
char *hvd_strndup(const char *s, size_t len);
/* Copies text for a message, control characters (an escape sequence a
 * file or variable carried to the terminal) replaced by '?'; cut to fit. */
void hvd_printable(const char *text, char *out, size_t size);
/* Zeroed memory for n items, like calloc, but through malloc: glibc's
 * calloc bypasses the per-thread cache, which makes it several times
 * slower for the small blocks every operation allocates. */
void *hvd_zalloc(size_t n, size_t size);
/* Constant-time comparison for secrets. */
bool hvd_secure_equal(const void *a, size_t a_len, const void *b, size_t b_len);
/* A random job token (getrandom): HVD_TOKEN_HEX_DIGITS hex digits and a
 * NUL, in out[HVD_TOKEN_HEX_DIGITS + 1]. */
enum { HVD_TOKEN_HEX_DIGITS = 48 };
hvd_status hvd_random_token(char *out);
/* Raises the soft open-file limit to the hard one (a flood of connections
 * must meet the real ceiling, not the 1,024 default); returns the soft
 * limit now in force, 0 when unknown, UINT64_MAX for unlimited. */
uint64_t hvd_raise_fd_limit(void);

#endif /* HVD_COMMON_H */
