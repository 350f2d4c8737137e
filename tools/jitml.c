//===--- jitml.c - the jitml command-line tool ------------------------------===//
//
//   jitml prewarm MODEL.mlir [--shapes 'N=1,2,4,8-64:8'] [--hot] [--jobs J] [--expect-warm]
//                            [--remote URL]
//   jitml run MODEL.mlir --shape N=7 [--repeat R]
//   jitml explain MODEL.mlir --shape N=17
//   jitml cache ls|stats|verify|prune|clear [--json]
//   jitml cache export BUNDLE [--sign SECRET_KEY]
//   jitml cache import BUNDLE [--trust PUBLIC_KEY[,...]]
//   jitml cache push [--remote URL] [--sign SECRET_KEY]
//   jitml cache pull [--remote URL] [--trust PUBLIC_KEY[,...]]
//   jitml keygen SECRET_KEY
//
// Uses the public API only. Exit codes: 0 success, 1 failure (or, with --expect-warm,
// something had to be compiled), 2 bad usage.
//
//===----------------------------------------------------------------------===//
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jitml.h>

#include "tools/spec.h"

#if defined(__SANITIZE_ADDRESS__)
#include <dlfcn.h>
// Sanitizer builds only (tests/tool/run.sh under ASan): Mesa's lavapipe leaks a
// 128-byte block when the Vulkan loader unloads it at the last vkDestroyInstance,
// which LeakSanitizer reports from an "<unknown module>" that no suppression can name
// (seen on a Zen 4 host: `prewarm --device vulkan`). Pinned as tests/util.h pins it;
// a no-op where lavapipe is absent. Every allocation of ours is still checked.
__attribute__((constructor)) static void pin_lavapipe(void) {
  (void)dlopen("libvulkan_lvp.so", RTLD_NOW | RTLD_NODELETE);
}
#endif

enum { kExitOk = 0, kExitFail = 1, kExitUsage = 2 };

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Prints and frees a failed status; returns kExitFail.
static int fail(jit_status s, const char *what) {
  fprintf(stderr, "jitml: %s: %s: %s\n", what,
          jit_status_code_name(jit_status_get_code(s)), jit_status_message(s));
  jit_status_free(s);
  return kExitFail;
}

//===--- Options shared by the subcommands --------------------------------===//

typedef struct args {
  const char *model;
  const char *shapes;     // --shapes / --shape
  const char *cache_dir;  // --cache-dir
  const char *path;       // export/import bundle
  const char *device;     // --device: options.device (runs and prewarms go there)
  const char *sign;       // export --sign: the secret key file
  const char *trust;      // import/pull --trust: options.bundle_trusted_keys
  const char *remote;     // --remote: options.remote_cache
  int jobs, repeat;
  bool expect_warm, json;
  bool hot;    // prewarm: also the bindings the cache remembers as hot
  bool exact;  // prewarm: each binding's own kernel (shape policy EXACT)
  bool remote_sign;  // cache push: --sign signs the pushed entries
} args;

