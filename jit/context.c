//===--- context.c - jit_context, options, logging, version ----------------===//
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <xxhash.h>

#include "jit/internal.h"
#include "jit/kernel_table.h"

void jit_string_free(char *text) { free(text); }

void jit_options_init(jit_options *o) {
  if (!o) return;
  memset(o, 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->opt_level = 2;
  o->num_threads = 0;
  o->log_level = JIT_LOG_WARNING;
}


// Frees the context record and what it owns from its first moments on.
static void jit__context_free(jit_context *ctx) {
  free((char *)ctx->options.cuda_toolkit);
  free(ctx);
}

// The largest cache_max_age_s: the cache compares ages in int64 nanoseconds, so a
// larger value (about 292 years) cannot be represented there.
#define JIT__MAX_CACHE_AGE_S ((uint64_t)INT64_MAX / 1000000000u)

// Refuses option fields outside their documented ranges (see jit_options), naming the
// field, so that a typo fails at creation rather than as odd behaviour later.
static jit_status jit__check_option_ranges(const jit_options *o) {
  if (o->opt_level < 0 || o->opt_level > 3)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_context_create: options.opt_level is %d, not in [0, 3]",
                   o->opt_level);
  if (o->num_threads < 0 || o->num_threads > JIT_MAX_THREADS)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_context_create: options.num_threads is %d, not in [0, %d]",
                   o->num_threads, JIT_MAX_THREADS);
  if ((int)o->log_level < JIT_LOG_ERROR || (int)o->log_level > JIT_LOG_DEBUG)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_context_create: options.log_level is %d, not in [%d, %d] "
                   "(JIT_LOG_ERROR .. JIT_LOG_DEBUG)",
                   (int)o->log_level, JIT_LOG_ERROR, JIT_LOG_DEBUG);
  // No lower bound: small limits are how eviction is tested. The upper one keeps the
  // cache's size sums (int64 on disk and in stat) from wrapping.
  if ((int)o->mlir_isolation < JIT_ISOLATION_AUTO || (int)o->mlir_isolation > JIT_ISOLATION_ALL)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_context_create: options.mlir_isolation is %d, "
                   "not a jit_isolation", (int)o->mlir_isolation);
  if (o->isolation_max_bytes && o->isolation_max_bytes < ((uint64_t)1 << 30))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_context_create: options.isolation_max_bytes "
                   "is %llu, below 1 GiB", (unsigned long long)o->isolation_max_bytes);
  if (o->cache_max_bytes > (uint64_t)INT64_MAX)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_context_create: options.cache_max_bytes is %llu, more than %lld",
                   (unsigned long long)o->cache_max_bytes, (long long)INT64_MAX);
  if (o->cache_max_age_s > JIT__MAX_CACHE_AGE_S)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_context_create: options.cache_max_age_s is %llu, more than %llu "
                   "(use 0 for no age limit)",
                   (unsigned long long)o->cache_max_age_s,
                   (unsigned long long)JIT__MAX_CACHE_AGE_S);
  if (o->remote_lock_wait_ms < -1 || o->remote_lock_wait_ms > 3600000)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_context_create: options.remote_lock_wait_ms "
                   "is %d, not in [-1, 3600000]", o->remote_lock_wait_ms);
  if ((int)o->conv_algorithm < JIT_CONV_ALGORITHM_AUTO ||
      (int)o->conv_algorithm > JIT_CONV_ALGORITHM_IM2COL)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_context_create: options.conv_algorithm is %d, "
                   "not a jit_conv_algorithm", (int)o->conv_algorithm);
  if (o->cache_allow_shared_readonly != 0 && o->cache_allow_shared_readonly != 1)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_context_create: options.cache_allow_shared_readonly is %d, not 0 "
                   "or 1", o->cache_allow_shared_readonly);
  return NULL;
}

int jit__env_choice(const char *value, const char *const *names, int n) {
  for (int i = 0; value && i < n; i++)
    if (strcasecmp(value, names[i]) == 0) return i;
  return -1;
}

