//===--- remote.c - the fleet tier on Redis (hiredis) ----------------------===//
//
// What the tier promises is in remote.h. Two connections: `conn` (gets, locks and the
// tools' synchronous calls, one command at a time under conn_mu) and `put_conn`, owned
// by the sender thread. hiredis 0.14 writes with write(2): a server that closed the
// connection would raise SIGPIPE, so every command runs with SIGPIPE blocked on its
// thread and a SIGPIPE it caused is taken back before the mask is restored.
//
//===----------------------------------------------------------------------===//
#include "cache/remote.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/hex.h"

#if JITML_HAVE_HIREDIS
#include <hiredis/hiredis.h>

//===--- The handle -----------------------------------------------------------===//

typedef enum { JIT__ITEM_SET, JIT__ITEM_UNLOCK } jit__item_kind;

typedef struct jit__remote_item {
  struct jit__remote_item *next;
  jit__item_kind kind;
  uint8_t key[16];
  uint8_t *bytes;
  size_t size;
  jit__remote_token token;
} jit__remote_item;

struct jit__remote {
  jit__remote_options o;  // defaults filled; strings below are owned copies
  char *prefix, *url_shown;
  pid_t pid;  // the process that opened it: a forked child has neither its
              // connections nor its sender thread, and does not use the tier
  char *host, *unix_path, *user, *password;
  int port, db;

  pthread_mutex_t mu;  // guards everything below but the connections
  pthread_cond_t wake;
  jit__remote_stats stats;
  uint32_t failures;          // in a row
  double paused_until_ms;     // jit__now_ms() time; 0: not paused
  char why[256];              // the last failure
  bool connected;
  jit__remote_item *head, *tail;
  uint64_t queued_bytes;
  bool sending, closing, started;
  double drop_after_ms;  // once closing: items still queued then are dropped
  pthread_t sender;

  pthread_mutex_t conn_mu;
  redisContext *conn;
  redisContext *put_conn;  // the sender thread's
};

#define JIT__COUNT(r, field, n)     \
  do {                              \
    pthread_mutex_lock(&(r)->mu);   \
    (r)->stats.field += (n);        \
    pthread_mutex_unlock(&(r)->mu); \
  } while (0)

//===--- URLs -----------------------------------------------------------------===//

// Copies [s, s+n) percent-decoded; NULL on a bad escape or out of memory.
static char *jit__url_decode(const char *s, size_t n) {
  char *out = malloc(n + 1), *o = out;
  if (!out) return NULL;
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '%') {
      *o++ = s[i];
      continue;
    }
    int hi = i + 2 < n ? jit__hex_digit(s[i + 1]) : -1;
    int lo = i + 2 < n ? jit__hex_digit(s[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
      free(out);
      return NULL;
    }
    *o++ = (char)(hi * 16 + lo);
    i += 2;
  }
  *o = 0;
  return out;
}

static bool jit__parse_uint(const char *s, size_t n, long max, long *out) {
  if (n == 0 || n > 9) return false;
  long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  if (v > max) return false;
  *out = v;
  return true;
}

#define JIT__BAD_URL(what)                                                              \
  JIT_ERR(JIT_INVALID_ARGUMENT,                                                         \
          "remote cache URL `%s`: %s (expected redis://[[user]:password@]host[:port][/db] " \
          "or unix:///path/to/socket[?db=N])",                                          \
          r->url_shown, what)