static const char kUsage[] =
    "usage: jitml <command> [options]\n"
    "\n"
    "commands:\n"
    "  prewarm MODEL.mlir [--shapes SPEC] [--hot] [--jobs J] [--expect-warm]\n"
    "      compile every binding in SPEC into the disk cache, J at a time, and the\n"
    "      graph's generic kernel (for bindings not in SPEC) where it has one;\n"
    "      --hot: also the bindings that serving processes found hot (shape policy\n"
    "      AUTO remembers them in the cache), hottest first;\n"
    "      --expect-warm fails (exit 1) if anything had to be compiled;\n"
    "      --remote URL: also fill that fleet cache (every kernel of the disk cache\n"
    "      it lacks is pushed at the end)\n"
    "  run MODEL.mlir --shape SPEC [--repeat R]\n"
    "      run once per binding on random inputs; print timings and where the\n"
    "      kernel came from (compiled / disk / memory)\n"
    "  explain MODEL.mlir --shape SPEC\n"
    "      say why a binding hits or misses the disk cache\n"
    "  cache ls|stats|verify|prune|clear [--json]\n"
    "  cache export BUNDLE [--sign SECRET_KEY]\n"
    "      write every entry into one file; --sign signs it (ed25519)\n"
    "  cache import BUNDLE [--trust PUBLIC_KEY[,PUBLIC_KEY...]]\n"
    "      add a bundle's verified entries; with trusted keys (--trust, else\n"
    "      $JITML_TRUSTED_KEYS) only a bundle signed by one of them\n"
    "  cache push [--sign SECRET_KEY]\n"
    "      copy every kernel of the disk cache that the fleet cache (--remote)\n"
    "      lacks there; --sign signs them for machines that trust its key\n"
    "  cache pull [--trust PUBLIC_KEY[,PUBLIC_KEY...]]\n"
    "      copy every verified kernel of the fleet cache into the disk cache\n"
    "  opt FILE.mlir PIPELINE\n"
    "      run a pass pipeline (mlir-opt's textual form) with libjitml's own passes\n"
    "      among MLIR's (jitml-lower-matmul-to-loops) and print the result; FILE '-'\n"
    "      reads stdin\n"
    "  keygen SECRET_KEY\n"
    "      make a signing key: the secret into a new file (mode 600), the public\n"
    "      key (for --trust) on stdout\n"
    "\n"
    "SPEC binds the model's symbolic dims: 'N=1,2,4,8-64:8;S=128' (values, ranges\n"
    "lo-hi:step; ';' separates symbols; every combination is used).\n"
    "options: --cache-dir DIR (default: $JITML_CACHE_DIR, $XDG_CACHE_HOME/jitml,\n"
    "~/.cache/jitml), --device cpu|vulkan|cuda[:N] (where prewarm, run and explain\n"
    "compile for: options.device), --remote redis://[[user]:password@]host[:port][/db]\n"
    "(the fleet cache; default $JITML_REMOTE_CACHE; `cache stats` shows its state),\n"
    "-h/--help.\n";

static int usage_error(const char *msg) {
  fprintf(stderr, "jitml: %s\n\n%s", msg, kUsage);
  return kExitUsage;
}

static int parse_args(int argc, char **argv, int first, args *a, bool want_model,
                      bool want_path) {
  for (int i = first; i < argc; i++) {
    const char *s = argv[i];
    bool has_next = i + 1 < argc;
    if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
      fputs(kUsage, stdout);
      exit(kExitOk);
    } else if ((!strcmp(s, "--shapes") || !strcmp(s, "--shape")) && has_next) {
      a->shapes = argv[++i];
    } else if (!strcmp(s, "--device") && has_next) {
      a->device = argv[++i];
    } else if (!strcmp(s, "--sign") && has_next) {
      a->sign = argv[++i];
    } else if (!strcmp(s, "--trust") && has_next) {
      a->trust = argv[++i];
    } else if (!strcmp(s, "--remote") && has_next) {
      a->remote = argv[++i];
    } else if (!strcmp(s, "--cache-dir") && has_next) {
      a->cache_dir = argv[++i];
    } else if (!strcmp(s, "--jobs") && has_next) {
      a->jobs = atoi(argv[++i]);
      if (a->jobs < 1 || a->jobs > 256) return usage_error("--jobs must be in 1..256");
    } else if (!strcmp(s, "--repeat") && has_next) {
      a->repeat = atoi(argv[++i]);
      if (a->repeat < 1) return usage_error("--repeat must be >= 1");
    } else if (!strcmp(s, "--hot")) {
      a->hot = true;
    } else if (!strcmp(s, "--expect-warm")) {
      a->expect_warm = true;
    } else if (!strcmp(s, "--json")) {
      a->json = true;
    } else if (s[0] == '-') {
      char m[256];
      snprintf(m, sizeof m, "unknown or incomplete option `%s`", s);
      return usage_error(m);
    } else if (want_model && !a->model) {
      a->model = s;
    } else if (want_path && !a->path) {
      a->path = s;
    } else {
      char m[256];
      snprintf(m, sizeof m, "unexpected argument `%s`", s);
      return usage_error(m);
    }
  }
  if (want_model && !a->model) return usage_error("missing MODEL.mlir");
  if (want_path && !a->path) return usage_error("missing BUNDLE path");
  return kExitOk;
}

