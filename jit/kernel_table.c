//===--- kernel_table.c - loaded kernels by key ----------------------------===//
#include "jit/kernel_table.h"

#include <stdlib.h>
#include <string.h>

static size_t jit__key_slot(const uint8_t key[16], size_t cap) {
  uint64_t h;
  memcpy(&h, key, sizeof(h));
  return (size_t)h & (cap - 1);
}

jit__kernel *jit__table_find(jit__kernel_table *t, const uint8_t key[16]) {
  if (!t->cap) return NULL;
  for (size_t i = jit__key_slot(key, t->cap);; i = (i + 1) & (t->cap - 1)) {
    jit__kernel *k = t->slots[i];
    if (!k) return NULL;
    if (memcmp(k->key, key, 16) == 0) return k;
  }
}

bool jit__table_insert(jit__kernel_table *t, jit__kernel *k) {
  if ((t->count + 1) * 2 > t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    jit__kernel **slots = calloc(cap, sizeof(*slots));
    if (!slots) return false;
    for (size_t i = 0; i < t->cap; i++) {
      jit__kernel *o = t->slots[i];
      if (!o) continue;
      size_t j = jit__key_slot(o->key, cap);
      while (slots[j]) j = (j + 1) & (cap - 1);
      slots[j] = o;
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
  }
  size_t j = jit__key_slot(k->key, t->cap);
  while (t->slots[j]) j = (j + 1) & (t->cap - 1);
  t->slots[j] = k;
  t->count++;
  return true;
}

void jit__table_remove(jit__kernel_table *t, jit__kernel *k) {
  if (!t->cap) return;
  size_t i = jit__key_slot(k->key, t->cap);
  while (t->slots[i] && t->slots[i] != k) i = (i + 1) & (t->cap - 1);
  if (!t->slots[i]) return;
  t->slots[i] = NULL;
  t->count--;
  // Linear probing: entries after the hole that probed past it move back into it.
  for (size_t j = (i + 1) & (t->cap - 1); t->slots[j]; j = (j + 1) & (t->cap - 1)) {
    size_t home = jit__key_slot(t->slots[j]->key, t->cap);
    // Does the probe path of the entry at j (from home) pass through the hole i?
    bool passes = i <= j ? (home <= i || home > j) : (home <= i && home > j);
    if (passes) {
      t->slots[i] = t->slots[j];
      t->slots[j] = NULL;
      i = j;
    }
  }
}

bool jit__kernel_owns_code(const jit__kernel *k) { return k->exact.code || k->gpu; }

void jit__kernel_free(jit__kernel *k, jit_device *cpu) {
  if (!k) return;
  jit__gpu_exec_destroy(k->gpu);
  jit__gpu_exec_destroy(k->gpu_retired);
  jit__gpu_generic_free(k->gpu_generic);
  if (k->exact.code) cpu->backend->vt->unload(k->exact.code);
  free(k->outputs);
  free(k->dims);
  free(k->fail_message);
  free(k);
}

void jit__kernel_table_free(jit__kernel_table *t, jit_device *cpu) {
  for (size_t i = 0; i < t->cap; i++) jit__kernel_free(t->slots[i], cpu);
  free(t->slots);
  memset(t, 0, sizeof(*t));
}
