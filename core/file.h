/*
 * file.h — reading a whole file into memory, for the tools that take text
 * (the engine's prompts and inputs, the trainer's corpus).
 */
#ifndef KVT_FILE_H
#define KVT_FILE_H

#include <stddef.h>

/*
 * Reads the file at path into a malloc'ed buffer *out of *n bytes, with a
 * NUL after them (so text can be used as a C string; the file may hold NULs
 * of its own).  0, KVT_ESYS (cannot open or read it; the reason names path
 * and errno) or KVT_ENOMEM, with the reason in err; *out is NULL on error.
 */
int file_read_all(const char *path, char **out, size_t *n, char *err,
                  size_t errlen);

#endif
