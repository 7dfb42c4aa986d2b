/*
 * gguf.h — reader of GGUF model files (version 3), the format of llama.cpp
 * / ggml: metadata, tensor infos and tensor data, with dequantisation to
 * float32.  No engine code: the engine reads hyperparameters and tensors
 * through this interface.  The reader is gguf.c; the tensor types and the
 * dequantisation gguf_quant.c; the llama architecture check gguf_llama.c.
 * Tested in engine/gguf_test.c (`kvtrim-tests gguf`).
 *
 * Everything is validated at open, before any caller sees it; a failure is
 * a negative KVT_E* code and a one-line reason in err (the layout, the
 * checks and each code: docs/engine.md, "GGUF files").  The file is mapped
 * read-only; tensor data and strings are views valid until gguf_close().
 * The engine opens model files, never files a client can change under it.
 */
#ifndef KVT_ENGINE_GGUF_H
#define KVT_ENGINE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#define GGUF_VERSION 3
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 64    /* bytes of a tensor name (ggml's limit) */
#define GGUF_MAX_DEPTH 8    /* nesting of arrays in a value */

/* Metadata value types; the numbers are the format's. */
enum gguf_type {
	GGUF_TYPE_UINT8 = 0,
	GGUF_TYPE_INT8 = 1,
	GGUF_TYPE_UINT16 = 2,
	GGUF_TYPE_INT16 = 3,
	GGUF_TYPE_UINT32 = 4,
	GGUF_TYPE_INT32 = 5,
	GGUF_TYPE_FLOAT32 = 6,
	GGUF_TYPE_BOOL = 7,
	GGUF_TYPE_STRING = 8,
	GGUF_TYPE_ARRAY = 9,
	GGUF_TYPE_UINT64 = 10,
	GGUF_TYPE_INT64 = 11,
	GGUF_TYPE_FLOAT64 = 12,
};

/* Tensor types (ggml_type numbers).  Only these are accepted at open;
 * gguf_dequant() handles F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K. */
enum gguf_ggml_type {
	GGUF_GGML_F32 = 0,
	GGUF_GGML_F16 = 1,
	GGUF_GGML_Q4_0 = 2,
	GGUF_GGML_Q4_1 = 3,
	GGUF_GGML_Q5_0 = 6,
	GGUF_GGML_Q5_1 = 7,
	GGUF_GGML_Q8_0 = 8,
	GGUF_GGML_Q8_1 = 9,
	GGUF_GGML_Q2_K = 10,
	GGUF_GGML_Q3_K = 11,
	GGUF_GGML_Q4_K = 12,
	GGUF_GGML_Q5_K = 13,
	GGUF_GGML_Q6_K = 14,
	GGUF_GGML_Q8_K = 15,
	GGUF_GGML_I8 = 24,
	GGUF_GGML_I16 = 25,
	GGUF_GGML_I32 = 26,
	GGUF_GGML_I64 = 27,
	GGUF_GGML_F64 = 28,
	GGUF_GGML_BF16 = 30,
};

/* A string inside the file: len bytes at p, not NUL-terminated. */
struct gguf_str {
	const char *p;
	uint64_t len;
};

/* One metadata value.  For an array, items holds the elements when they
 * are strings or arrays (variable size); fixed-size elements are read from
 * data with gguf_arr_item(). */
struct gguf_value {
	enum gguf_type type;
	union {
		uint64_t u;        /* UINT8..UINT64 */
		int64_t i;         /* INT8..INT64 */
		double f;          /* FLOAT32, FLOAT64 */
		int b;             /* BOOL: 0 or 1 */
		struct gguf_str s; /* STRING */
		struct {
			enum gguf_type type;      /* element type */
			uint64_t n;               /* elements */
			const uint8_t *data;      /* [n] fixed-size elements */
			struct gguf_value *items; /* [n] or NULL */
		} arr; /* ARRAY */
	} v;
};

struct gguf_kv {
	struct gguf_str key;
	struct gguf_value val;
};

struct gguf_tensor {
	char name[GGUF_MAX_NAME + 1]; /* NUL-terminated copy */
	uint32_t n_dims;              /* 1..GGUF_MAX_DIMS */
	uint64_t ne[GGUF_MAX_DIMS];   /* elements per dim, ne[0] fastest
	                                 (row length); unused dims are 1 */
	enum gguf_ggml_type type;
	uint64_t offset;  /* bytes, from the start of the data section */
	uint64_t n_elem;  /* product of ne */
	uint64_t n_bytes; /* bytes of data */
	const void *data; /* [n_bytes] inside the map */
};

struct gguf;

/* Opens and validates path (mmap, read-only).  *out is NULL on failure. */
int gguf_open(const char *path, struct gguf **out, char *err, size_t errlen);
/* The same on a caller's buffer, which must outlive the result (no copy). */
int gguf_open_mem(const void *buf, size_t len, struct gguf **out, char *err,
                  size_t errlen);
void gguf_close(struct gguf *g);

uint32_t gguf_version(const struct gguf *g);
uint32_t gguf_alignment(const struct gguf *g);
uint64_t gguf_data_offset(const struct gguf *g); /* bytes from file start */