static jit_status open_context(const args *a, jit_context **ctx) {
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = a->cache_dir;
  o.device = a->device;
  o.bundle_trusted_keys = a->trust;
  o.remote_cache = a->remote;
  // push --sign: the pushed entries are signed with that key.
  if (a->sign && a->remote_sign) o.remote_signing_key = a->sign;
  // prewarm fills the cache with each binding's own kernel (and the generic one).
  if (a->exact) o.shape_policy = JIT_SHAPE_POLICY_EXACT;
  return jit_context_create(&o, ctx);
}

//===--- Models and bindings ---------------------------------------------===//

// Through the library's reader: a FIFO, a device or a directory is refused at once,
// never read until memory runs out or waited on.
static int load_model(jit_context *ctx, const char *path, jit_graph **g) {
  jit_status s = jit_graph_from_mlir_file(ctx, path, NULL, g);
  if (s) return fail(s, path);
  return kExitOk;
}

// Input tensors (shapes only, or with data) for the index-th combination.
typedef struct inputs {
  int n;
  DLTensor t[64];
  int64_t shapes[64][JIT_MAX_RANK];
} inputs;

static int make_inputs(jit_graph *g, const binding_set *b, size_t index, bool with_data,
                       inputs *in, char *desc, size_t desc_size) {
  int64_t val[kSpecSymbols];
  size_t rest = index;
  size_t dn = 0;
  desc[0] = 0;
  for (int i = b->n_symbols - 1; i >= 0; i--) {
    val[i] = b->values[i][rest % (size_t)b->n_values[i]];
    rest /= (size_t)b->n_values[i];
  }
  for (int i = 0; i < b->n_symbols && dn < desc_size; i++)
    dn += (size_t)snprintf(desc + dn, desc_size - dn, "%s%s=%lld", i ? " " : "", b->names[i],
                           (long long)val[i]);
  in->n = jit_graph_num_inputs(g);
  if (in->n > 64) {
    fprintf(stderr, "jitml: models with more than 64 inputs are not supported\n");
    return kExitFail;
  }
  for (int i = 0; i < in->n; i++) {
    jit_input_info info;
    jit_status s = jit_graph_input_info(g, i, &info);
    if (s) return fail(s, "input info");
    size_t count = 1;
    for (int d = 0; d < info.rank; d++) {
      int64_t v = info.dims[d];
      if (v < 0) {
        const char *name = jit_symbol_name(g, v);
        int k = 0;
        while (k < b->n_symbols && strcmp(b->names[k], name ? name : "")) k++;
        if (k == b->n_symbols) {
          fprintf(stderr, "jitml: input %d `%s` dim %d is symbol `%s`: give it a value in "
                  "the SPEC\n", i, info.name, d, name ? name : "?");
          return kExitUsage;
        }
        v = val[k];
      }
      in->shapes[i][d] = v;
      count *= (size_t)v;
    }
    DLTensor *t = &in->t[i];
    memset(t, 0, sizeof(*t));
    t->device = (DLDevice){kDLCPU, 0};
    t->dtype = info.dtype;
    t->ndim = info.rank;
    t->shape = in->shapes[i];
    if (with_data) {
      size_t esz = info.dtype.bits / 8;
      t->data = malloc(count * esz + 1);
      if (!t->data) return kExitFail;
      unsigned char *p = t->data;
      for (size_t e = 0; e < count; e++) {
        float x = (float)((double)rand() / RAND_MAX - 0.5);
        if (esz == 4) {
          memcpy(p + 4 * e, &x, 4);
        } else {
          uint16_t h = (uint16_t)(x < 0 ? 0xB400 : 0x3400);  // +-0.25 as f16
          memcpy(p + 2 * e, &h, 2);
        }
      }
    }
  }
  return kExitOk;
}