// $JITML_CONV_ALGORITHM (auto or im2col), when set, in place of options.conv_algorithm.
static jit_status jit__conv_algorithm_env(jit_options *o) {
  static const char *const names[] = {"auto", "im2col"};  // jit_conv_algorithm's order
  const char *env = getenv("JITML_CONV_ALGORITHM");
  if (!env || !env[0]) return NULL;
  int found = jit__env_choice(env, names, 2);
  if (found < 0)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_context_create: JITML_CONV_ALGORITHM is `%s`, not auto or im2col", env);
  o->conv_algorithm = (jit_conv_algorithm)found;
  return NULL;
}

// Opens the disk cache and, when configured, the fleet tier behind it. The caller's
// strings are not kept.
static jit_status jit__open_cache(jit_context *ctx, const jit_options *o) {
  jit__cache_options co = {0};
  co.trusted = &ctx->trusted;
  co.dir = o->cache_dir;
  co.max_bytes = o->cache_max_bytes;
  co.max_age_s = o->cache_max_age_s;
  co.allow_shared_readonly = o->cache_allow_shared_readonly != 0;
  co.logger = ctx->logger;
  ctx->options.remote_cache = ctx->options.remote_prefix = NULL;
  ctx->options.remote_signing_key = NULL;
  const char *url = o->remote_cache ? o->remote_cache : getenv("JITML_REMOTE_CACHE");
  const char *key_path = o->remote_signing_key ? o->remote_signing_key
                                               : getenv("JITML_REMOTE_SIGNING_KEY");
  jit__remote_options ro = {
      .url = url,
      .prefix = o->remote_prefix ? o->remote_prefix : getenv("JITML_REMOTE_PREFIX"),
      .connect_timeout_ms = o->remote_connect_timeout_ms,
      .timeout_ms = o->remote_timeout_ms,
      .ttl_s = o->remote_ttl_s,
      .max_bytes = o->remote_max_bytes,
      .failures_to_pause = o->remote_failures_to_pause,
      .pause_ms = o->remote_pause_ms,
  };
  uint8_t secret[JIT__SIGN_SECRET_BYTES];
  if (url && *url) {
    co.remote = &ro;
    co.remote_lock_wait_ms = o->remote_lock_wait_ms ? o->remote_lock_wait_ms : 30000;
    if (key_path && *key_path) {
      jit_status s = jit__sign_read_secret(key_path, secret);
      if (s)
        return jit__status_annotate(s, o->remote_signing_key ? "options.remote_signing_key"
                                                             : "JITML_REMOTE_SIGNING_KEY");
      co.remote_secret = secret;
    }
  }
  jit_status s = jit__cache_open(&co, &ctx->cache);
  jit__sign_wipe(secret, sizeof secret);
  return s;
}

