//===--- remote.h - the fleet tier: bytes by key on a Redis server (internal) ===//
//
// "Get bytes by key / put bytes by key" on a Redis server shared by many machines,
// through hiredis, with one rule above all: the remote tier is never a reason for a run
// to fail or to wait long. Knows nothing of entries, graphs or signatures: the cache
// (cache/tier.c) verifies every value it gets before anything uses it.
//
// - Every connect and command has a time limit (per socket read or write).
// - A circuit breaker: a timed-out command pauses the tier at once (a slow server costs
//   the limit once, not once per call); other failures (refused connection, a server
//   error, a dropped connection) pause it after `failures_to_pause` in a row. While
//   paused every call is skipped (counted) without touching the network; after
//   `pause_ms` the next call tries again. Each pause is logged once.
// - Puts are asynchronous: a background thread with its own connection sends them in
//   order; a full queue (by bytes) drops new puts (counted). Closing waits for the
//   queue while the server answers, and drops what is left once the tier pauses.
// - A get reads at most `max_bytes` + 1 bytes of a value (GETRANGE): a larger value is
//   reported as oversize without being transferred whole.
// - A fleet lock per key (SET NX PX with a random token, released by a
//   compare-and-delete queued after the holder's put), so machines sharing the server
//   compile each key once.
//
// Keys: "<prefix>k:<32 hex>" for values, "<prefix>lock:<32 hex>" for locks.
// Thread-safe: one handle serves every thread of a context. Without hiredis at build
// time (JITML_HAVE_HIREDIS 0) open reports JIT_UNAVAILABLE.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_CACHE_REMOTE_H_
#define JITML_CACHE_REMOTE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "base/status.h"

typedef struct jit__remote jit__remote;

typedef struct jit__remote_options {
  // redis://[[user]:password@]host[:port][/db], or unix:///path/to/socket[?db=N].
  const char *url;
  const char *prefix;           // NULL: "jitml:"
  uint32_t connect_timeout_ms;  // 0: 250
  uint32_t timeout_ms;          // 0: 500
  uint64_t ttl_s;               // 0: values never expire
  uint64_t max_bytes;           // largest value put or accepted; 0: 64 MiB
  uint32_t failures_to_pause;   // 0: 3
  uint32_t pause_ms;            // 0: 30000
  uint64_t queue_max_bytes;     // bytes of puts waiting; 0: 256 MiB
  uint32_t lock_ttl_ms;         // a fleet lock's life if its holder dies; 0: 60000
  jit__logger logger;
} jit__remote_options;

typedef struct jit__remote_stats {
  uint64_t hits, misses;
  uint64_t errors;      // commands that failed or timed out, connects that failed
  uint64_t skipped;     // calls not made because the tier was paused
  uint64_t oversize;    // gets of values over max_bytes
  uint64_t puts, puts_dropped, bytes_read, bytes_written;
  uint64_t pauses;      // times the breaker opened
} jit__remote_stats;

// Parses the URL and sets up the handle; connects lazily (no network here).
// JIT_INVALID_ARGUMENT for a malformed URL (the message says which part),
// JIT_UNAVAILABLE for rediss:// (this hiredis has no TLS) or a build without hiredis.
jit_status jit__remote_open(const jit__remote_options *options, jit__remote **out);
// Sends what the put queue holds (while the server answers), then closes. NULL: no-op.
void jit__remote_close(jit__remote *remote);

// The URL with any password replaced by "***".
const char *jit__remote_url(const jit__remote *remote);
// "not connected yet", "connected", "failing: <why> (...)", "paused for N ms more
// after E errors: <why>" or "to be tried again (...)", into `out`.
void jit__remote_state(jit__remote *remote, char *out, size_t size);
void jit__remote_get_stats(jit__remote *remote, jit__remote_stats *out);

typedef enum jit__remote_got {
  JIT__REMOTE_HIT,       // *bytes (malloc'ed, the caller frees) / *size set
  JIT__REMOTE_MISS,
  JIT__REMOTE_OVERSIZE,  // a value over max_bytes (not transferred whole)
  JIT__REMOTE_WRONG_TYPE,  // the key holds no string (a list, a set, ...)
  JIT__REMOTE_FAILED,    // paused, or the command failed (counted, logged at a pause)
  JIT__REMOTE_NOMEM,
} jit__remote_got;

jit__remote_got jit__remote_get(jit__remote *remote, const uint8_t key[16], uint8_t **bytes,
                                size_t *size);

// Queues a put of `bytes` (malloc'ed; taken in every case) and returns at once.
// Dropped (counted) when over max_bytes, when the queue is full or while paused.
void jit__remote_put(jit__remote *remote, const uint8_t key[16], uint8_t *bytes, size_t size);

// Synchronous forms for tools (jitml cache push/pull): JIT_UNAVAILABLE when the tier is
// paused or the command fails (the message says why). put_now does not take `bytes`.
jit_status jit__remote_put_now(jit__remote *remote, const uint8_t key[16],
                               const uint8_t *bytes, size_t size);
jit_status jit__remote_exists(jit__remote *remote, const uint8_t key[16], bool *exists);
// Calls fn for every value key under the prefix (SCAN; a key may come twice).
typedef bool (*jit__remote_key_fn)(void *user, const uint8_t key[16]);
jit_status jit__remote_scan(jit__remote *remote, jit__remote_key_fn fn, void *user);

// Asks the server (PING) so that jit__remote_state tells how it is now; skipped while
// paused. True when it answered.
bool jit__remote_ping(jit__remote *remote);

// The fleet lock of `key`. Returns true when this process now holds it (release with
// jit__remote_unlock, which is queued behind this process's puts, so the value lands
// before the lock goes). Otherwise returns false: the value appeared, the holder
// released the lock, `wait_ms` passed, or the tier failed; the caller looks again
// and compiles if still missing.
typedef struct jit__remote_token {
  char text[33];
} jit__remote_token;
bool jit__remote_lock(jit__remote *remote, const uint8_t key[16], int wait_ms,
                      jit__remote_token *token);
void jit__remote_unlock(jit__remote *remote, const uint8_t key[16],
                        const jit__remote_token *token);

#endif  // JITML_CACHE_REMOTE_H_
