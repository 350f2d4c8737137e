//===--- buildid.c - a stable identity of the running libjitml binary ------===//
//
// Part of every cache key, so that a rebuilt library never loads kernels compiled by
// (and laid out for) an older one. The linker's NT_GNU_BUILD_ID note is exactly that
// identity and costs nothing to read from memory; a binary linked without one falls
// back to a hash of its file. Computed once per process.
//
//===----------------------------------------------------------------------===//
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // dladdr, dl_iterate_phdr
#endif

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/hex.h"
#include "cache/internal.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
// "gnu-" + up to 64 hex digits of the note, or "xxh3-" + 32 hex digits of the file.
static char g_build_id[80] = "unknown";

typedef struct find_note {
  uintptr_t addr;      // an address inside the object we look for
  bool found;          // the object was found
  char path[4096];     // its file ("" for the main program)
} find_note;

static int visit_object(struct dl_phdr_info *info, size_t size, void *data) {
  find_note *f = data;
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum && !mine; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    mine = ph->p_type == PT_LOAD && f->addr >= start && f->addr < start + ph->p_memsz;
  }
  if (!mine) return 0;
  f->found = true;
  snprintf(f->path, sizeof(f->path), "%s", info->dlpi_name ? info->dlpi_name : "");
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_NOTE) continue;
    // Notes are 4-byte aligned, or 8 in a PT_NOTE segment aligned so.
    size_t align = ph->p_align == 8 ? 8 : 4;
    const uint8_t *p = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr);
    const uint8_t *end = p + ph->p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      ElfW(Nhdr) nh;
      memcpy(&nh, p, sizeof(nh));
      const uint8_t *name = p + sizeof(nh);
      const uint8_t *desc = name + ((nh.n_namesz + align - 1) & ~(align - 1));
      const uint8_t *next = desc + ((nh.n_descsz + align - 1) & ~(align - 1));
      if (next > end || desc + nh.n_descsz > end) break;
      if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 && memcmp(name, "GNU", 4) == 0 &&
          nh.n_descsz > 0 && nh.n_descsz <= 32) {
        memcpy(g_build_id, "gnu-", 4);
        jit__hex_encode(desc, nh.n_descsz, g_build_id + 4);
        return 1;
      }
      p = next;
    }
  }
  return 1;  // found the object, but it has no note: the caller hashes its file
}

static bool hash_file(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  XXH3_state_t *state = XXH3_createState();
  bool ok = state != NULL;
  if (ok) XXH3_128bits_reset(state);
  uint8_t buf[65536];
  ssize_t n;
  while (ok && (n = read(fd, buf, sizeof(buf))) != 0) {
    if (n < 0) {
      ok = false;
      break;
    }
    XXH3_128bits_update(state, buf, (size_t)n);
  }
  if (ok) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(state));
    memcpy(g_build_id, "xxh3-", 5);
    jit__hex_encode(c.digest, 16, g_build_id + 5);
  }
  XXH3_freeState(state);
  close(fd);
  return ok;
}

static void compute_build_id(void) {
  find_note f;
  memset(&f, 0, sizeof(f));
  f.addr = (uintptr_t)&compute_build_id;
  if (dl_iterate_phdr(visit_object, &f) && strcmp(g_build_id, "unknown") != 0) return;
  // No note: hash the file. dladdr names it; the main program's name from the
  // loader is "", so it is read through /proc/self/exe instead.
  Dl_info info;
  const char *path = f.path;
  if (!path[0] && dladdr((void *)&compute_build_id, &info) && info.dli_fname &&
      info.dli_fname[0] == '/')
    path = info.dli_fname;
  if (!path[0]) path = "/proc/self/exe";
  (void)hash_file(path);  // failing that, "unknown": keys still differ by version
}

const char *jit__library_build_id(void) {
  pthread_once(&g_once, compute_build_id);
  return g_build_id;
}