size_t gguf_kv_count(const struct gguf *g);
const struct gguf_kv *gguf_kv_at(const struct gguf *g, size_t i);
/* The value of key, or NULL when absent. */
const struct gguf_value *gguf_find(const struct gguf *g, const char *key);

/*
 * Typed look-ups: 0, or KVT_EINVAL with a reason naming the key when it is
 * absent, of another type, or out of range.  gguf_get_u32 takes any
 * integer type whose value fits; gguf_get_f32 FLOAT32 or FLOAT64.
 */
int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out,
                 char *err, size_t errlen);
int gguf_get_f32(const struct gguf *g, const char *key, float *out,
                 char *err, size_t errlen);
int gguf_get_bool(const struct gguf *g, const char *key, int *out,
                  char *err, size_t errlen);
int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out,
                 char *err, size_t errlen);
/* An ARRAY whose elements are of type elem; *out points into g. */
int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_type elem,
                 const struct gguf_value **out, char *err, size_t errlen);

/* Element i of an array value, as a value of the element type; KVT_EINVAL
 * when v is not an array or i is out of range. */
int gguf_arr_item(const struct gguf_value *v, uint64_t i,
                  struct gguf_value *out);

/* 1 when s holds exactly the C string c. */
int gguf_str_eq(struct gguf_str s, const char *c);

size_t gguf_tensor_count(const struct gguf *g);
const struct gguf_tensor *gguf_tensor_at(const struct gguf *g, size_t i);
/* The tensor called name, or NULL. */
const struct gguf_tensor *gguf_tensor_find(const struct gguf *g,
                                           const char *name);

/* Tensor types (gguf_quant.c). */

/* "Q4_1", ... or NULL for a type unknown here. */
const char *gguf_type_name(enum gguf_ggml_type t);
/* Elements and bytes of one block of type t (1 and the element size for
 * unquantised types): 0, or KVT_ENOTSUP for a type unknown here.  The
 * reader sizes tensor data with it. */
int gguf_type_block(enum gguf_ggml_type t, uint32_t *elems, uint32_t *bytes);
const char *gguf_value_type_name(enum gguf_type t);
/* 1 when gguf_dequant() handles t. */
int gguf_can_dequant(enum gguf_ggml_type t);

/*
 * Dequantises elements [first, first + n) of t (flat order, ne[0]
 * fastest) into dst[n] as float32.  Any range inside the tensor works;
 * partial blocks at either end are decoded whole into a scratch block.
 * Returns 0, KVT_ENOTSUP for a type gguf_can_dequant() refuses, or
 * KVT_EINVAL for a range outside the tensor.
 */
int gguf_dequant(const struct gguf_tensor *t, uint64_t first, uint64_t n,
                 float *dst, char *err, size_t errlen);

/* Hyperparameters of a llama-architecture model, from its metadata. */
struct gguf_llama {
	uint32_t n_embd;     /* llama.embedding_length (d_model) */
	uint32_t n_layer;    /* llama.block_count */
	uint32_t n_head;     /* llama.attention.head_count */
	uint32_t n_head_kv;  /* llama.attention.head_count_kv (default n_head) */
	uint32_t head_dim;   /* n_embd / n_head; llama.rope.dimension_count
	                        when present must equal it */
	uint32_t n_ff;       /* llama.feed_forward_length */
	uint32_t n_vocab;    /* llama.vocab_size, else the token list's length */
	uint32_t n_ctx;      /* llama.context_length (trained positions) */
	float rope_theta;    /* llama.rope.freq_base (default 10000) */
	float rms_eps;       /* llama.attention.layer_norm_rms_epsilon */
	int tied;            /* 1: no output.weight, logits use token_embd */
};

/*
 * The architecture-level check the engine runs after gguf_open():
 * general.architecture must be "llama" (KVT_ENOTSUP otherwise), the
 * hyperparameters above must be present and consistent (KVT_EINVAL), and
 * every tensor the llama forward reads must exist with the shape they
 * imply and a type gguf_dequant() handles (KVT_EGEOMETRY / KVT_ENOTSUP):
 *   token_embd.weight   [n_vocab][n_embd]   (ne = {n_embd, n_vocab})
 *   output_norm.weight  [n_embd]
 *   output.weight       [n_vocab][n_embd]   (absent: tied embeddings)
 *   blk.L.attn_norm.weight [n_embd], blk.L.ffn_norm.weight [n_embd]
 *   blk.L.attn_q.weight [n_head * head_dim][n_embd]
 *   blk.L.attn_k.weight, attn_v.weight [n_head_kv * head_dim][n_embd]
 *   blk.L.attn_output.weight [n_embd][n_head * head_dim]
 *   blk.L.ffn_gate.weight, ffn_up.weight [n_ff][n_embd]
 *   blk.L.ffn_down.weight [n_embd][n_ff]
 * (shapes written C-style, outer first).  Fills *hp on success.
 */
int gguf_llama_check(const struct gguf *g, struct gguf_llama *hp, char *err,
                     size_t errlen);

#endif
