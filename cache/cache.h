//===--- cache.h - the on-disk kernel cache (internal) ---------------------===//
//
// "Get bytes by key / put bytes by key", verified. Knows nothing of MLIR, graphs or
// devices: an entry is a 128-bit key, a payload kind, opaque metadata and payload
// bytes, and a text of the key's components (so a miss can be explained). A hit never
// creates an MLIR context.
//
// Layout: one file per entry, <dir>/<2 hex>/<32 hex>.jitk, written to a temp file in
// the same directory, fsync'ed, then renamed into place (readers never see a partial
// file and take no lock). Each file starts with a header: magic, format version, key,
// payload kind, lengths and an XXH3-128 checksum of everything after the header; every
// load verifies all of it before the bytes leave this module. A bad entry is removed,
// counted and logged, and reported as a miss. (The byte layout is in cache/internal.h;
// temp files are "<dir>/<2 hex>/.tmp-<32 hex>-XXXXXX", flock'ed by their writer.)
//
// Per-key advisory file locks (<dir>/locks/<32 hex>.lock, flock) let concurrent
// processes compile each key once: the first takes the lock and compiles, the others
// wait (bounded) and then find the entry. Eviction (size limit, LRU by access time,
// optional max age) runs from puts, never on a hit: at most every 5 minutes per process
// and only if no process pruned in that time (<dir>/.last_prune), or at once after a
// process wrote a tenth of the limit. It tolerates concurrent readers (an evicted
// entry just becomes a miss).
//
// A cache that cannot be used (missing/read-only/full directory, unsafe permissions)
// never fails a run: the handle goes "disabled" (everything misses, puts are dropped)
// and logs the reason once.
//
// Thread-safe: one handle may be used from many threads.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_CACHE_CACHE_H_
#define JITML_CACHE_CACHE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/image.h"
#include "base/log.h"
#include "cache/remote.h"
#include "cache/sign.h"
#include "jitml.h"

// 2: CPU entries' metadata is an artifact record (cache/artifact.h); 3: every entry
// has its images as parts and GPU plans as record sections (artifact version 2). Entries of
// another version are foreign: a get removes and counts them, and the kernel is
// recompiled.
#define JIT__CACHE_FORMAT_VERSION 3

// A kernel's payload parts are its images (base/image.h), of the same values.
typedef enum jit__payload_kind {
  JIT__PAYLOAD_CPU_OBJECT = JIT__IMAGE_HOST_OBJECT,  // ELF object for the host CPU
  JIT__PAYLOAD_PTX = JIT__IMAGE_PTX,
  JIT__PAYLOAD_CUBIN = JIT__IMAGE_CUBIN,
  JIT__PAYLOAD_SPIRV = JIT__IMAGE_SPIRV,
  JIT__PAYLOAD_VK_PIPELINE_CACHE = 5,
  JIT__PAYLOAD_HOT_LIST = 6,  // a graph's hot bindings (jit/hot.c), text
} jit__payload_kind;

typedef struct jit__cache jit__cache;

typedef struct jit__cache_options {
  // As jit_options.cache_dir: NULL = $JITML_CACHE_DIR, else $XDG_CACHE_HOME/jitml,
  // else $HOME/.cache/jitml; "" = disabled.
  const char *dir;
  uint64_t max_bytes;          // 0: $JITML_CACHE_MAX_BYTES, else 1 GiB
  uint64_t max_age_s;          // 0: none
  bool allow_shared_readonly;  // accept a root-owned dir we cannot write (read-only)
  // Bundle import accepts only bundles signed by one of these (copied); NULL or none:
  // any intact bundle, signed or not.
  const jit__trusted_keys *trusted;
  jit__logger logger;  // the context's (fn NULL: silent)
  // The fleet tier behind the disk (cache/tier.c; NULL: none). It needs an enabled disk
  // cache: with the disk cache off it is not opened (logged).
  const jit__remote_options *remote;
  const uint8_t *remote_secret;  // signs every entry pushed (copied); NULL: unsigned
  int remote_lock_wait_ms;       // fleet lock wait of jit__cache_lock_fleet; < 0: none
  // Test hook: if non-zero and smaller than a put's payload, that put kills the
  // process (raise(SIGKILL)) after writing this many payload bytes to the temp file,
  // to simulate a crash mid-write.
  uint64_t fault_kill_after_bytes;
} jit__cache_options;

