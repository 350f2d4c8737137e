//===--- specialize.c - background compiles of hot bindings -----------------===//
//
// Under the AUTO shape policy a binding served by its graph's generic kernel asks for
// a kernel of its own once it has run options.specialize_after times (run.c). The
// request goes into a FIFO queue of the context's specializer: one thread, started
// at the first request, that compiles (or loads from disk) one binding at a time and
// switches the binding's calls to the result (jit__specialize_binding). No call waits
// for it: until the switch the binding keeps running on the generic kernel. The same
// queue builds generic kernels (shapes.c) and the kernels of bindings remembered as
// hot by earlier processes (hot.c).
//
// Lifetimes: a job names a graph and one of its binding records. The record lives as
// long as the context; the graph does not, so jit_graph_destroy drops the graph's
// queued jobs (building a queued generic kernel itself: its record is claimed) and
// waits for its job in flight (jit__spec_forget_graph). The context stops the thread
// when it is destroyed, after its graphs.
//
// fork() (jit/fork.c): before it the thread finishes its job in flight and takes no
// other (paused), so it holds no lock and no kernel is half built; the child has no
// such thread, keeps the queue, and starts a thread of its own when it queues a job or
// waits for a queued kernel (jit__spec_revive).
//
//===----------------------------------------------------------------------===//
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "jit/internal.h"
#include "jit/kernel_table.h"

typedef struct jit__spec_job {
  struct jit__spec_job *next;
  jit_graph *g;
  jit__kernel *k;
  bool generic;   // k is the graph's generic kernel, claimed, to compile
  int64_t *dims;  // else with k NULL: a binding remembered as hot (hot.c), its dims
} jit__spec_job;

struct jit__specializer {
  pthread_mutex_t mu;
  pthread_cond_t work;   // a job was queued, or stop was set
  pthread_cond_t idle;   // the job in flight ended
  jit__spec_job *head, *tail;
  jit_graph *running;    // the graph of the job in flight, or NULL
  pthread_t thread;
  bool started, stop;
  bool paused;           // a fork() is under way: take no job
  // In a forked child only (set there, when it is single-threaded): jobs are queued
  // and no thread serves them yet.
  bool revive;
};

jit__specializer *jit__spec_create(void) {
  jit__specializer *sp = calloc(1, sizeof(*sp));
  if (!sp) return NULL;
  pthread_mutex_init(&sp->mu, NULL);
  pthread_cond_init(&sp->work, NULL);
  pthread_cond_init(&sp->idle, NULL);
  return sp;
}

static void jit__spec_job_free(jit__spec_job *job) {
  free(job->dims);
  free(job);
}

// A hot binding's own kernel; a failure is logged and counted, never fatal.
static void jit__spec_warm(jit_graph *g, const int64_t *dims) {
  jit_status s = jit__warm_binding(g, dims, true);
  if (s) {
    atomic_fetch_add_explicit(&g->ctx->spec_failures, 1, memory_order_relaxed);
    jit__log(g->ctx, JIT_LOG_WARNING, "graph `%s`: preparing a binding remembered as hot "
             "failed: %s", g->name, jit_status_message(s));
    jit_status_free(s);
  }
}

static void *jit__spec_main(void *arg) {
  jit__specializer *sp = arg;
  // Below the threads that run kernels: on a machine with few cores a compile then
  // takes the gaps, rather than a core from a kernel's OpenMP team (whose barriers
  // wait for every thread). Best effort: an error leaves the priority as it was.
#ifdef __linux__
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
#endif
  pthread_mutex_lock(&sp->mu);
  for (;;) {
    while ((!sp->head || sp->paused) && !sp->stop) pthread_cond_wait(&sp->work, &sp->mu);
    if (sp->stop) break;
    jit__spec_job *job = sp->head;
    sp->head = job->next;
    if (!sp->head) sp->tail = NULL;
    sp->running = job->g;
    pthread_mutex_unlock(&sp->mu);
    if (job->generic) jit__generic_build(job->g, job->k);
    else if (job->k) jit__specialize_binding(job->g, job->k);
    else jit__spec_warm(job->g, job->dims);
    jit__spec_job_free(job);
    pthread_mutex_lock(&sp->mu);
    sp->running = NULL;
    pthread_cond_broadcast(&sp->idle);
  }
  pthread_mutex_unlock(&sp->mu);
  return NULL;
}

