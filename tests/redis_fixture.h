//===--- redis_fixture.h - a real redis-server per test ---------------------===//
//
// Starts Debian's redis-server on a free loopback port, in its own temporary
// directory, with no persistence (no RDB snapshots, no AOF) and the DEBUG command
// enabled (DEBUG SLEEP slows it on purpose), and stops it at the end. No mock: the
// fleet cache is tested against the server users run. Also a hiredis client for the
// tests to plant and damage values. Header-only; needs _GNU_SOURCE.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_TESTS_REDIS_FIXTURE_H_
#define JITML_TESTS_REDIS_FIXTURE_H_

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct tu_redis {
  pid_t pid;
  int port;
  char dir[256];
  char url[64];
} tu_redis;

// A port the kernel just handed out on 127.0.0.1 (free unless taken again at once).
static inline int tu_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t n = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &n) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

static inline redisContext *tu_redis_client(const tu_redis *r) {
  struct timeval tv = {2, 0};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
  if (c && c->err) {
    redisFree(c);
    return NULL;
  }
  if (c) redisSetTimeout(c, tv);
  return c;
}

// Starts a server; false when redis-server cannot be started (it is not installed,
// or no port worked in five tries).
static inline bool tu_redis_start(tu_redis *r) {
  memset(r, 0, sizeof *r);
  const char *tmp = getenv("TMPDIR");
  snprintf(r->dir, sizeof r->dir, "%s/jitml-redis-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(r->dir)) return false;
  for (int attempt = 0; attempt < 5; attempt++) {
    r->port = tu_free_port();
    char port[16], log[300];
    snprintf(port, sizeof port, "%d", r->port);
    snprintf(log, sizeof log, "%s/redis.log", r->dir);
    r->pid = fork();
    if (r->pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives a test that crashed
      execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", r->dir, "--logfile", log,
             "--daemonize", "no", "--enable-debug-command", "yes", (char *)NULL);
      _exit(127);
    }
    for (int i = 0; i < 500; i++) {  // up to 5 s
      redisContext *c = tu_redis_client(r);
      redisReply *reply = c ? redisCommand(c, "PING") : NULL;
      bool up = reply && reply->type == REDIS_REPLY_STATUS;
      if (reply) freeReplyObject(reply);
      if (c) redisFree(c);
      if (up) {
        snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d", r->port);
        return true;
      }
      int status;
      if (waitpid(r->pid, &status, WNOHANG) == r->pid) break;  // exited: port taken?
      nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
  }
  r->pid = 0;
  return false;
}

static inline void tu_redis_kill(tu_redis *r) {
  if (r->pid > 0) {
    kill(r->pid, SIGCONT);
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
  }
  r->pid = 0;
}

static inline void tu_redis_stop(tu_redis *r) {
  tu_redis_kill(r);
  char cmd[320];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", r->dir);
  if (r->dir[0] && system(cmd) != 0) fprintf(stderr, "removing %s failed\n", r->dir);
}

#endif  // JITML_TESTS_REDIS_FIXTURE_H_
