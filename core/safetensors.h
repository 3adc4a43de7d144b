/* safetensors.h — memory-mapped safetensors checkpoints, single file or sharded
 * (model.safetensors.index.json). Format: 8-byte little-endian header length N,
 * N bytes of JSON {name: {dtype, shape, data_offsets:[begin,end]}, "__metadata__":{...}},
 * then the data. Every offset, size and shape is validated against the file size
 * before anything is returned; a truncated or corrupt file is KS_ERR_FORMAT with a
 * message naming the file and the tensor. */
#ifndef KS_SAFETENSORS_H
#define KS_SAFETENSORS_H

#include "common.h"

typedef enum ks_dtype {
    KS_DT_F32 = 0, KS_DT_F16 = 1, KS_DT_BF16 = 2, KS_DT_I32 = 3, KS_DT_I64 = 4,
    KS_DT_OTHER = 15
} ks_dtype;

const char *ks_dtype_name(ks_dtype dt); /* "F32", "BF16", ... */
size_t ks_dtype_size(ks_dtype dt);      /* bytes per element; 0 for OTHER */

#define KS_ST_MAXDIM 8
typedef struct ks_st_tensor {
    const char *name;
    ks_dtype dtype;
    int ndim;
    int64_t shape[KS_ST_MAXDIM];
    const void *data;     /* points into the read-only mapping; NOT aligned for the dtype in
                           * general: memcpy it, or check the address before casting */
    size_t nbytes;
    const char *file;     /* the file it came from (for messages) */
    /* dtype KS_DT_OTHER: any other header dtype (U8, F64, F8_E4M3, ...); sizes are still
     * checked for dtypes of known element size. name/file live until ks_st_close. */
} ks_st_tensor;

typedef struct ks_safetensors ks_safetensors;

/* Open a model folder: model.safetensors.index.json if present (all shards it names),
 * else model.safetensors, else every *.safetensors file in the folder. */
ks_status ks_st_open_dir(const char *dir, ks_safetensors **out);
/* Open one file. */
ks_status ks_st_open_file(const char *path, ks_safetensors **out);
void ks_st_close(ks_safetensors *st);

/* Tensor by name, or NULL. */
const ks_st_tensor *ks_st_find(const ks_safetensors *st, const char *name);
size_t ks_st_count(const ks_safetensors *st);
const ks_st_tensor *ks_st_at(const ks_safetensors *st, size_t i);

#endif
