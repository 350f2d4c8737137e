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

void jit__kernel_free(jit__kernel *k) {
  if (!k) return;
  jit__gpu_exec_destroy(k->gpu);
  free(k->outputs);
  free(k->dims);
  free(k->fail_message);
  free(k);
}

void jit__kernel_table_free(jit__kernel_table *t) {
  for (size_t i = 0; i < t->cap; i++) jit__kernel_free(t->slots[i]);
  free(t->slots);
  memset(t, 0, sizeof(*t));
}