void jit__spec_destroy(jit__specializer *sp) {
  if (!sp) return;
  pthread_mutex_lock(&sp->mu);
  sp->stop = true;
  pthread_cond_broadcast(&sp->work);
  bool started = sp->started;
  pthread_mutex_unlock(&sp->mu);
  if (started) pthread_join(sp->thread, NULL);
  for (jit__spec_job *j = sp->head, *next; j; j = next) {
    next = j->next;
    jit__spec_job_free(j);
  }
  pthread_cond_destroy(&sp->work);
  pthread_cond_destroy(&sp->idle);
  pthread_mutex_destroy(&sp->mu);
  free(sp);
}

bool jit__spec_allow(jit_graph *g) {
  jit_context *ctx = g->ctx;
  // The recompile guard: past its limit a graph stays on its generic kernel.
  pthread_mutex_lock(&ctx->mu);
  bool over = g->n_specialized >= (uint32_t)ctx->max_specializations;
  bool tell = over && !g->spec_limit_logged;
  if (over) g->spec_limit_logged = true;
  else g->n_specialized++;
  pthread_mutex_unlock(&ctx->mu);
  if (tell)
    jit__log(ctx, JIT_LOG_INFO,
             "graph `%s`: %d bindings have kernels of their own "
             "(options.max_specializations); its other bindings stay on the generic kernel",
             g->name, ctx->max_specializations);
  return !over;
}

void jit__spec_enqueue(jit_graph *g, jit__kernel *k) {
  if (jit__spec_allow(g)) jit__spec_push(g, k, false);
}

static bool jit__spec_queue(jit_graph *g, jit__spec_job *job);

bool jit__spec_push(jit_graph *g, jit__kernel *k, bool generic) {
  jit__spec_job *job = malloc(sizeof(*job));
  if (!job) return false;  // out of memory: the binding stays on the generic kernel
  *job = (jit__spec_job){NULL, g, k, generic, NULL};
  return jit__spec_queue(g, job);
}

bool jit__spec_push_hot(jit_graph *g, const int64_t *dims) {
  size_t n = 0;
  for (uint32_t i = 0; i < g->n_inputs; i++) n += (size_t)g->nodes[g->inputs[i]].n.rank;
  jit__spec_job *job = malloc(sizeof(*job));
  int64_t *copy = malloc(sizeof(int64_t) * (n + 1));
  if (!job || !copy) {
    free(job);
    free(copy);
    return false;
  }
  memcpy(copy, dims, sizeof(int64_t) * n);
  *job = (jit__spec_job){NULL, g, NULL, false, copy};
  return jit__spec_queue(g, job);
}

// Starts the thread unless it runs (sp->mu held); logs when it cannot.
static void jit__spec_start(jit_context *ctx, jit__specializer *sp) {
  if (sp->started || sp->stop) return;
  // Compiles need room: MLIR's passes recurse, LLVM's codegen too.
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 8u << 20);
  sp->started = pthread_create(&sp->thread, &attr, jit__spec_main, sp) == 0;
  pthread_attr_destroy(&attr);
  if (!sp->started)
    jit__log(ctx, JIT_LOG_WARNING, "no thread for background compiles; bindings stay "
             "on their generic kernels");
}

// Appends `job` (freed here when it cannot be queued), starting the thread if needed.
static bool jit__spec_queue(jit_graph *g, jit__spec_job *job) {
  jit_context *ctx = g->ctx;
  jit__specializer *sp = ctx->spec;
  if (!sp) {
    jit__spec_job_free(job);
    return false;
  }
  pthread_mutex_lock(&sp->mu);
  jit__spec_start(ctx, sp);
  if (!sp->started || sp->stop) {
    pthread_mutex_unlock(&sp->mu);
    jit__spec_job_free(job);
    return false;
  }
  if (sp->tail) sp->tail->next = job;
  else sp->head = job;
  sp->tail = job;
  pthread_cond_signal(&sp->work);
  pthread_mutex_unlock(&sp->mu);
  return true;
}