jit_status jit_context_create(const jit_options *options, jit_context **out_ctx) {
  if (!out_ctx) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_context_create: out_ctx is NULL");
  *out_ctx = NULL;
  jit_options o;
  jit_options_init(&o);
  if (options) {
    if (options->struct_size < offsetof(jit_options, log_level) + sizeof(int) ||
        options->struct_size > sizeof(jit_options))
      return JIT_ERR(JIT_INVALID_ARGUMENT,
                     "jit_context_create: options.struct_size is %zu; call "
                     "jit_options_init first",
                     options->struct_size);
    memcpy(&o, options, options->struct_size);
    o.struct_size = sizeof(o);
  }
  JIT_PROPAGATE(jit__check_option_ranges(&o));
  JIT_PROPAGATE(jit__conv_algorithm_env(&o));
  if (!o.log_fn) {
    const char *env = getenv("JITML_LOG");
    static const char *const levels[] = {"error", "warning", "info", "debug"};
    int i = jit__env_choice(env, levels, 4);
    if (i >= 0) {
      o.log_fn = jit__log_to_stderr;
      o.log_level = (jit_log_level)i;
    }
  }

  jit_context *ctx = calloc(1, sizeof(*ctx));
  char *toolkit = o.cuda_toolkit ? strdup(o.cuda_toolkit) : NULL;
  if (!ctx || (o.cuda_toolkit && !toolkit)) {
    free(ctx);
    free(toolkit);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_context_create: out of memory");
  }
  o.cuda_toolkit = toolkit;
  ctx->options = o;
  ctx->logger = (jit__logger){o.log_fn, o.log_user_data, o.log_level};
  jit_status s = jit__shape_options(ctx, &o);
  if (s) {
    jit__context_free(ctx);
    return s;
  }
  const jit__cpu_target *t = jit__cpu_host_target();
  if (t->features_ignored)
    jit__log(ctx, JIT_LOG_WARNING,
             "JITML_CPU_FEATURES: `%s` turned nothing off (only \"-feature\" items for "
             "features this machine has count); ignored",
             t->features_ignored);
  if (t->l2_ignored)
    jit__log(ctx, JIT_LOG_WARNING,
             "JITML_CPU_L2: `%s` is not a size from 16K to 1024M (bytes, or a number with "
             "a K or M suffix); ignored",
             t->l2_ignored);
  if (t->l3_ignored)
    jit__log(ctx, JIT_LOG_WARNING,
             "JITML_CPU_L3: `%s` is not a size from 16K to 1024M (bytes, or a number with "
             "a K or M suffix); ignored",
             t->l3_ignored);
  size_t cap = strlen(t->features) + 1024;
  ctx->target_text = malloc(cap);
  if (!ctx->target_text) {
    jit__context_free(ctx);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_context_create: out of memory");
  }
  int n = snprintf(ctx->target_text, cap,
                   "backend=cpu\ntarget.triple=%s\ntarget.cpu=%s\ntarget.features=%s\n"
                   "target.l2=%ld\ntarget.l3=%ld\n"
                   "compiler=libjitml %s, LLVM %s\nbuild_id=%s\nopt_level=%d\nthreads=%d\n",
                   t->triple, t->cpu, t->features, t->l2_bytes, t->l3_bytes, jit_version(),
                   JITML_LLVM_VERSION,
                   jit__library_build_id(), o.opt_level, jit__cpu_threads(o.num_threads));
  // Only where it is not the default: the keys of existing caches stay as they were.
  if (n > 0 && (size_t)n < cap && o.conv_algorithm == JIT_CONV_ALGORITHM_IM2COL)
    n += snprintf(ctx->target_text + n, cap - (size_t)n, "conv_algorithm=im2col\n");
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(ctx->target_text, n > 0 ? (size_t)n : 0));
  memcpy(ctx->target_hash, c.digest, sizeof(ctx->target_hash));
  const char *keys = o.bundle_trusted_keys ? o.bundle_trusted_keys
                                           : getenv("JITML_TRUSTED_KEYS");
  s = jit__sign_parse_keys(keys, o.bundle_trusted_keys ? "options.bundle_trusted_keys"
                                                       : "JITML_TRUSTED_KEYS",
                           &ctx->trusted);
  ctx->options.bundle_trusted_keys = NULL;  // the caller's text is not kept
  if (s) {
    free(ctx->target_text);
    jit__context_free(ctx);
    return jit__status_annotate(s, "jit_context_create");
  }
  s = jit__open_cache(ctx, &o);
  if (!s) s = jit__devices_init_cpu(ctx);
  // The CPU device (its LLJIT instance) is opened with the context: every graph runs
  // there unless told otherwise.
  if (!s) s = jit__device_open(ctx->devices[0]);
  if (!s && o.device && o.device[0] && strcmp(o.device, "cpu") != 0) {
    jit_device *d = NULL;
    s = jit__device_from_option(ctx, o.device, &d);
    if (!s) ctx->offload = d;
  }
  if (s) {
    if (ctx->devices) jit__devices_destroy(ctx);
    jit__cache_close(ctx->cache);
    free(ctx->target_text);
    jit__context_free(ctx);
    return jit__status_annotate(s, "jit_context_create");
  }
  jit__isolation_init(ctx);
  pthread_mutex_init(&ctx->mu, NULL);
  pthread_cond_init(&ctx->cv, NULL);
  ctx->mlir_pool = jit__mlir_pool_create();  // none: each compile makes its own
  ctx->spec = jit__spec_create();  // none: bindings stay on their generic kernels
  jit__fork_register(ctx);
  jit__log(ctx, JIT_LOG_DEBUG, "context created: libjitml %s, LLVM %s, target %s/%s",
           jit_version(), JITML_LLVM_VERSION, t->triple, t->cpu);
  *out_ctx = ctx;
  return NULL;
}