static void free_inputs(inputs *in) {
  for (int i = 0; i < in->n; i++) free(in->t[i].data);
}

// What prewarm, run and explain share: the SPEC, a context and the model's graph.
// On failure everything is freed (close_model on the NULLs is a no-op).
static int open_model(const args *a, binding_set *b, jit_context **ctx, jit_graph **g) {
  // prewarm --hot needs no SPEC: then the set is empty.
  char why[256];
  int rc = kExitOk;
  if (a->hot && !a->shapes) memset(b, 0, sizeof(*b));
  else if (parse_spec(a->shapes, b, why, sizeof why)) rc = usage_error(why);
  if (rc == kExitOk) {
    jit_status s = open_context(a, ctx);
    rc = s ? fail(s, "context") : load_model(*ctx, a->model, g);
  }
  return rc;
}

static void close_model(binding_set *b, jit_context *ctx, jit_graph *g) {
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  free_bindings(b);
}

//===--- The fleet cache ---------------------------------------------------===//

// Progress of a push or pull on stderr: a line rewritten in place on a terminal,
// else a line at every tenth.
static void progress(void *user, uint64_t done, uint64_t total) {
  const char *what = user;
  if (isatty(2))
    fprintf(stderr, "\r%s %llu/%llu", what, (unsigned long long)done,
            (unsigned long long)total);
  else if (done == total || (total >= 10 && done % (total / 10) == 0))
    fprintf(stderr, "%s %llu/%llu\n", what, (unsigned long long)done,
            (unsigned long long)total);
  if (isatty(2) && done == total) fprintf(stderr, "\n");
}

// cache push / cache pull (and prewarm --remote's push). A pull that refused values
// exits 1: something on the server is not what this machine accepts.
static int transfer(jit_context *ctx, bool push) {
  uint64_t moved = 0, other = 0;
  double t0 = now_ms();
  jit_status s = push ? jit_cache_push(ctx, progress, "push", &moved, &other)
                      : jit_cache_pull(ctx, progress, "pull", &moved, &other);
  const char *url = jit_cache_remote(ctx, NULL);
  printf(push ? "push: %llu entries pushed, %llu already there, to %s in %.1f s\n"
              : "pull: %llu entries pulled, %llu refused (see the log), from %s in %.1f s\n",
         (unsigned long long)moved, (unsigned long long)other, url ? url : "(none)",
         (now_ms() - t0) / 1e3);
  if (s) return fail(s, push ? "cache push" : "cache pull");
  return !push && other ? kExitFail : kExitOk;
}

//===--- prewarm ---------------------------------------------------------===//

typedef struct prewarm_job {
  jit_graph *g;
  const binding_set *b;
  size_t total;
  atomic_size_t next, done, failed;
  pthread_mutex_t print_mu;
  bool tty;
} prewarm_job;