uint64_t jit__spec_pending(jit__specializer *sp) {
  if (!sp) return 0;
  uint64_t n = 0;
  pthread_mutex_lock(&sp->mu);
  for (jit__spec_job *j = sp->head; j; j = j->next) n++;
  n += sp->running != NULL;
  pthread_mutex_unlock(&sp->mu);
  return n;
}

void jit__spec_forget_graph(jit_graph *g) {
  jit__specializer *sp = g->ctx ? g->ctx->spec : NULL;
  if (!sp) return;
  jit__spec_job *builds = NULL, *hot = NULL;
  pthread_mutex_lock(&sp->mu);
  jit__spec_job **link = &sp->head;
  sp->tail = NULL;
  while (*link) {
    jit__spec_job *j = *link;
    if (j->g == g) {
      *link = j->next;
      // A generic kernel's claimed record must still be published (other graphs of the
      // same key, and later ones, wait on it): built here rather than dropped. A
      // binding that became hot is still remembered as hot.
      if (j->generic) {
        j->next = builds;
        builds = j;
      } else if (j->k) {
        j->next = hot;
        hot = j;
      } else {
        jit__spec_job_free(j);
      }
    } else {
      sp->tail = j;
      link = &j->next;
    }
  }
  while (sp->running == g) pthread_cond_wait(&sp->idle, &sp->mu);
  pthread_mutex_unlock(&sp->mu);
  for (jit__spec_job *j = builds, *next; j; j = next) {
    next = j->next;
    jit__generic_build(j->g, j->k);
    jit__spec_job_free(j);
  }
  const int64_t *rows[64];
  size_t n = 0;
  for (jit__spec_job *j = hot, *next; j; j = next) {
    next = j->next;
    if (n == 64) {
      jit__hot_note(g, rows, n);
      n = 0;
    }
    rows[n++] = j->k->dims;  // the record outlives the job: it lives as long as ctx
  }
  jit__hot_note(g, rows, n);
  for (jit__spec_job *j = hot, *next; j; j = next) {
    next = j->next;
    jit__spec_job_free(j);
  }
}

//===--- fork() (jit/fork.c) ---------------------------------------------===//

void jit__spec_revive(jit_context *ctx) {
  jit__specializer *sp = ctx->spec;
  // Set only in a forked child, while it had one thread: no race with a writer.
  if (!sp || !sp->revive) return;
  pthread_mutex_lock(&sp->mu);
  sp->revive = false;
  if (sp->head) jit__spec_start(ctx, sp);
  pthread_mutex_unlock(&sp->mu);
}

void jit__spec_fork_prepare(jit__specializer *sp) {
  pthread_mutex_lock(&sp->mu);
  if (!sp->started || pthread_equal(sp->thread, pthread_self())) return;
  sp->paused = true;
  while (sp->running) pthread_cond_wait(&sp->idle, &sp->mu);
}

void jit__spec_fork_parent(jit__specializer *sp) {
  sp->paused = false;
  pthread_cond_broadcast(&sp->work);
  pthread_mutex_unlock(&sp->mu);
}

bool jit__spec_queued_build(const jit__specializer *sp, const jit__kernel *k) {
  for (const jit__spec_job *j = sp->head; j; j = j->next)
    if (j->generic && j->k == k) return true;
  return false;
}

void jit__spec_fork_child(jit__specializer *sp) {
  // The thread is not in the child: its wait on `work` went with it, so both
  // conditions start afresh (a wait the parent's copy still counts would block
  // pthread_cond_destroy for ever).
  sp->paused = false;
  sp->started = false;
  sp->running = NULL;
  sp->revive = sp->head != NULL;
  pthread_cond_init(&sp->work, NULL);
  pthread_cond_init(&sp->idle, NULL);
  pthread_mutex_unlock(&sp->mu);
}
