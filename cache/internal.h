//===--- internal.h - shared by the files of cache/ (private) --------------===//
//
// The handle, the entry file format and the helpers that cache.c (open, get, put,
// locks), maintain.c (list, verify, prune, clear) and bundle.c (export, import) share.
// Nothing outside cache/ includes this, except tests/test_cache.c, which crafts
// damaged entries from the layout below.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_CACHE_INTERNAL_H_
#define JITML_CACHE_INTERNAL_H_

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "cache/cache.h"
#include "base/bytes.h"
#include "base/status.h"

//===--- Entry file format ----------------------------------------------------===//
//
// <dir>/<2 hex>/<32 hex>.jitk = header (96 bytes) + meta + components + payload.
// All integers little-endian. Offsets:
//
//    0  8  magic "JITMLK\0\1"
//    8  4  format version (JIT__CACHE_FORMAT_VERSION); magic and version keep these
//          offsets in every version, so an old reader reports "other version" rather
//          than "bad checksum"
//   12  4  header size (96)
//   16 16  key (must equal the key in the file name)
//   32  4  payload kind (jit__payload_kind)
//   36  4  flags (0)
//   40  8  meta size
//   48  8  components size (text, no terminating NUL)
//   56  8  payload size
//   64 16  XXH3-128 of meta || components || payload (XXH128_canonical_t, big-endian)
//   80  8  XXH3-64 of bytes 0..79 (catches a damaged header before lengths are trusted)
//   88  8  reserved (0)
//
// The body puts the payload last so that list can read meta and components without
// touching the (large) payload. The checksums detect damage, not malice: a cache
// directory is trusted because only its owner can write it (see jit__cache_open).

#define JIT__CACHE_MAGIC "JITMLK\0\1"
#define JIT__CACHE_HEADER_SIZE 96
// Limits far above any real kernel; a length past them is damage, not data, and is
// refused before anything is allocated for it.
#define JIT__CACHE_MAX_META (UINT64_C(64) << 20)
#define JIT__CACHE_MAX_COMPONENTS (UINT64_C(16) << 20)
#define JIT__CACHE_MAX_PAYLOAD (UINT64_C(4) << 30)

typedef struct jit__cache_header {
  uint32_t version;
  uint8_t key[16];
  uint32_t kind;
  uint64_t meta_size, components_size, payload_size;
  uint8_t body_hash[16];
} jit__cache_header;


// Writes `h` (with the magic, header size and header checksum) into `out`.
void jit__cache_header_encode(const jit__cache_header *h,
                              uint8_t out[JIT__CACHE_HEADER_SIZE]);
// Decodes and checks magic, version, header checksum, kind, reserved fields and
// lengths. On failure returns false and says why in `why`.
bool jit__cache_header_decode(const uint8_t in[JIT__CACHE_HEADER_SIZE],
                              jit__cache_header *h, char *why, size_t why_size);
// Total file size an entry with header `h` must have.
uint64_t jit__cache_header_file_size(const jit__cache_header *h);

// Checks a whole entry held in memory (bundle import/export): header, key (if
// `key` is non-NULL), exact length and body checksum.
bool jit__cache_check_bytes(const uint8_t *bytes, uint64_t size, const uint8_t *key,
                            jit__cache_header *out_header, char *why, size_t why_size);

//===--- The handle -------------------------------------------------------------===//

// Log-once events (bits of jit__cache.logged).
enum {
  JIT__LOGGED_PUT_FAILED = 1u << 0,
  JIT__LOGGED_READ_ONLY_PUT = 1u << 1,
  JIT__LOGGED_READ_FAILED = 1u << 2,
  JIT__LOGGED_LOCK_FAILED = 1u << 3,
  JIT__LOGGED_PRUNE_FAILED = 1u << 4,
  JIT__LOGGED_TOUCH_FAILED = 1u << 5,
};

struct jit__cache {
  char *dir;              // absolute path; "" when disabled
  char *disabled_reason;  // NULL when enabled
  bool enabled;
  bool read_only;         // a shared root-owned or unwritable directory
  uid_t owner;            // the directory's owner; entries must belong to it too
  uint64_t max_bytes, max_age_s, fault_kill_after_bytes;
  jit__logger logger;
  jit__trusted_keys trusted;  // bundle import's (bundle.c) and the tier's; n 0: none
  jit__remote *remote;        // the fleet tier (tier.c); NULL: none
  bool remote_signs;
  uint8_t remote_secret[JIT__SIGN_SECRET_BYTES];
  int remote_lock_wait_ms;
  // Keys whose remote value this handle refused (a ring): not asked again, so a refused
  // value costs one transfer and one count; the compile's push then replaces it.
  uint8_t refused[64][16];
  uint32_t n_refused;

  // Guards everything below. File operations run outside it.
  pthread_mutex_t mu;
  jit__cache_stats stats;
  unsigned logged;
  int64_t last_prune_check_s;  // when this handle last considered pruning
  uint64_t bytes_since_prune;  // written by this handle since then
};

// Counters: `field` names a member of jit__cache_stats.
#define JIT__CACHE_COUNT(cache, field, n)  \
  do {                                     \
    pthread_mutex_lock(&(cache)->mu);      \
    (cache)->stats.field += (n);           \
    pthread_mutex_unlock(&(cache)->mu);    \
  } while (0)

