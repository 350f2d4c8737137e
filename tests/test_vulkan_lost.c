//===--- test_vulkan_lost.c - a Vulkan device that is lost mid-work -------===//
//
// The Vulkan backend runs on a shim library (vk_fault_shim.c) that forwards to the
// real loader and driver (lavapipe in CI) but reports VK_ERROR_DEVICE_LOST on demand.
// Buffers use the staging path, so every transfer is a queue submission. A lost device
// must give a clean JIT_DEVICE_ERROR naming the loss, refuse further work with a
// message saying to create a new device, be destroyed without hanging, and leave the
// instance usable for a new device. Skipped ("skipped: no Vulkan device") without one.
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "devices/vulkan/vulkan.h"
#include "vk_fault_shim.h"

#define OK(expr)                                                               \
  do {                                                                         \
    jit_status s_ = (expr);                                                    \
    cr_assert(s_ == NULL, "%s: %s", #expr, s_ ? jit_status_message(s_) : ""); \
  } while (0)

static jit__vk_instance *g_inst;
static jitml_vk_fault_fn g_fault;

// The instance on the shim, or a skipped test.
static void open_instance(void) {
  jit__vk_instance_options o = {.library = JITML_TEST_VK_SHIM};
  jit_status s = jit__vk_instance_create(&o, &g_inst);
  if (s && jit_status_get_code(s) == JIT_UNAVAILABLE) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", jit_status_message(s));
    jit_status_free(s);
    cr_log_warn("skipped: no Vulkan device (%s)", msg);
    cr_skip_test("skipped: no Vulkan device (%s)", msg);
  }
  OK(s);
  // See test_vulkan.c: lavapipe's never-freed global stays reachable.
  (void)dlopen("libvulkan_lvp.so", RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  void *shim = dlopen(JITML_TEST_VK_SHIM, RTLD_NOW | RTLD_NOLOAD);
  cr_assert(shim, "the shim is not loaded");
  g_fault = (jitml_vk_fault_fn)dlsym(shim, "jitml_vk_fault");
  cr_assert(g_fault);
  dlclose(shim);  // the instance keeps its own reference
  g_fault(JITML_VK_FAULT_NONE);
}

static jit__vk_device *open_device(void) {
  uint32_t index = 0;
  OK(jit__vk_instance_select(g_inst, NULL, &index));
  jit__vk_device_options o = {.timeout_ns = 5ull * 1000 * 1000 * 1000, .force_staging = true};
  jit__vk_device *d = NULL;
  OK(jit__vk_device_create(g_inst, index, &o, &d));
  return d;
}

static void expect_error(jit_status s, const char *needle, const char *what) {
  cr_assert(s, "%s: no error", what);
  cr_expect_eq(jit_status_get_code(s), JIT_DEVICE_ERROR, "%s: %s (%s)", what,
               jit_status_code_name(jit_status_get_code(s)), jit_status_message(s));
  cr_expect(strstr(jit_status_message(s), needle), "%s: `%s` lacks `%s`", what,
            jit_status_message(s), needle);
  jit_status_free(s);
}

// Uploads 1..n and reads them back.
static void expect_roundtrip(jit__vk_buffer *b, int n) {
  float in[64], out[64];
  for (int i = 0; i < n; i++) in[i] = (float)i + 1, out[i] = 0;
  OK(jit__vk_buffer_upload(b, 0, in, sizeof(float) * (size_t)n));
  OK(jit__vk_buffer_download(b, 0, out, sizeof(float) * (size_t)n));
  cr_expect(!memcmp(in, out, sizeof(float) * (size_t)n), "data lost in a round trip");
}

static void lose_device(int mode, const char *needle) {
  jit__vk_device *d = open_device();
  jit__vk_buffer *b = NULL;
  OK(jit__vk_buffer_create(d, 256, &b));
  expect_roundtrip(b, 64);
  float x[64] = {0};
  g_fault(mode);
  expect_error(jit__vk_buffer_upload(b, 0, x, sizeof x), needle, "the transfer that loses it");
  g_fault(JITML_VK_FAULT_NONE);
  // Even with the driver answering again, the device stays lost: later work is refused
  // before anything is submitted.
  expect_error(jit__vk_buffer_download(b, 0, x, sizeof x), "create a new device",
               "work after the loss");
  jit__vk_buffer *b2 = NULL;
  jit_status s = jit__vk_buffer_create(d, 256, &b2);
  if (s) expect_error(s, "lost", "a buffer after the loss");
  jit__vk_buffer_destroy(b2);
  jit__vk_buffer_destroy(b);
  jit__vk_device_destroy(d);  // bounded: must return
  // The instance is fine: a new device works.
  d = open_device();
  OK(jit__vk_buffer_create(d, 256, &b));
  expect_roundtrip(b, 64);
  jit__vk_buffer_destroy(b);
  jit__vk_device_destroy(d);
}

static void close_instance(void) {
  if (g_fault) g_fault(JITML_VK_FAULT_NONE);
  jit__vk_instance_release(g_inst);
  g_inst = NULL;
}

Test(vulkan_lost, on_submit, .fini = close_instance, .timeout = 120) {
  open_instance();
  lose_device(JITML_VK_LOSE_ON_SUBMIT, "VK_ERROR_DEVICE_LOST");
}

Test(vulkan_lost, on_wait, .fini = close_instance, .timeout = 120) {
  open_instance();
  lose_device(JITML_VK_LOSE_ON_WAIT, "VK_ERROR_DEVICE_LOST");
}