static void *prewarm_worker(void *arg) {
  prewarm_job *j = arg;
  for (;;) {
    size_t i = atomic_fetch_add(&j->next, 1);
    if (i >= j->total) break;
    inputs in;
    char desc[256];
    jit_status s = NULL;
    if (make_inputs(j->g, j->b, i, false, &in, desc, sizeof desc) != kExitOk) {
      atomic_fetch_add(&j->failed, 1);
    } else if ((s = jit_graph_compile(j->g, in.t, in.n)) != NULL) {
      pthread_mutex_lock(&j->print_mu);
      fprintf(stderr, "%sjitml: %s: %s\n", j->tty ? "\r\033[K" : "", desc,
              jit_status_message(s));
      pthread_mutex_unlock(&j->print_mu);
      jit_status_free(s);
      atomic_fetch_add(&j->failed, 1);
    }
    size_t done = atomic_fetch_add(&j->done, 1) + 1;
    pthread_mutex_lock(&j->print_mu);
    if (j->tty) {
      int width = 40, fill = (int)(width * done / j->total);
      fprintf(stderr, "\r[%.*s%*s] %zu/%zu %s", fill,
              "########################################", width - fill, "", done, j->total,
              desc);
      fflush(stderr);
    } else {
      printf("%zu/%zu %s %s\n", done, j->total, desc, s ? "failed" : "ready");
    }
    pthread_mutex_unlock(&j->print_mu);
  }
  return NULL;
}

static int cmd_prewarm(const args *a) {
  binding_set b;
  jit_context *ctx = NULL;
  jit_graph *g = NULL;
  int rc = open_model(a, &b, &ctx, &g);
  if (rc == kExitOk) {
    prewarm_job j;
    memset(&j, 0, sizeof j);
    j.g = g;
    j.b = &b;
    j.total = a->hot && !a->shapes ? 0 : binding_count(&b);
    j.tty = isatty(2);
    pthread_mutex_init(&j.print_mu, NULL);
    int jobs = a->jobs > 0 ? a->jobs : 2;
    pthread_t th[256];
    double t0 = now_ms();
    // The generic kernel first, where the graph has one: bindings not in SPEC then
    // run at once in a serving process (shape policy AUTO or GENERIC).
    jit_status gs = jit_graph_compile_generic(g);
    if (gs) {
      printf("prewarm: no generic kernel: %s\n", jit_status_message(gs));
      jit_status_free(gs);
    } else {
      printf("prewarm: generic kernel ready\n");
    }
    for (int i = 0; i < jobs; i++) pthread_create(&th[i], NULL, prewarm_worker, &j);
    for (int i = 0; i < jobs; i++) pthread_join(th[i], NULL);
    if (j.tty && j.total) fprintf(stderr, "\n");
    if (a->hot) {
      size_t ready = 0;
      jit_status hs = jit_graph_prewarm_hot(g, 0, &ready);
      printf("prewarm: %zu hot bindings ready\n", ready);
      if (hs) {
        fprintf(stderr, "jitml: %s\n", jit_status_message(hs));
        jit_status_free(hs);
        atomic_fetch_add(&j.failed, 1);
      }
    }
    jit_stats st = {0};
    jit_context_stats(ctx, &st);
    size_t failed = atomic_load(&j.failed);
    printf("prewarm: %zu bindings in %.1f s: %llu compiled, %llu from disk, %zu failed; "
           "cache %s\n",
           j.total, (now_ms() - t0) / 1e3, (unsigned long long)st.compiles,
           (unsigned long long)st.disk_hits, failed, jit_cache_dir(ctx, NULL));
    pthread_mutex_destroy(&j.print_mu);
    if (failed) rc = kExitFail;
    if (a->remote && transfer(ctx, true) != kExitOk) rc = kExitFail;
    if (a->expect_warm && st.compiles > 0) {
      fprintf(stderr, "jitml: --expect-warm: %llu kernels were not in the cache\n",
              (unsigned long long)st.compiles);
      rc = kExitFail;
    }
  }
  close_model(&b, ctx, g);
  return rc;
}

//===--- run -------------------------------------------------------------===//