// Opens the fleet tier of an enabled cache (tier.c).
jit_status jit__cache_open_remote(jit__cache *cache, const jit__cache_options *options);
// Queues the entry in `iov` (header, meta, components, payload) for the tier.
void jit__cache_push(jit__cache *cache, const uint8_t key[16], uint32_t kind,
                     const struct iovec *iov, int iov_count);

// Checks a value from the fleet tier (an entry's bytes, then maybe a signature trailer):
// header, key, version, exact length, checksum, a kernel's kind; the signature by one of
// `trusted` when it has keys (else, when signed, by the key it names). On success
// `*entry_size` is the entry's length without the trailer and `h` its header; else
// `why` says what is wrong. No I/O (fuzz_remote_value drives it).
bool jit__cache_check_value(const jit__trusted_keys *trusted, const uint8_t key[16],
                            const uint8_t *bytes, size_t size, jit__cache_header *h,
                            size_t *entry_size, char *why, size_t why_size);
// Fills `out` (release it) with copies of a checked entry's parts; false: out of memory.
bool jit__cache_entry_from(const jit__cache_header *h, const uint8_t *bytes,
                           const uint8_t key[16], jit__cache_entry *out);

void jit__cache_logf(jit__cache *cache, jit_log_level level, const char *fmt, ...)
    JIT__PRINTF(3, 4);
// Logs only the first time `event` (a JIT__LOGGED_* bit) happens on this handle.
void jit__cache_log_once(jit__cache *cache, unsigned event, jit_log_level level,
                         const char *fmt, ...) JIT__PRINTF(4, 5);

// "<dir>/<2 hex>/<32 hex>.jitk" into `out` (PATH_MAX bytes).
void jit__cache_entry_path(const jit__cache *cache, const uint8_t key[16], char *out);
// Parses "<32 hex>.jitk"; false for any other name.
bool jit__cache_parse_entry_name(const char *name, uint8_t key[16]);
// Parses 32 lowercase hex digits.
bool jit__cache_parse_key_hex(const char *hex, uint8_t key[16]);

// Wall-clock now, in nanoseconds and seconds.
int64_t jit__cache_now_ns(void);

// Outcome of reading an entry file.
typedef enum jit__cache_read_result {
  JIT__READ_OK,
  JIT__READ_BAD,     // damaged or foreign: the caller removes it
  JIT__READ_IO,      // the file could not be read (not its content's fault)
  JIT__READ_NOMEM,
} jit__cache_read_result;

// Reads and checks the entry open on `fd`. `key` (if non-NULL) must match the header.
// With `load_payload` the payload is read into out->payload; with `check_body` the
// body checksum is verified (streaming the payload if it is not loaded). `out` is
// filled on JIT__READ_OK only (release it); `why` says what is wrong otherwise.
jit__cache_read_result jit__cache_read_fd(jit__cache *cache, int fd, const uint8_t *key,
                                          bool load_payload, bool check_body,
                                          jit__cache_entry *out, struct stat *out_st,
                                          char *why, size_t why_size);

// Removes a bad entry (if `path` still names the file open on `fd`, so that a good
// entry renamed into place meanwhile survives), counts and logs it.
void jit__cache_remove_bad(jit__cache *cache, const char *path, int fd, const char *why);

// Writes `iov` into a new entry file for `key` atomically (temp file in the shard
// directory, fsync, rename). `payload_iov` is the index of the payload for the
// fault hook (-1: none). On failure unlinks the temp file, logs once, counts a
// dropped put and returns false.
bool jit__cache_write_atomic(jit__cache *cache, const uint8_t key[16],
                             const struct iovec *iov, int iov_count, int payload_iov);

// Full read/write loops that retry on EINTR and short transfers. 0 or -1 (errno).
int jit__cache_pread_full(int fd, void *buf, size_t size, uint64_t offset);
int jit__cache_write_full(int fd, const void *buf, size_t size);

// Walks every shard directory: each entry file (key parsed from its name) and each
// temp file, with its lstat. The callback returns false to stop.
typedef enum jit__cache_scan_kind { JIT__SCAN_ENTRY, JIT__SCAN_TEMP } jit__cache_scan_kind;
typedef bool (*jit__cache_scan_fn)(jit__cache *cache, void *user, jit__cache_scan_kind kind,
                                   const char *path, const uint8_t key[16],
                                   const struct stat *st);
// JIT_CACHE_ERROR if the directory cannot be read (`what` prefixes the message).
jit_status jit__cache_scan(jit__cache *cache, const char *what, jit__cache_scan_fn fn,
                           void *user);

// Takes a non-blocking flock on the file at `path` and, holding it, unlinks the file
// if it is still the same file. Used for stale temp and lock files. True if removed.
bool jit__cache_unlink_if_unlocked(const char *path);

// Called after a successful put: prunes if this handle's interval has passed (or
// it wrote a tenth of max_bytes since), and no other process pruned recently.
void jit__cache_maybe_prune(jit__cache *cache, uint64_t bytes_written);

// Makes a disabled/read-only status for maintenance calls, or NULL if `cache` may
// be used (`need_write`: also refuses a read-only cache).
jit_status jit__cache_check_usable(const jit__cache *cache, const char *what,
                                   bool need_write);

#endif  // JITML_CACHE_INTERNAL_H_