// Defined in run.c: frees the kernel table.

void jit_context_destroy(jit_context *ctx) {
  if (!ctx) return;
  jit__fork_unregister(ctx);
  jit__spec_destroy(ctx->spec);
  // Kernels unload their code (GPU kernels free their device temporaries) while the
  // devices are still open.
  jit__kernel_table_free(&ctx->table, ctx->devices[0]);
  jit__devices_destroy(ctx);
  jit__cache_close(ctx->cache);
  free(ctx->target_text);
  jit__mlir_pool_destroy(ctx->mlir_pool);
  pthread_cond_destroy(&ctx->cv);
  pthread_mutex_destroy(&ctx->mu);
  jit__context_free(ctx);
}

jit_status jit_context_stats(jit_context *ctx, jit_stats *out) {
  if (!ctx || !out)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_context_stats: %s is NULL",
                   ctx ? "out_stats" : "ctx");
  size_t size = out->struct_size ? out->struct_size : sizeof(jit_stats);
  if (size > sizeof(jit_stats) || size < sizeof(size_t))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_context_stats: struct_size %zu is invalid",
                   size);
  jit_stats s = {0};
  s.struct_size = size;
  s.runs = atomic_load(&ctx->runs);
  s.memory_hits = atomic_load(&ctx->memory_hits);
  s.misses = atomic_load(&ctx->misses);
  s.compiles = atomic_load(&ctx->compiles);
  s.disk_hits = atomic_load(&ctx->disk_hits);
  pthread_mutex_lock(&ctx->mu);
  s.compile_ms = ctx->compile_ms;
  s.load_ms = ctx->load_ms;
  s.kernels = ctx->n_code + ctx->n_pinned;
  pthread_mutex_unlock(&ctx->mu);
  jit__cache_stats cs;
  jit__cache_get_stats(ctx->cache, &cs);
  s.bytes_written = cs.bytes_written;
  s.bytes_read = cs.bytes_read;
  s.evictions = cs.evictions;
  s.bad_entries = cs.bad_entries;
  s.cuda_cubin_loads = atomic_load(&ctx->cuda_cubin_loads);
  s.cuda_ptx_loads = atomic_load(&ctx->cuda_ptx_loads);
  s.generic_runs = atomic_load(&ctx->generic_runs);
  s.generic_compiles = atomic_load(&ctx->generic_compiles);
  s.specializations = atomic_load(&ctx->specializations);
  s.specialization_failures = atomic_load(&ctx->spec_failures);
  s.specializations_pending = jit__spec_pending(ctx->spec);
  s.kernels_unloaded = atomic_load(&ctx->unloaded);
  s.remote_hits = cs.remote_hits;
  s.remote_misses = cs.remote.misses;
  s.remote_errors = cs.remote.errors;
  s.remote_skipped = cs.remote.skipped;
  s.remote_rejected = cs.remote_rejected;
  s.remote_puts = cs.remote.puts;
  s.remote_puts_dropped = cs.remote.puts_dropped;
  s.remote_bytes_read = cs.remote.bytes_read;
  s.remote_bytes_written = cs.remote.bytes_written;
  s.weight_packs = atomic_load(&ctx->weight_packs);
  memcpy(out, &s, size);
  return NULL;
}