static int cmd_run(const args *a) {
  binding_set b;
  jit_context *ctx = NULL;
  jit_graph *g = NULL;
  int rc = open_model(a, &b, &ctx, &g);
  jit_status s = NULL;
  size_t total = binding_count(&b);
  for (size_t i = 0; rc == kExitOk && i < total; i++) {
    inputs in;
    char desc[256];
    rc = make_inputs(g, &b, i, true, &in, desc, sizeof desc);
    DLManagedTensor *outs[64] = {0};
    int n_out = jit_graph_num_outputs(g);
    for (int r = 0; rc == kExitOk && r < (a->repeat > 0 ? a->repeat : 1); r++) {
      jit_stats before = {0}, after = {0};
      jit_context_stats(ctx, &before);
      double t0 = now_ms();
      s = jit_run_alloc(g, in.t, in.n, outs, n_out);
      double ms = now_ms() - t0;
      if (s) {
        rc = fail(s, desc);
        break;
      }
      jit_context_stats(ctx, &after);
      const char *from = after.compiles > before.compiles     ? "compiled"
                         : after.disk_hits > before.disk_hits ? "disk"
                                                              : "memory";
      double sum = 0;
      for (int o = 0; o < n_out; o++) {
        DLTensor *t = &outs[o]->dl_tensor;
        size_t count = 1;
        for (int d = 0; d < t->ndim; d++) count *= (size_t)t->shape[d];
        if (t->dtype.bits == 32)
          for (size_t e = 0; e < count; e++) sum += ((float *)t->data)[e];
        outs[o]->deleter(outs[o]);
      }
      printf("%s  call %d: %9.3f ms  kernel from %-8s  checksum %.6g\n", desc, r + 1, ms,
             from, sum);
    }
    free_inputs(&in);
  }
  close_model(&b, ctx, g);
  return rc;
}

//===--- explain ---------------------------------------------------------===//

static int cmd_explain(const args *a) {
  binding_set b;
  jit_context *ctx = NULL;
  jit_graph *g = NULL;
  int rc = open_model(a, &b, &ctx, &g);
  jit_status s = NULL;
  size_t total = binding_count(&b);
  for (size_t i = 0; rc == kExitOk && i < total; i++) {
    inputs in;
    char desc[256];
    rc = make_inputs(g, &b, i, false, &in, desc, sizeof desc);
    if (rc) break;
    char *text = NULL;
    s = jit_cache_explain(g, in.t, in.n, &text);
    if (s) {
      rc = fail(s, desc);
      break;
    }
    printf("%s:\n%s", desc, text);
    jit_string_free(text);
  }
  close_model(&b, ctx, g);
  return rc;
}

//===--- cache -----------------------------------------------------------===//

typedef struct ls_state {
  bool json, quiet;  // quiet: only count (for `cache stats`)
  uint64_t n, bytes;
} ls_state;

static void json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') printf("\\%c", *s);
    else if (*s == '\n') printf("\\n");
    else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
    else putchar(*s);
  }
  putchar('"');
}

static int ls_visit(void *user, const jit_cache_entry_info *e) {
  ls_state *st = user;
  if (st->quiet) {
  } else if (st->json) {
    printf("%s{\"key\":\"%s\",\"kind\":\"%s\",\"size\":%llu,\"last_used\":%lld,"
           "\"components\":",
           st->n ? "," : "", e->key, e->kind, (unsigned long long)e->size,
           (long long)e->last_used);
    json_string(e->components);
    printf("}");
  } else {
    // One line per entry: key, kind, size, and the graph and input shapes.
    char shapes[512] = "";
    size_t n = 0;
    for (const char *p = e->components; p && *p && n < sizeof shapes - 1;) {
      const char *eol = strchr(p, '\n');
      size_t len = eol ? (size_t)(eol - p) : strlen(p);
      if (!strncmp(p, "input.", 6) || !strncmp(p, "graph_name=", 11))
        n += (size_t)snprintf(shapes + n, sizeof shapes - n, "%s%.*s", n ? "  " : "",
                              (int)len, p);
      p = eol ? eol + 1 : NULL;
    }
    printf("%s  %-10s %8llu B  %s\n", e->key, e->kind, (unsigned long long)e->size, shapes);
  }
  st->n++;
  st->bytes += e->size;
  return 1;
}