typedef struct jit__cache_stats {
  uint64_t hits, misses, puts, bytes_written, bytes_read, evictions, bad_entries,
      lock_timeouts;
  uint64_t puts_dropped;  // puts not stored: disabled, read-only, or a write failed
  // The fleet tier: values accepted (verified and stored), values refused (damaged,
  // foreign, another key's, oversize, not a string, unsigned or untrusted), and the
  // client's own counters (its `hits` counts values received, before verification).
  uint64_t remote_hits, remote_rejected;
  jit__remote_stats remote;
} jit__cache_stats;

// What an entry holds. On put, the caller fills it; on get, the cache fills it with
// malloc'ed buffers the caller frees with jit__cache_entry_release.
typedef struct jit__cache_entry {
  uint8_t key[16];
  jit__payload_kind kind;
  void *meta;              // opaque record (entry point, argument layout, launch dims)
  size_t meta_size;
  void *payload;           // object / PTX / cubin / SPIR-V bytes
  size_t payload_size;
  char *components;        // "name=value\n" lines the key was hashed from
} jit__cache_entry;

void jit__cache_entry_release(jit__cache_entry *entry);

// Opens (creating 0700 if needed, parents too) the cache.
// A remote tier in the options whose URL is malformed (JIT_INVALID_ARGUMENT) or
// unavailable in this build (JIT_UNAVAILABLE) fails the open. Returns NULL status and a
// handle in every case but out-of-memory (JIT_RESOURCE_EXHAUSTED) or a NULL
// out_cache (JIT_INVALID_ARGUMENT); an unusable directory gives a disabled handle and
// one log line saying why. Refused (disabled): a directory writable by group or
// others, or owned by another user, except a root-owned one with
// allow_shared_readonly, which is used read-only; so is our own directory when it is
// not writable. jit__cache_dir reports the absolute directory (or "" when disabled).
jit_status jit__cache_open(const jit__cache_options *options, jit__cache **out_cache);
void jit__cache_close(jit__cache *cache);
bool jit__cache_enabled(const jit__cache *cache);
const char *jit__cache_dir(const jit__cache *cache);      // "" when disabled
const char *jit__cache_disabled_reason(const jit__cache *cache);  // NULL if enabled
// True for an enabled cache that only serves hits (a shared root-owned directory, or
// one this process cannot write): puts are dropped.
bool jit__cache_read_only(const jit__cache *cache);

// Writes `key` as 32 lowercase hex digits and a NUL (the entry's file name stem).
void jit__cache_key_hex(const uint8_t key[16], char out[33]);

// Looks `key` up. On a verified hit returns NULL with *found = true and `out` filled
// (the caller releases it; `meta`/`payload` are NULL when their size is 0,
// `components` is always a NUL-terminated string) and stamps the entry's access time
// for LRU. A miss, or a bad entry (removed, counted, logged; this includes a file not
// owned by the directory's owner or writable by group/others), returns NULL with
// *found = false. Non-NULL only for out-of-memory (JIT_RESOURCE_EXHAUSTED) or NULL
// arguments (JIT_INVALID_ARGUMENT). Takes no lock.
jit_status jit__cache_get(jit__cache *cache, const uint8_t key[16],
                          jit__cache_entry *out, bool *found);

// As jit__cache_get, then on a miss through the fleet tier (cache/tier.c): a value is
// verified like an entry file (header, key echo, format version, length, checksum, a
// kernel's kind, and the signature when keys are trusted), stored on disk and returned.
// A refused value is counted, logged and a miss; a failing tier is a miss.
jit_status jit__cache_fetch(jit__cache *cache, const uint8_t key[16],
                            jit__cache_entry *out, bool *found);

// Stores `entry` atomically (temp + fsync + rename, 0600), replacing any entry of the
// key. `components` (may be NULL) is stored up to its NUL. Failures (disabled,
// read-only, full disk) are logged once, counted in puts_dropped, and return NULL: the
// cache is best effort. JIT_INVALID_ARGUMENT only for caller bugs (NULL entry, unknown
// kind, a size without a buffer). May prune afterwards (see the top of this file).
// A kernel's entry is also queued for the fleet tier (signed when a secret is set),
// even when the disk put is dropped.
jit_status jit__cache_put(jit__cache *cache, const jit__cache_entry *entry);

// Queues the disk entry of `key` (stored by another process: the isolation worker)
// for the fleet tier. No-op without a tier or an entry.
void jit__cache_publish(jit__cache *cache, const uint8_t key[16]);

// The tier's URL (password hidden) and its state after asking the server (PING, unless
// paused), or NULL when there is none; `state` gets "off: <why>" then.
const char *jit__cache_remote(jit__cache *cache, char *state, size_t state_size);
// Whole-cache transfers for tools: push every valid disk entry the server lacks; pull
// every server value missing from disk (verified as in a fetch). `progress` (may be
// NULL) is called after each entry with (done, total). JIT_UNAVAILABLE without a tier
// or when the server fails (what was moved by then stays).
typedef void (*jit__cache_progress_fn)(void *user, uint64_t done, uint64_t total);
jit_status jit__cache_push_all(jit__cache *cache, jit__cache_progress_fn progress, void *user,
                               uint64_t *pushed, uint64_t *present);
