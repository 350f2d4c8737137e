//===--- file.c - reading a file that should be a regular file -------------===//
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

jit_status jit__read_regular_file(const char *path, const char *what, uint64_t max_bytes,
                                  char **out_text, size_t *out_size) {
  *out_text = NULL;
  *out_size = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "cannot open %s `%s`: %s", what, path,
                   strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return JIT_ERR(JIT_INVALID_ARGUMENT, "cannot stat %s `%s`: %s", what, path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return JIT_ERR(JIT_INVALID_ARGUMENT, "%s `%s` is %s, not a regular file", what, path,
                   file_kind(st.st_mode));
  }
  if ((uint64_t)st.st_size > max_bytes) {
    close(fd);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED,
                   "%s `%s` is %lld bytes, over the limit of %llu bytes", what, path,
                   (long long)st.st_size, (unsigned long long)max_bytes);
  }
  size_t size = (size_t)st.st_size;
  char *text = malloc(size + 1);
  if (!text) {
    close(fd);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory reading %s `%s` (%zu bytes)", what,
                   path, size);
  }
  size_t got = 0;
  while (got < size) {  // a regular file never blocks; O_NONBLOCK only guarded the open
    ssize_t n = read(fd, text + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = n < 0 ? errno : 0;
      close(fd);
      free(text);
      return JIT_ERR(JIT_INVALID_ARGUMENT, "cannot read %s `%s`: %s", what, path,
                     e ? strerror(e) : "it shrank while being read");
    }
    got += (size_t)n;
  }
  close(fd);
  text[size] = 0;
  *out_text = text;
  *out_size = size;
  return NULL;
}