static int cmd_cache(const char *sub, const args *a) {
  jit_context *ctx = NULL;
  jit_status s = open_context(a, &ctx);
  if (s) return fail(s, "context");
  const char *reason = NULL;
  const char *dir = jit_cache_dir(ctx, &reason);
  int rc = kExitOk;
  uint64_t n1 = 0, n2 = 0;
  if (!dir[0]) {
    fprintf(stderr, "jitml: the disk cache is off: %s\n", reason ? reason : "disabled");
    rc = kExitFail;
  } else if (!strcmp(sub, "ls") || !strcmp(sub, "stats")) {
    bool ls = !strcmp(sub, "ls");
    ls_state st = {a->json && ls, !ls, 0, 0};
    if (st.json) printf("[");
    s = jit_cache_list(ctx, ls_visit, &st);
    if (st.json) printf("]\n");
    if (s) {
      rc = fail(s, "cache ls");
    } else if (!strcmp(sub, "stats")) {
      const char *state = NULL, *url = jit_cache_remote(ctx, &state);
      if (a->json) {
        printf("{\"dir\":\"%s\",\"entries\":%llu,\"bytes\":%llu,\"remote\":", dir,
               (unsigned long long)st.n, (unsigned long long)st.bytes);
        if (url) json_string(url);
        else printf("null");
        printf(",\"remote_state\":");
        json_string(state);
        printf("}\n");
      } else {
        printf("dir %s\nentries %llu\nbytes %llu\nremote %s\nremote_state %s\n", dir,
               (unsigned long long)st.n, (unsigned long long)st.bytes, url ? url : "none",
               state);
      }
    }
  } else if (!strcmp(sub, "verify")) {
    s = jit_cache_verify(ctx, &n1, &n2);
    if (s) rc = fail(s, "cache verify");
    else if (a->json) printf("{\"checked\":%llu,\"bad\":%llu}\n", (unsigned long long)n1, (unsigned long long)n2);
    else printf("checked %llu entries, removed %llu bad\n", (unsigned long long)n1, (unsigned long long)n2);
    if (!s && n2) rc = kExitFail;
  } else if (!strcmp(sub, "prune")) {
    s = jit_cache_prune(ctx, &n1);
    if (s) rc = fail(s, "cache prune");
    else if (a->json) printf("{\"evicted\":%llu}\n", (unsigned long long)n1);
    else printf("evicted %llu entries\n", (unsigned long long)n1);
  } else if (!strcmp(sub, "clear")) {
    s = jit_cache_clear(ctx, &n1);
    if (s) rc = fail(s, "cache clear");
    else if (a->json) printf("{\"removed\":%llu}\n", (unsigned long long)n1);
    else printf("removed %llu entries\n", (unsigned long long)n1);
  } else if (!strcmp(sub, "push")) {
    rc = transfer(ctx, true);
  } else if (!strcmp(sub, "pull")) {
    rc = transfer(ctx, false);
  } else if (!strcmp(sub, "export") || !strcmp(sub, "import")) {
    bool ex = !strcmp(sub, "export");
    s = !ex ? jit_cache_import(ctx, a->path, &n1)
        : a->sign ? jit_cache_export_signed(ctx, a->path, a->sign, &n1)
                  : jit_cache_export(ctx, a->path, &n1);
    if (s) rc = fail(s, ex ? "cache export" : "cache import");
    else printf("%s %llu entries %s %s%s\n", ex ? "exported" : "imported",
                (unsigned long long)n1, ex ? "to" : "from", a->path,
                ex && a->sign ? " (signed)" : "");
  }
  jit_context_destroy(ctx);
  return rc;
}