jit_status jit__cache_pull_all(jit__cache *cache, jit__cache_progress_fn progress, void *user,
                               uint64_t *pulled, uint64_t *rejected);

// Per-key cross-process lock. Waits at most `timeout_ms` (<= 0: one try); *acquired
// says whether the lock is held (false after a timeout, counted in lock_timeouts, or
// on a disabled or read-only cache: compile anyway). Each call opens its own lock
// file description, so threads of one process exclude each other too. Release with
// jit__cache_unlock (also when not acquired: it is then a no-op, as is a second call).
typedef struct jit__cache_lock {
  int fd;
  jit__cache *cache;   // set when a fleet lock is held
  uint8_t key[16];
  jit__remote_token token;
} jit__cache_lock;
void jit__cache_lock_key(jit__cache *cache, const uint8_t key[16], int timeout_ms,
                         jit__cache_lock *out_lock, bool *acquired);
// As jit__cache_lock_key, then, with a fleet tier, its lock of `key` across machines
// (waiting up to the remote_lock_wait_ms of the options while another machine compiles
// it; the caller looks again either way). For kernels, whose entries the tier shares.
void jit__cache_lock_fleet(jit__cache *cache, const uint8_t key[16], int timeout_ms,
                           jit__cache_lock *out_lock, bool *acquired);
void jit__cache_unlock(jit__cache_lock *lock);

// Calls `fn` for each valid entry, in no particular order (header read and checked,
// meta and components loaded; payload not loaded, so `payload` is NULL and
// `payload_size` is its length; the checksum is not verified). An entry whose header
// is bad is removed and counted as in a get. Stops when fn returns false. `path` is
// the entry's file; `atime` (seconds; last use) and `size` from stat; all borrowed for
// the call. Returns JIT_UNAVAILABLE on a disabled cache, JIT_CACHE_ERROR if the
// directory cannot be read.
typedef bool (*jit__cache_visit_fn)(void *user, const jit__cache_entry *entry,
                                    const char *path, uint64_t size, int64_t atime);
jit_status jit__cache_list(jit__cache *cache, jit__cache_visit_fn fn, void *user);

// Verifies every entry fully (checksum included), removing bad ones; counts in *bad.
jit_status jit__cache_verify(jit__cache *cache, uint64_t *checked, uint64_t *bad);
// Applies the size/age limits now (the cache also does this by itself, rate-limited):
// entries unused for max_age_s go, and past 90% of max_bytes the least recently used
// go until 90% is left. Also removes temp files of dead writers and old unheld lock
// files. JIT_CACHE_ERROR on a read-only cache.
jit_status jit__cache_prune(jit__cache *cache, uint64_t *evicted);
// Removes every entry (and dead writers' temp files and unheld lock files). A put
// in flight in another process may still land afterwards.
jit_status jit__cache_clear(jit__cache *cache, uint64_t *removed);

void jit__cache_get_stats(jit__cache *cache, jit__cache_stats *out);

// Bundles: every valid entry plus a manifest in one file (a deployment ships a
// prewarmed cache to another machine of the same target; layout in cache/bundle.c).
// Export writes the bundle atomically (temp + rename) and skips (removes) bad entries.
// Import verifies the whole bundle before storing anything: a damaged bundle, or one
// from another format version, is refused with JIT_CACHE_ERROR and imports nothing.
// Imported entries replace existing ones of the same key. With `secret` (a key of
// cache/sign.h) the bundle is signed. A cache opened with trusted keys imports only
// bundles signed by one of them (an unsigned one, one signed by another key or altered
// after signing is refused with JIT_CACHE_ERROR); without, a signed bundle's signature
// is still checked against the key it names (integrity only).
jit_status jit__cache_export(jit__cache *cache, const char *bundle_path,
                             const uint8_t *secret, uint64_t *count);
jit_status jit__cache_import(jit__cache *cache, const char *bundle_path, uint64_t *count);

// A stable identity of the running libjitml binary, so a rebuilt library never loads
// stale kernels: "gnu-<hex>" (the NT_GNU_BUILD_ID note of the object containing this
// code), else "xxh3-<32 hex>" (a hash of its file), else "unknown". Computed once;
// the string is static. Thread-safe.
const char *jit__library_build_id(void);

#endif  // JITML_CACHE_CACHE_H_