// Fills host/port/db/user/password or unix_path from the URL.
static jit_status jit__parse_url(jit__remote *r, const char *url) {
  long v = 0;
  if (!strncmp(url, "rediss://", 9))
    return JIT_ERR(JIT_UNAVAILABLE, "remote cache URL `%s`: TLS (rediss://) is not "
                   "available: this build's hiredis (%d.%d) has no TLS support; reach the "
                   "server through a TLS tunnel (stunnel, spiped) as redis://", r->url_shown,
                   HIREDIS_MAJOR, HIREDIS_MINOR);
  if (!strncmp(url, "unix://", 7)) {
    const char *path = url + 7, *q = strchr(path, '?');
    size_t n = q ? (size_t)(q - path) : strlen(path);
    if (n == 0 || path[0] != '/') return JIT__BAD_URL("the socket path is not absolute");
    if (q && (strncmp(q, "?db=", 4) || !jit__parse_uint(q + 4, strlen(q + 4), 1 << 20, &v)))
      return JIT__BAD_URL("after the path only `?db=N` may follow");
    r->db = (int)v;
    r->unix_path = strndup(path, n);
    return r->unix_path ? NULL : JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  if (strncmp(url, "redis://", 8)) return JIT__BAD_URL("the scheme is not redis:// or unix://");
  const char *s = url + 8, *at = strrchr(s, '@');
  if (at) {
    const char *colon = memchr(s, ':', (size_t)(at - s));
    if (!colon) return JIT__BAD_URL("credentials need `:password` (`user:password@`)");
    if (colon > s && !(r->user = jit__url_decode(s, (size_t)(colon - s))))
      return JIT__BAD_URL("bad %-escape in the user name");
    if (!(r->password = jit__url_decode(colon + 1, (size_t)(at - colon - 1))))
      return JIT__BAD_URL("bad %-escape in the password");
    s = at + 1;
  }
  const char *slash = strchr(s, '/');
  size_t hostport = slash ? (size_t)(slash - s) : strlen(s);
  const char *port = NULL;
  size_t host_n = hostport;
  if (s[0] == '[') {  // [IPv6]:port
    const char *close = memchr(s, ']', hostport);
    if (!close) return JIT__BAD_URL("an IPv6 host needs its closing `]`");
    r->host = strndup(s + 1, (size_t)(close - s - 1));
    if (close + 1 < s + hostport) {
      if (close[1] != ':') return JIT__BAD_URL("after `]` only `:port` may follow");
      port = close + 2;
    }
  } else {
    const char *colon = memchr(s, ':', hostport);
    if (colon) {
      host_n = (size_t)(colon - s);
      port = colon + 1;
    }
    r->host = strndup(s, host_n);
  }
  if (!r->host) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  if (!r->host[0]) return JIT__BAD_URL("the host is empty");
  r->port = 6379;
  if (port) {
    if (!jit__parse_uint(port, (size_t)(s + hostport - port), 65535, &v) || v == 0)
      return JIT__BAD_URL("the port is not a number from 1 to 65535");
    r->port = (int)v;
  }
  if (slash && slash[1]) {
    if (!jit__parse_uint(slash + 1, strlen(slash + 1), 1 << 20, &v))
      return JIT__BAD_URL("the database is not a number");
    r->db = (int)v;
  }
  return NULL;
}

// The URL with the password (between the last ':' of the credentials and '@') hidden.
static char *jit__hide_password(const char *url) {
  const char *s = strstr(url, "://"), *at = strrchr(url, '@');
  const char *colon = s && at ? memchr(s + 3, ':', (size_t)(at - s - 3)) : NULL;
  if (!colon) return strdup(url);
  size_t n = (size_t)(colon - url) + 1;
  char *out = malloc(n + 4 + strlen(at) + 1);
  if (out) sprintf(out, "%.*s***%s", (int)n, url, at);
  return out;
}

//===--- The breaker -----------------------------------------------------------===//

// Whether this is a forked child's copy of the handle. The child does not use the tier,
// and must not take its mutexes either: a thread of the parent (the sender, another
// caller) may have held one at the fork, and the child's copy then stays locked for
// good (a child's first put hung on r->mu while the sender was sending). So every entry
// point asks this first.
static bool jit__remote_forked(const jit__remote *r) { return getpid() != r->pid; }

// Whether a call may use the network now; counts a skipped call otherwise. *errors:
// the error count when it starts (jit__remote_ok).
static bool jit__remote_allowed(jit__remote *r, uint64_t *errors) {
  pthread_mutex_lock(&r->mu);
  bool paused = r->paused_until_ms > 0 && jit__now_ms() < r->paused_until_ms;
  if (paused) r->stats.skipped++;
  *errors = r->stats.errors;
  pthread_mutex_unlock(&r->mu);
  return !paused;
}

// A call that started when the error count was `errors` succeeded: the server is
// reachable, unless another call failed since this one started. A reply the server
// wrote just before it died, read after later calls failed, must not reset the count
// (and lift a pause): under load that let an outage cost twice the errors.
static void jit__remote_ok(jit__remote *r, uint64_t errors) {
  pthread_mutex_lock(&r->mu);
  if (r->stats.errors != errors) {
    pthread_mutex_unlock(&r->mu);
    return;
  }
  bool was_paused = r->paused_until_ms > 0;
  r->failures = 0;
  r->paused_until_ms = 0;
  r->connected = true;
  pthread_mutex_unlock(&r->mu);
  if (was_paused)
    jit__logf(&r->o.logger, JIT_LOG_INFO, "remote cache %s: reachable again", r->url_shown);
}

// Counts a failure; pauses the tier after a timeout or enough failures in a row.
static void jit__remote_failed(jit__remote *r, bool timeout, const char *why) {
  pthread_mutex_lock(&r->mu);
  r->stats.errors++;
  r->failures++;
  snprintf(r->why, sizeof r->why, "%s", why);
  bool pause = (timeout || r->failures >= r->o.failures_to_pause) &&
               !(r->paused_until_ms > 0 && jit__now_ms() < r->paused_until_ms);
  if (pause) {
    r->paused_until_ms = jit__now_ms() + r->o.pause_ms;
    r->stats.pauses++;
  }
  uint64_t errors = r->stats.errors;
  pthread_mutex_unlock(&r->mu);
  if (pause)
    jit__logf(&r->o.logger, JIT_LOG_WARNING,
              "remote cache %s: %s; not asked again for %u ms (%" PRIu64 " errors so far); "
              "runs go on with the disk cache and compiles",
              r->url_shown, why, r->o.pause_ms, errors);
}

//===--- Commands -------------------------------------------------------------===//

static struct timeval jit__tv(uint32_t ms) {
  return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

static bool jit__is_timeout(const redisContext *c) {
  return c->err == REDIS_ERR_IO &&
         (strstr(c->errstr, "temporarily unavailable") || strstr(c->errstr, "timed out"));
}

// SIGPIPE stays pending on this thread while blocked; take back one we caused.
typedef struct jit__pipe_guard {
  sigset_t old;
  bool was_pending;
} jit__pipe_guard;

static void jit__pipe_block(jit__pipe_guard *g) {
  sigset_t set, pending;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, &g->old);
  g->was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
}

static void jit__pipe_restore(jit__pipe_guard *g) {
  sigset_t set, pending;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  if (!g->was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
    struct timespec zero = {0, 0};
    while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

// A reply of the expected type, or an error text.
static bool jit__reply_ok(redisReply *reply, int type, char *why, size_t n) {
  if (reply && reply->type == type) return true;
  snprintf(why, n, "%s", !reply ? "no reply"
                         : reply->type == REDIS_REPLY_ERROR ? reply->str
                                                            : "an unexpected reply");
  return false;
}

static redisContext *jit__remote_connect(jit__remote *r, bool *timeout, char *why, size_t n) {
  struct timeval ct = jit__tv(r->o.connect_timeout_ms);
  redisContext *c = r->unix_path ? redisConnectUnixWithTimeout(r->unix_path, ct)
                                 : redisConnectWithTimeout(r->host, r->port, ct);
  if (!c || c->err) {
    snprintf(why, n, "connecting failed: %s", c ? c->errstr : "out of memory");
    *timeout = c && jit__is_timeout(c);
    if (c) redisFree(c);
    return NULL;
  }
  redisSetTimeout(c, jit__tv(r->o.timeout_ms));
  char db[16];
  snprintf(db, sizeof db, "%d", r->db);
  const char *auth[3] = {"AUTH", r->user ? r->user : r->password, r->password};
  const char *select[2] = {"SELECT", db};
  redisReply *reply = NULL;
  bool ok = true;
  if (r->password) {
    reply = redisCommandArgv(c, r->user ? 3 : 2, auth, NULL);
    ok = jit__reply_ok(reply, REDIS_REPLY_STATUS, why, n);
    if (reply) freeReplyObject(reply);
  }
  if (ok && r->db) {
    reply = redisCommandArgv(c, 2, select, NULL);
    ok = jit__reply_ok(reply, REDIS_REPLY_STATUS, why, n);
    if (reply) freeReplyObject(reply);
  }
  if (!ok) {
    *timeout = jit__is_timeout(c);
    if (c->err) snprintf(why, n, "%s", c->errstr);
    redisFree(c);
    return NULL;
  }
  return c;
}

// Runs one command on *slot, connecting first if needed. NULL when the tier is paused
// (counted as skipped) or the command failed (counted, *slot reset after a connection
// error). An error reply starting with one of `pass_errors` (e.g. "WRONGTYPE") is the
// value's fault, not the server's: it is returned to the caller.
static redisReply *jit__remote_cmd(jit__remote *r, redisContext **slot, int argc,
                                   const char **argv, const size_t *lens,
                                   const char *pass_error) {
  uint64_t errors_before = 0;
  if (jit__remote_forked(r) || !jit__remote_allowed(r, &errors_before)) return NULL;
  char why[256];
  bool timeout = false;
  jit__pipe_guard guard;
  jit__pipe_block(&guard);
  if (!*slot) *slot = jit__remote_connect(r, &timeout, why, sizeof why);
  redisReply *reply = *slot ? redisCommandArgv(*slot, argc, argv, lens) : NULL;
  if (*slot && !reply) {
    timeout = jit__is_timeout(*slot);
    snprintf(why, sizeof why, "%s %s", argv[0],
             timeout ? "timed out" : (*slot)->errstr[0] ? (*slot)->errstr : "failed");
    redisFree(*slot);  // a half-read reply leaves the connection unusable
    *slot = NULL;
  }
  jit__pipe_restore(&guard);
  if (reply && reply->type == REDIS_REPLY_ERROR &&
      !(pass_error && !strncmp(reply->str, pass_error, strlen(pass_error)))) {
    snprintf(why, sizeof why, "%s: %s", argv[0], reply->str);
    freeReplyObject(reply);
    reply = NULL;
  }
  if (reply) jit__remote_ok(r, errors_before);
  else jit__remote_failed(r, timeout, why);
  return reply;
}

static void jit__key_name(const jit__remote *r, const char *kind, const uint8_t key[16],
                          char *out, size_t n) {
  char hex[33];
  jit__hex_encode(key, 16, hex);
  hex[32] = 0;
  snprintf(out, n, "%s%s%s", r->prefix, kind, hex);
}

//===--- Open / close ------------------------------------------------------------===//

// `own`: the handle of this process. A forked child's copy leaves the connections, the
// queued items and the locks alone: the parent's threads may have been in the middle of
// them at the fork (a half-sent buffer freed twice, a condition variable with a waiter),
// so their memory is left to the child's exit.
static void jit__remote_free(jit__remote *r, bool own) {
  if (own) {
    if (r->conn) redisFree(r->conn);
    if (r->put_conn) redisFree(r->put_conn);
    for (jit__remote_item *i = r->head, *next; i; i = next) {
      next = i->next;
      free(i->bytes);
      free(i);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->conn_mu);
    pthread_cond_destroy(&r->wake);
  }
  if (r->password) memset(r->password, 0, strlen(r->password));
  free(r->prefix);
  free(r->url_shown);
  free(r->host);
  free(r->unix_path);
  free(r->user);
  free(r->password);
  free(r);
}

jit_status jit__remote_open(const jit__remote_options *options, jit__remote **out) {
  *out = NULL;
  jit__remote *r = calloc(1, sizeof *r);
  if (!r) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  pthread_mutex_init(&r->mu, NULL);
  pthread_mutex_init(&r->conn_mu, NULL);
  pthread_cond_init(&r->wake, NULL);
  r->o = *options;
  if (!r->o.connect_timeout_ms) r->o.connect_timeout_ms = 250;
  if (!r->o.timeout_ms) r->o.timeout_ms = 500;
  if (!r->o.max_bytes) r->o.max_bytes = UINT64_C(64) << 20;
  if (!r->o.failures_to_pause) r->o.failures_to_pause = 3;
  if (!r->o.pause_ms) r->o.pause_ms = 30000;
  if (!r->o.queue_max_bytes) r->o.queue_max_bytes = UINT64_C(256) << 20;
  if (!r->o.lock_ttl_ms) r->o.lock_ttl_ms = 60000;
  r->prefix = strdup(options->prefix ? options->prefix : "jitml:");
  r->url_shown = jit__hide_password(options->url);
  jit_status s = !r->prefix || !r->url_shown
                     ? JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory")
                     : jit__parse_url(r, options->url);
  r->o.url = r->o.prefix = NULL;  // the caller's strings are not kept
  if (s) {
    jit__remote_free(r, true);
    return s;
  }
  snprintf(r->why, sizeof r->why, "not used yet");
  r->pid = getpid();
  *out = r;
  return NULL;
}

void jit__remote_close(jit__remote *r) {
  if (!r) return;
  if (jit__remote_forked(r)) {
    jit__remote_free(r, false);
    return;
  }
  pthread_mutex_lock(&r->mu);
  r->closing = true;
  uint32_t grace = r->o.timeout_ms * 4 > 2000 ? r->o.timeout_ms * 4 : 2000;
  r->drop_after_ms = jit__now_ms() + grace;
  pthread_cond_signal(&r->wake);
  bool started = r->started;
  pthread_mutex_unlock(&r->mu);
  if (started) pthread_join(r->sender, NULL);
  jit__remote_free(r, true);
}

const char *jit__remote_url(const jit__remote *r) { return r->url_shown; }

void jit__remote_state(jit__remote *r, char *out, size_t size) {
  if (jit__remote_forked(r)) {
    snprintf(out, size, "not used in a forked child (pid %d)", (int)getpid());
    return;
  }
  pthread_mutex_lock(&r->mu);
  double left = r->paused_until_ms - jit__now_ms();
  if (r->paused_until_ms > 0 && left > 0)
    snprintf(out, size, "paused for %.0f ms more after %" PRIu64 " errors: %s", left,
             r->stats.errors, r->why);
  else if (r->paused_until_ms > 0)
    snprintf(out, size, "to be tried again (last error: %s)", r->why);
  else if (r->failures > 0)
    snprintf(out, size, "failing: %s (%u in a row; paused after %u)", r->why, r->failures,
             r->o.failures_to_pause);
  else
    snprintf(out, size, "%s", r->connected ? "connected" : "not connected yet");
  pthread_mutex_unlock(&r->mu);
}

void jit__remote_get_stats(jit__remote *r, jit__remote_stats *out) {
  if (jit__remote_forked(r)) {  // the parent's counts at the fork, which nothing changes
    *out = r->stats;
    return;
  }
  pthread_mutex_lock(&r->mu);
  *out = r->stats;
  pthread_mutex_unlock(&r->mu);
}

//===--- Get ---------------------------------------------------------------------===//

jit__remote_got jit__remote_get(jit__remote *r, const uint8_t key[16], uint8_t **bytes,
                                size_t *size) {
  *bytes = NULL;
  *size = 0;
  if (jit__remote_forked(r)) return JIT__REMOTE_FAILED;
  char name[512], end[24];
  jit__key_name(r, "k:", key, name, sizeof name);
  // GETRANGE's end is inclusive: max_bytes + 1 bytes tell an oversize value.
  snprintf(end, sizeof end, "%" PRIu64, r->o.max_bytes);
  const char *argv[4] = {"GETRANGE", name, "0", end};
  pthread_mutex_lock(&r->conn_mu);
  redisReply *reply = jit__remote_cmd(r, &r->conn, 4, argv, NULL, "WRONGTYPE");
  pthread_mutex_unlock(&r->conn_mu);
  if (!reply) return JIT__REMOTE_FAILED;
  jit__remote_got got = JIT__REMOTE_MISS;
  if (reply->type != REDIS_REPLY_STRING) {
    got = JIT__REMOTE_WRONG_TYPE;  // WRONGTYPE: not a string
  } else if (reply->len == 0) {
    JIT__COUNT(r, misses, 1);  // GETRANGE of a missing key is ""
  } else if ((uint64_t)reply->len > r->o.max_bytes) {
    JIT__COUNT(r, oversize, 1);
    got = JIT__REMOTE_OVERSIZE;
  } else if (!(*bytes = malloc(reply->len))) {
    got = JIT__REMOTE_NOMEM;
  } else {
    memcpy(*bytes, reply->str, reply->len);
    *size = reply->len;
    pthread_mutex_lock(&r->mu);
    r->stats.hits++;
    r->stats.bytes_read += reply->len;
    pthread_mutex_unlock(&r->mu);
    got = JIT__REMOTE_HIT;
  }
  freeReplyObject(reply);
  return got;
}

//===--- Put ---------------------------------------------------------------------===//

// SET name value [EX ttl] on *slot. True when stored.
static bool jit__remote_set(jit__remote *r, redisContext **slot, const uint8_t key[16],
                            const uint8_t *bytes, size_t size) {
  char name[512], ttl[24];
  jit__key_name(r, "k:", key, name, sizeof name);
  snprintf(ttl, sizeof ttl, "%" PRIu64, r->o.ttl_s);
  const char *argv[5] = {"SET", name, (const char *)bytes, "EX", ttl};
  size_t lens[5] = {3, strlen(name), size, 2, strlen(ttl)};
  redisReply *reply = jit__remote_cmd(r, slot, r->o.ttl_s ? 5 : 3, argv, lens, NULL);
  if (!reply) return false;
  freeReplyObject(reply);
  pthread_mutex_lock(&r->mu);
  r->stats.puts++;
  r->stats.bytes_written += size;
  pthread_mutex_unlock(&r->mu);
  return true;
}

static void jit__remote_send_unlock(jit__remote *r, redisContext **slot,
                                    const uint8_t key[16], const jit__remote_token *token) {
  static const char kScript[] =
      "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
      "end return 0";
  char name[512];
  jit__key_name(r, "lock:", key, name, sizeof name);
  const char *argv[5] = {"EVAL", kScript, "1", name, token->text};
  redisReply *reply = jit__remote_cmd(r, slot, 5, argv, NULL, NULL);
  if (reply) freeReplyObject(reply);
}

static void *jit__remote_sender(void *arg) {
  jit__remote *r = arg;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (!r->head && !r->closing) pthread_cond_wait(&r->wake, &r->mu);
    jit__remote_item *item = r->head;
    if (!item) break;
    r->head = item->next;
    if (!r->head) r->tail = NULL;
    r->sending = true;
    bool drop = r->closing && jit__now_ms() > r->drop_after_ms;
    pthread_mutex_unlock(&r->mu);
    bool sent = false;
    if (!drop && item->kind == JIT__ITEM_SET)
      sent = jit__remote_set(r, &r->put_conn, item->key, item->bytes, item->size);
    else if (!drop)
      jit__remote_send_unlock(r, &r->put_conn, item->key, &item->token);
    pthread_mutex_lock(&r->mu);
    r->sending = false;
    r->queued_bytes -= item->size;
    if (item->kind == JIT__ITEM_SET && !sent) r->stats.puts_dropped++;
    free(item->bytes);
    free(item);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

// Appends `item` (taken in every case); false when dropped.
static bool jit__remote_enqueue(jit__remote *r, jit__remote_item *item) {
  if (jit__remote_forked(r)) {
    free(item->bytes);
    free(item);
    return false;
  }
  pthread_mutex_lock(&r->mu);
  bool paused = r->paused_until_ms > 0 && jit__now_ms() < r->paused_until_ms;
  bool ok = !r->closing && !paused &&
            r->queued_bytes + item->size <= r->o.queue_max_bytes;
  if (paused) r->stats.skipped++;
  if (ok && !r->started) {
    // The sender blocks every signal: they belong to the application's threads.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r->started = pthread_create(&r->sender, NULL, jit__remote_sender, r) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    ok = r->started;
  }
  if (ok) {
    if (r->tail) r->tail->next = item;
    else r->head = item;
    r->tail = item;
    r->queued_bytes += item->size;
    pthread_cond_signal(&r->wake);
  } else if (item->kind == JIT__ITEM_SET) {
    r->stats.puts_dropped++;
  }
  pthread_mutex_unlock(&r->mu);
  if (!ok) {
    free(item->bytes);
    free(item);
  }
  return ok;
}

void jit__remote_put(jit__remote *r, const uint8_t key[16], uint8_t *bytes, size_t size) {
  if (jit__remote_forked(r)) {
    free(bytes);
    return;
  }
  jit__remote_item *item = size <= r->o.max_bytes ? calloc(1, sizeof *item) : NULL;
  if (!item) {
    JIT__COUNT(r, puts_dropped, 1);
    free(bytes);
    return;
  }
  item->kind = JIT__ITEM_SET;
  memcpy(item->key, key, 16);
  item->bytes = bytes;
  item->size = size;
  jit__remote_enqueue(r, item);
}

//===--- Synchronous calls (tools) -------------------------------------------------===//

static jit_status jit__remote_unavailable(jit__remote *r) {
  char state[400];
  jit__remote_state(r, state, sizeof state);
  return JIT_ERR(JIT_UNAVAILABLE, "remote cache %s: %s", r->url_shown, state);
}

jit_status jit__remote_put_now(jit__remote *r, const uint8_t key[16], const uint8_t *bytes,
                               size_t size) {
  if (jit__remote_forked(r)) return jit__remote_unavailable(r);
  if (size > r->o.max_bytes) {
    JIT__COUNT(r, puts_dropped, 1);
    return NULL;
  }
  pthread_mutex_lock(&r->conn_mu);
  bool ok = jit__remote_set(r, &r->conn, key, bytes, size);
  pthread_mutex_unlock(&r->conn_mu);
  if (!ok) JIT__COUNT(r, puts_dropped, 1);
  return ok ? NULL : jit__remote_unavailable(r);
}

jit_status jit__remote_exists(jit__remote *r, const uint8_t key[16], bool *exists) {
  if (jit__remote_forked(r)) return jit__remote_unavailable(r);
  char name[512];
  jit__key_name(r, "k:", key, name, sizeof name);
  const char *argv[2] = {"EXISTS", name};
  pthread_mutex_lock(&r->conn_mu);
  redisReply *reply = jit__remote_cmd(r, &r->conn, 2, argv, NULL, NULL);
  pthread_mutex_unlock(&r->conn_mu);
  if (!reply) return jit__remote_unavailable(r);
  *exists = reply->type == REDIS_REPLY_INTEGER && reply->integer > 0;
  freeReplyObject(reply);
  return NULL;
}

jit_status jit__remote_scan(jit__remote *r, jit__remote_key_fn fn, void *user) {
  if (jit__remote_forked(r)) return jit__remote_unavailable(r);
  // The prefix is matched literally: glob characters are escaped.
  char pattern[1100], cursor[32] = "0";
  size_t n = 0;
  for (const char *p = r->prefix; *p && n + 4 < 1000; p++) {
    if (strchr("*?[]\\", *p)) pattern[n++] = '\\';
    pattern[n++] = *p;
  }
  snprintf(pattern + n, sizeof pattern - n, "k:*");
  size_t skip = strlen(r->prefix) + 2;
  bool more = true;
  do {
    const char *argv[6] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
    pthread_mutex_lock(&r->conn_mu);
    redisReply *reply = jit__remote_cmd(r, &r->conn, 6, argv, NULL, NULL);
    pthread_mutex_unlock(&r->conn_mu);
    if (!reply) return jit__remote_unavailable(r);
    bool ok = reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
              reply->element[0]->type == REDIS_REPLY_STRING &&
              reply->element[1]->type == REDIS_REPLY_ARRAY;
    if (ok) {
      snprintf(cursor, sizeof cursor, "%s", reply->element[0]->str);
      redisReply *keys = reply->element[1];
      for (size_t i = 0; more && i < keys->elements; i++) {
        uint8_t key[16];
        const redisReply *k = keys->element[i];
        if (k->type == REDIS_REPLY_STRING && k->len == skip + 32 &&
            jit__hex_decode(k->str + skip, 16, key))
          more = fn(user, key);
      }
    }
    freeReplyObject(reply);
    if (!ok) return JIT_ERR(JIT_UNAVAILABLE, "remote cache %s: SCAN: an unexpected reply",
                            r->url_shown);
  } while (more && strcmp(cursor, "0") != 0);
  return NULL;
}

bool jit__remote_ping(jit__remote *r) {
  if (jit__remote_forked(r)) return false;
  const char *argv[1] = {"PING"};
  pthread_mutex_lock(&r->conn_mu);
  redisReply *reply = jit__remote_cmd(r, &r->conn, 1, argv, NULL, NULL);
  pthread_mutex_unlock(&r->conn_mu);
  if (reply) freeReplyObject(reply);
  return reply != NULL;
}

//===--- Fleet locks ---------------------------------------------------------------===//

bool jit__remote_lock(jit__remote *r, const uint8_t key[16], int wait_ms,
                      jit__remote_token *token) {
  if (jit__remote_forked(r)) return false;
  uint8_t raw[16] = {0};
  if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
    // Unique enough for a lock that only orders compiles: time and address.
    double now = jit__now_ms();
    memcpy(raw, &now, sizeof now);
    memcpy(raw + 8, &token, sizeof token < 8 ? sizeof token : 8);
  }
  jit__hex_encode(raw, 16, token->text);
  token->text[32] = 0;
  char lock[512], value[512], ttl[24];
  jit__key_name(r, "lock:", key, lock, sizeof lock);
  jit__key_name(r, "k:", key, value, sizeof value);
  snprintf(ttl, sizeof ttl, "%u", r->o.lock_ttl_ms);
  const char *set[6] = {"SET", lock, token->text, "NX", "PX", ttl};
  const char *exists[2] = {"EXISTS", value};
  double end = jit__now_ms() + (wait_ms > 0 ? wait_ms : 0);
  for (bool logged = false;; logged = true) {
    pthread_mutex_lock(&r->conn_mu);
    redisReply *reply = jit__remote_cmd(r, &r->conn, 6, set, NULL, NULL);
    bool taken = reply && reply->type == REDIS_REPLY_STATUS;  // "OK"; nil: held
    if (reply) freeReplyObject(reply);
    reply = reply && !taken ? jit__remote_cmd(r, &r->conn, 2, exists, NULL, NULL) : NULL;
    bool there = reply && reply->type == REDIS_REPLY_INTEGER && reply->integer > 0;
    if (reply) freeReplyObject(reply);
    pthread_mutex_unlock(&r->conn_mu);
    if (taken) return true;
    if (!reply || there || jit__now_ms() >= end) return false;
    if (!logged)
      jit__logf(&r->o.logger, JIT_LOG_DEBUG, "remote cache: %s is being compiled on another "
                "machine; waiting up to %d ms", value, wait_ms);
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
}

void jit__remote_unlock(jit__remote *r, const uint8_t key[16], const jit__remote_token *token) {
  jit__remote_item *item = calloc(1, sizeof *item);
  if (!item) return;  // the lock expires by itself
  item->kind = JIT__ITEM_UNLOCK;
  memcpy(item->key, key, 16);
  item->token = *token;
  jit__remote_enqueue(r, item);
}

#else  // !JITML_HAVE_HIREDIS

struct jit__remote {
  int unused;
};

jit_status jit__remote_open(const jit__remote_options *options, jit__remote **out) {
  *out = NULL;
  return JIT_ERR(JIT_UNAVAILABLE, "remote cache: this libjitml was built without hiredis "
                 "(apt-get install libhiredis-dev and rebuild)");
}
void jit__remote_close(jit__remote *r) {}
const char *jit__remote_url(const jit__remote *r) { return ""; }
void jit__remote_state(jit__remote *r, char *out, size_t size) { snprintf(out, size, "off"); }
void jit__remote_get_stats(jit__remote *r, jit__remote_stats *out) { memset(out, 0, sizeof *out); }
jit__remote_got jit__remote_get(jit__remote *r, const uint8_t key[16], uint8_t **bytes,
                                size_t *size) {
  return JIT__REMOTE_FAILED;
}
void jit__remote_put(jit__remote *r, const uint8_t key[16], uint8_t *bytes, size_t size) {
  free(bytes);
}
jit_status jit__remote_put_now(jit__remote *r, const uint8_t key[16], const uint8_t *bytes,
                               size_t size) {
  return JIT_ERR(JIT_UNAVAILABLE, "remote cache: built without hiredis");
}
jit_status jit__remote_exists(jit__remote *r, const uint8_t key[16], bool *exists) {
  return JIT_ERR(JIT_UNAVAILABLE, "remote cache: built without hiredis");
}
jit_status jit__remote_scan(jit__remote *r, jit__remote_key_fn fn, void *user) {
  return JIT_ERR(JIT_UNAVAILABLE, "remote cache: built without hiredis");
}
bool jit__remote_ping(jit__remote *r) { return false; }
bool jit__remote_lock(jit__remote *r, const uint8_t key[16], int wait_ms,
                      jit__remote_token *token) {
  return false;
}
void jit__remote_unlock(jit__remote *r, const uint8_t key[16],
                        const jit__remote_token *token) {}

#endif  // JITML_HAVE_HIREDIS
