//===--- fork.c - contexts across fork() -----------------------------------===//
//
// A process that uses libjitml may fork (Python's multiprocessing and PyTorch's
// DataLoader workers do by default on Linux), and the child may go on using the
// contexts it inherited. Only the forking thread exists in the child, so whatever
// another thread held at the fork stays held there for ever: a mutex, a kernel record
// that thread was compiling (callers of that shape wait on it), the background
// compile of a generic kernel that callers wait on too.
//
// Handlers installed with pthread_atfork take care of the library's own part:
//   before: each context's specializer finishes its job in flight and takes no other
//           (jit__spec_fork_prepare), then each context's mutex is taken, so the
//           kernel tables are consistent and no libjitml thread holds a lock;
//   parent: everything is released and the specializers go on;
//   child:  kernel records another thread was compiling are dropped from the tables
//           (a later call compiles them again), the condition variables start afresh
//           (the parent's waiters are not in the child), the mutexes are released,
//           and the specializers, threadless, keep their queues for a thread of the
//           child's own (jit__spec_revive).
// The remote cache tier is not used in a child at all (cache/remote.c checks the
// pid). Not covered: a fork while another thread is inside LLVM or MLIR holding one of
// their own locks, which the child may then wait on if it compiles (the README's
// "Threading" says so). A fork from inside a log callback, where the library may hold
// locks itself, is left alone (the handlers do nothing then).
//
//===----------------------------------------------------------------------===//
#include <pthread.h>
#include <stdlib.h>

#include "base/log.h"
#include "jit/internal.h"
#include "jit/kernel_table.h"

static pthread_mutex_t g_fork_mu = PTHREAD_MUTEX_INITIALIZER;  // guards g_contexts
static jit_context *g_contexts;
static pthread_once_t g_fork_once = PTHREAD_ONCE_INIT;
static bool g_fork_skipped;  // this fork's prepare did nothing (written before fork)

static void jit__fork_prepare(void) {
  g_fork_skipped = jit__log_in_callback();
  if (g_fork_skipped) return;
  pthread_mutex_lock(&g_fork_mu);
  // Specializers first: a job in flight may need its context's mutex to end.
  for (jit_context *c = g_contexts; c; c = c->fork_next)
    if (c->spec) jit__spec_fork_prepare(c->spec);
  for (jit_context *c = g_contexts; c; c = c->fork_next) pthread_mutex_lock(&c->mu);
}

static void jit__fork_parent(void) {
  if (g_fork_skipped) return;
  for (jit_context *c = g_contexts; c; c = c->fork_next) {
    pthread_mutex_unlock(&c->mu);
    if (c->spec) jit__spec_fork_parent(c->spec);
  }
  pthread_mutex_unlock(&g_fork_mu);
}

// Drops from `c`'s table the records still COMPILING that no queued job will build:
// their compiling threads are not in the child. The records themselves are left (a
// pointer may remain in the graph that claimed them); a later call claims the key anew.
static void jit__fork_drop_orphans(jit_context *c) {
  jit__kernel_table *t = &c->table;
  for (size_t i = 0; i < t->cap;) {
    jit__kernel *k = t->slots[i];
    if (k && k->state == JIT__K_COMPILING && !(c->spec && jit__spec_queued_build(c->spec, k))) {
      jit__table_remove(t, k);  // may move a later entry into slot i: look again
      continue;
    }
    i++;
  }
}

static void jit__fork_child(void) {
  if (g_fork_skipped) return;
  for (jit_context *c = g_contexts; c; c = c->fork_next) {
    jit__fork_drop_orphans(c);
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_unlock(&c->mu);
    if (c->spec) jit__spec_fork_child(c->spec);
  }
  pthread_mutex_unlock(&g_fork_mu);
}

static void jit__fork_install(void) {
  (void)pthread_atfork(jit__fork_prepare, jit__fork_parent, jit__fork_child);
}

void jit__fork_register(jit_context *ctx) {
  pthread_once(&g_fork_once, jit__fork_install);
  pthread_mutex_lock(&g_fork_mu);
  ctx->fork_prev = NULL;
  ctx->fork_next = g_contexts;
  if (g_contexts) g_contexts->fork_prev = ctx;
  g_contexts = ctx;
  pthread_mutex_unlock(&g_fork_mu);
}

void jit__fork_unregister(jit_context *ctx) {
  pthread_mutex_lock(&g_fork_mu);
  if (ctx->fork_prev) ctx->fork_prev->fork_next = ctx->fork_next;
  else if (g_contexts == ctx) g_contexts = ctx->fork_next;
  if (ctx->fork_next) ctx->fork_next->fork_prev = ctx->fork_prev;
  ctx->fork_prev = ctx->fork_next = NULL;
  pthread_mutex_unlock(&g_fork_mu);
}