// Reads all of `path` ("-": stdin), at most 256 MiB; NULL with a message otherwise.
static char *read_all(const char *path, size_t *out_len) {
  FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
  if (!f) {
    fprintf(stderr, "jitml: cannot open %s: %s\n", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, len = 0, limit = (size_t)256 << 20;
  char *buf = malloc(cap);
  while (buf) {
    if (len == cap) {
      char *b = cap < limit ? realloc(buf, cap * 2) : NULL;
      if (!b) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = b;
      cap *= 2;
    }
    size_t n = fread(buf + len, 1, cap - len, f);
    len += n;
    if (n == 0) break;
  }
  bool err = ferror(f);
  if (f != stdin) fclose(f);
  if (!buf || err || len > limit) {
    fprintf(stderr, "jitml: cannot read %s%s\n", path,
            !buf || len > limit ? ": more than 256 MiB or out of memory" : "");
    free(buf);
    return NULL;
  }
  *out_len = len;
  return buf;
}

static int cmd_opt(const char *path, const char *pipeline) {
  size_t len = 0;
  char *text = read_all(path, &len);
  if (!text) return kExitFail;
  char *out = NULL;
  jit_status s = jit_mlir_opt(text, len, pipeline, strcmp(path, "-") ? path : "<stdin>", &out);
  free(text);
  if (s) return fail(s, "opt");
  fputs(out, stdout);
  jit_string_free(out);
  return kExitOk;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage_error("missing command");
  const char *cmd = argv[1];
  args a = {0};
  a.jobs = 2;
  a.repeat = 1;
  int rc;
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    fputs(kUsage, stdout);
    return kExitOk;
  }
  if (!strcmp(cmd, "--version")) {
    printf("jitml %s\n", jit_version());
    return kExitOk;
  }
  if (!strcmp(cmd, "prewarm") || !strcmp(cmd, "run") || !strcmp(cmd, "explain")) {
    if ((rc = parse_args(argc, argv, 2, &a, true, false))) return rc;
    if (!strcmp(cmd, "prewarm")) {
      a.exact = true;
      return cmd_prewarm(&a);
    }
    if (!strcmp(cmd, "run")) return cmd_run(&a);
    return cmd_explain(&a);
  }
  if (!strcmp(cmd, "opt")) {
    if (argc != 4) return usage_error("opt takes FILE.mlir and a PIPELINE");
    return cmd_opt(argv[2], argv[3]);
  }
  if (!strcmp(cmd, "keygen")) {
    if (argc != 3 || argv[2][0] == '-') return usage_error("keygen takes one SECRET_KEY path");
    char pk[65];
    jit_status s = jit_bundle_keygen(argv[2], pk);
    if (s) return fail(s, "keygen");
    printf("%s\n", pk);
    return kExitOk;
  }
  if (!strcmp(cmd, "cache")) {
    if (argc < 3) return usage_error("missing cache subcommand");
    const char *sub = argv[2];
    bool bundle = !strcmp(sub, "export") || !strcmp(sub, "import");
    if (!bundle && strcmp(sub, "ls") && strcmp(sub, "stats") && strcmp(sub, "verify") &&
        strcmp(sub, "prune") && strcmp(sub, "clear") && strcmp(sub, "push") &&
        strcmp(sub, "pull")) {
      char msg[160];
      snprintf(msg, sizeof msg, "unknown cache subcommand `%.100s`", sub);
      return usage_error(msg);
    }
    if ((rc = parse_args(argc, argv, 3, &a, false, bundle))) return rc;
    if (a.sign && strcmp(sub, "export") && strcmp(sub, "push"))
      return usage_error("--sign is for cache export and cache push");
    if (a.trust && strcmp(sub, "import") && strcmp(sub, "pull"))
      return usage_error("--trust is for cache import and cache pull");
    a.remote_sign = !strcmp(sub, "push");
    return cmd_cache(sub, &a);
  }
  char msg[160];
  snprintf(msg, sizeof msg, "unknown command `%.100s`", cmd);
  return usage_error(msg);
}
