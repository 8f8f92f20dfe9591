/* flash-kda C ABI: the same entry points as include/flashkda/flashkda.h, for FFI
 * users (ctypes, cffi, Rust, ...). Plain C99; fixed-width types; enums are int32.
 *
 * Every function returning int32_t returns a status code (FLASHKDA_STATUS_*).
 * On a non-OK code, flashkda_last_error() returns the message (naming the
 * argument and what was expected); it is per thread and describes the most
 * recent call on that thread ("" after a successful one).
 *
 * The struct layouts are part of the ABI (on 64-bit platforms, no padding):
 * flashkda_forward_args is 21 pointers, 21 int64, 12 int32 and 2 float, 392 bytes
 * (ABI 2 appended the state-pool, checkpoint and split-forward fields to ABI 1's
 * 168 bytes; ABI 5 gave its last int32, reserved until then, a meaning:
 * states_key_major; ABI 6 appended gate_form, g_dtype, beta_is_probability and
 * beta_dtype to ABI 5's 376 bytes);
 * flashkda_decode_args is 16 pointers, 21 int64, 7 int32, 2 float and a reserved
 * int32, 336 bytes (ABI 2 appended cu_seqlens_int32, verify_slots,
 * num_accepted_tokens; ABI 4 the token tensors' strides to ABI 3's 240 bytes;
 * ABI 6 gave the reserved int32 after lower_bound a meaning, gate_form, and
 * appended g_dtype, beta_is_probability, beta_dtype and a new reserved int32 to
 * ABI 5's 320 bytes);
 * flashkda_segment_summary_args is a flashkda_forward_args,
 * a pointer, an int64 and two pointers, 424 bytes; flashkda_compose_summaries_args
 * is 3 int64 and 7 pointers, 80 bytes (ABI 3 appended its stream to ABI 2's 72
 * bytes). A layout change bumps FLASHKDA_C_ABI_VERSION. */
#ifndef FLASHKDA_FLASHKDA_C_H_
#define FLASHKDA_FLASHKDA_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHKDA_VERSION_MAJOR 0
#define FLASHKDA_VERSION_MINOR 1
#define FLASHKDA_VERSION_PATCH 0
#define FLASHKDA_C_ABI_VERSION 6

/* Status codes (= flashkda::StatusCode). */
#define FLASHKDA_STATUS_OK 0
#define FLASHKDA_STATUS_INVALID_ARGUMENT 1
#define FLASHKDA_STATUS_NOT_SUPPORTED 2
#define FLASHKDA_STATUS_CUDA_ERROR 3
#define FLASHKDA_STATUS_INTERNAL 4

/* Backends (= flashkda::Backend). */
#define FLASHKDA_BACKEND_CPU_REFERENCE 0
#define FLASHKDA_BACKEND_CPU_CHUNKED 1
#define FLASHKDA_BACKEND_CUDA 2

/* State dtypes (= flashkda::DType). */
#define FLASHKDA_DTYPE_NONE 0
#define FLASHKDA_DTYPE_BF16 1
#define FLASHKDA_DTYPE_FP32 2

/* What g holds (= flashkda::GateForm): the raw gate, activated inside (the safe
 * gate), or the natural-log decay itself (fla's use_gate_in_kernel=False). */
#define FLASHKDA_GATE_SAFE_GATE 0
#define FLASHKDA_GATE_LOG_DECAY 1

/* Mirrors flashkda::ForwardArgs; see there for shapes and meaning.
 * Zero-initialise, then set lower_bound (the C++ default is -5) and the rest,
 * or call flashkda_forward_args_init(). An output that certainly shares memory
 * with an input or another output is refused, as flashkda::validate does
 * (flashkda.h, ForwardArgs; the same for the decode arguments). */
typedef struct flashkda_forward_args {
  const void* q;               /* bf16 [B, T, H, K] */
  const void* k;               /* bf16 [B, T, H, K] */
  const void* v;               /* bf16 [B, T, HV, V] */
  const void* g;               /* bf16 [B, T, HV, K] (g_dtype) */
  const void* beta;            /* bf16 [B, T, HV] (beta_dtype) */
  const float* A_log;          /* fp32 [HV] (may be NULL with FLASHKDA_GATE_LOG_DECAY) */
  const float* dt_bias;        /* fp32 [HV, K] (may be NULL with FLASHKDA_GATE_LOG_DECAY) */
  void* out;                   /* bf16 [B, T, HV, V] */
  const void* initial_state;   /* bf16/fp32 [N, HV, V, K] ([N, HV, K, V] with states_key_major) or NULL */
  void* final_state;           /* bf16/fp32 [N, HV, V, K] ([N, HV, K, V] with states_key_major) or NULL;
                                  may be initial_state itself (in place) */
  const int64_t* cu_seqlens;   /* [N+1] in the backend's memory, or NULL */
  const int64_t* cu_seqlens_host; /* optional host copy (kCuda) */
  int64_t num_seqs;            /* N with cu_seqlens */
  int64_t batch;               /* B */
  int64_t seqlen;              /* T */
  int64_t num_heads;           /* H */
  int64_t num_v_heads;         /* HV; 0 = H */
  int64_t head_dim_k;          /* K */
  int64_t head_dim_v;          /* V */
  int32_t initial_state_dtype; /* FLASHKDA_DTYPE_* */
  int32_t final_state_dtype;   /* FLASHKDA_DTYPE_* */
  float scale;                 /* usually K^-0.5 */
  float lower_bound;           /* in [-5, 0) (read with FLASHKDA_GATE_SAFE_GATE only) */
  /* Forward on a state pool instead of initial_state / final_state (see
   * flashkda::ForwardArgs): slot state_indices[n] in, and out again in place. */
  void* state_pool;                 /* bf16/fp32 [pool_size, HV, V, K], slots pool_stride apart, or NULL */
  const void* state_indices;        /* int32/int64 [N]; negative = no slot */
  const uint8_t* has_initial_state; /* [N] (0: start from zero), or NULL */
  int64_t pool_size;                /* slots */
  int64_t pool_stride;              /* elements between slots; 0 = HV*V*K */
  int32_t state_pool_dtype;         /* FLASHKDA_DTYPE_FP32 / _BF16 with a pool, else _NONE */
  int32_t state_index_type;         /* FLASHKDA_INDEX_* */
  /* Checkpoints for prefix caching (see flashkda::ForwardArgs): entry
   * offset(n) + j = sequence n's state after j * checkpoint_interval tokens. */
  void* checkpoints;                /* bf16/fp32 [capacity, HV, K, V] ([.., V, K] value-major), or NULL */
  int64_t checkpoint_interval;      /* a positive multiple of 16 */
  int64_t checkpoints_capacity;     /* entries in the buffer */
  int32_t checkpoints_dtype;        /* FLASHKDA_DTYPE_FP32 / _BF16 with checkpoints, else _NONE */
  int32_t checkpoints_value_major;  /* 0: [HV, K, V] entries (fla's layout); 1: [HV, V, K] */
  /* Checkpoints into pool slots (needs state_pool): for sequence n, the states after
   * slot_checkpoint_offsets[2n + i] tokens go to slots slot_checkpoint_slots[2n + i]. */
  const int64_t* slot_checkpoint_offsets; /* [N, 2]: multiples of 16 in [16, L_n], negative = none */
  const void* slot_checkpoint_slots;      /* [N, 2] of state_index_type, negative = none */
  const int32_t* cu_seqlens_int32;        /* int32 [N+1] instead of cu_seqlens, or NULL */
  /* Element strides between tokens (of the flattened B*T axis) and between heads of
   * q, k, v, g, beta; the last dimension contiguous; 0 = dense. */
  int64_t q_token_stride, q_head_stride;
  int64_t k_token_stride, k_head_stride;
  int64_t v_token_stride, v_head_stride;
  int64_t g_token_stride, g_head_stride;
  int64_t beta_token_stride, beta_head_stride;
  /* A forward in two calls around an exchange of summaries (context parallelism;
   * see flashkda::ForwardArgs): the summaries call (summaries_M and summaries_B
   * given, out may be NULL, no states) writes each whole sequence's (M, B); the
   * resume call (resume_from_summaries = 1) is then the forward of the same
   * tokens from given initial states, with the same workspace. */
  float* summaries_M;             /* fp32 [N, HV, K, K], or NULL */
  float* summaries_B;             /* fp32 [N, HV, V, K], or NULL */
  int32_t resume_from_summaries;  /* 0 or 1 */
  int32_t states_key_major;       /* 0: initial_state / final_state [N, HV, V, K]; 1: [N, HV, K, V] (ABI 5) */
  /* What g and beta hold (ABI 6; see flashkda::ForwardArgs). Zero keeps the
   * safe gate and the beta logit, both bf16. */
  int32_t gate_form;              /* FLASHKDA_GATE_*: 0 the raw gate, 1 the log decay (<= 0) */
  int32_t g_dtype;                /* 0 or FLASHKDA_DTYPE_BF16: bf16; FLASHKDA_DTYPE_FP32: fp32 */
  int32_t beta_is_probability;    /* 0: b = sigmoid(beta); 1: b = beta as given */
  int32_t beta_dtype;             /* 0 or FLASHKDA_DTYPE_BF16: bf16; FLASHKDA_DTYPE_FP32: fp32 */
} flashkda_forward_args;

/* Zeroes *args and sets lower_bound = -5 (the C++ defaults). */
void flashkda_forward_args_init(flashkda_forward_args* args);

/* State-pool index types (= flashkda::IndexType). */
#define FLASHKDA_INDEX_INT32 0
#define FLASHKDA_INDEX_INT64 1

/* Programmatic dependent launch of the CUDA decode (= flashkda::PdlMode). AUTO
 * is the measured choice: currently PDL at every size. */
#define FLASHKDA_PDL_OFF (-1)
#define FLASHKDA_PDL_AUTO 0
#define FLASHKDA_PDL_ON 1

/* Mirrors flashkda::DecodeArgs (one decode step on states in a pool); see there
 * for shapes and meaning. Call flashkda_decode_args_init() first. */
typedef struct flashkda_decode_args {
  const void* q;                  /* bf16 [T, H, K] */
  const void* k;                  /* bf16 [T, H, K] */
  const void* v;                  /* bf16 [T, HV, V] */
  const void* g;                  /* bf16 [T, HV, K] (g_dtype) */
  const void* beta;               /* bf16 [T, HV] (beta_dtype) */
  const float* A_log;             /* fp32 [HV] (may be NULL with FLASHKDA_GATE_LOG_DECAY) */
  const float* dt_bias;           /* fp32 [HV, K] (may be NULL with FLASHKDA_GATE_LOG_DECAY) */
  void* out;                      /* bf16 [T, HV, V] */
  const int64_t* cu_seqlens;      /* [N+1] in the backend's memory, or NULL: tokens_per_seq each */
  const int64_t* cu_seqlens_host; /* optional host copy (kCuda) */
  void* state_pool;               /* bf16/fp32 [pool_size, HV, V, K], slot stride pool_stride */
  void* state_out_pool;           /* NULL: the final states go back in place */
  const void* state_indices;      /* int32/int64 [N]; negative = padding, nothing read or written */
  void* per_token_states;         /* [T, HV, V, K] in the state dtype, or NULL */
  int64_t num_seqs;               /* N */
  int64_t tokens_per_seq;         /* t, without cu_seqlens */
  int64_t total_tokens;           /* T */
  int64_t pool_size;              /* slots */
  int64_t pool_stride;            /* elements between slots; 0 = HV*V*K */
  int64_t state_out_stride;       /* 0 = pool_stride */
  int64_t num_heads;              /* H */
  int64_t num_v_heads;            /* HV; 0 = H */
  int64_t head_dim_k;             /* K */
  int64_t head_dim_v;             /* V */
  int32_t state_dtype;            /* FLASHKDA_DTYPE_FP32 or FLASHKDA_DTYPE_BF16 */
  int32_t index_type;             /* FLASHKDA_INDEX_* */
  int32_t programmatic_dependent_launch; /* kCuda: FLASHKDA_PDL_AUTO (0, default), _ON (1) or _OFF (-1) */
  float scale;                    /* usually K^-0.5 */
  float lower_bound;              /* in [-5, 0) (read with FLASHKDA_GATE_SAFE_GATE only) */
  int32_t gate_form;              /* FLASHKDA_GATE_* (ABI 6; the reserved 0 of ABI 5: the safe gate) */
  const int32_t* cu_seqlens_int32; /* int32 [N+1] instead of cu_seqlens, or NULL (every backend) */
  int64_t verify_slots;            /* >= 2 (or 1 with num_accepted_tokens): speculative verify,
                                    * state_indices [N, verify_slots] */
  const void* num_accepted_tokens; /* [N] of index_type, or NULL */
  /* Strided token tensors (elements between tokens and between heads; 0: dense),
   * as in flashkda_forward_args. */
  int64_t q_token_stride, q_head_stride;
  int64_t k_token_stride, k_head_stride;
  int64_t v_token_stride, v_head_stride;
  int64_t g_token_stride, g_head_stride;
  int64_t beta_token_stride, beta_head_stride;
  /* As in flashkda_forward_args (ABI 6): zero keeps bf16 and the beta logit. */
  int32_t g_dtype;                /* 0 or FLASHKDA_DTYPE_BF16: bf16; FLASHKDA_DTYPE_FP32: fp32 */
  int32_t beta_is_probability;    /* 0: b = sigmoid(beta); 1: b = beta as given */
  int32_t beta_dtype;             /* 0 or FLASHKDA_DTYPE_BF16: bf16; FLASHKDA_DTYPE_FP32: fp32 */
  int32_t reserved;               /* must be 0 (kept for a later ABI) */
} flashkda_decode_args;

/* Zeroes *args and sets the C++ defaults: tokens_per_seq = 1, state_dtype fp32,
 * int32 indices, lower_bound = -5, programmatic_dependent_launch FLASHKDA_PDL_AUTO. */
void flashkda_decode_args_init(flashkda_decode_args* args);

/* Validates a decode step without running it (flashkda::validate_decode). */
int32_t flashkda_validate_decode(const flashkda_decode_args* args, int32_t backend);

/* Runs one decode step (flashkda::decode). stream: a cudaStream_t for the CUDA
 * backend (NULL = legacy default stream); ignored by the CPU backends. */
int32_t flashkda_decode(const flashkda_decode_args* args, int32_t backend, void* stream);

/* Validates without running (flashkda::validate). */
int32_t flashkda_validate(const flashkda_forward_args* args, int32_t backend);

/* Scratch bytes flashkda_forward needs (flashkda::workspace_size). */
int32_t flashkda_workspace_size(const flashkda_forward_args* args, int32_t backend, uint64_t* bytes);

/* Runs the forward (flashkda::forward). stream: a cudaStream_t for the CUDA
 * backend (NULL = legacy default stream); ignored by the CPU backends. */
int32_t flashkda_forward(const flashkda_forward_args* args, int32_t backend, void* workspace,
                         uint64_t workspace_bytes, void* stream);

/* Waits for `stream` (a cudaStream_t; NULL = legacy default stream), then reads
 * and clears the record of invalid device-resident argument values (cu_seqlens of
 * the forward and decode, state_indices of the forward's pool and of decode, slot
 * checkpoint offsets and slots, decode's num_accepted_tokens, a verify sequence
 * longer than its row of slots) that the kernels met on the current device since
 * the last check (flashkda::check_device_faults). FLASHKDA_STATUS_OK when none;
 * FLASHKDA_STATUS_INVALID_ARGUMENT with the argument named in flashkda_last_error()
 * otherwise. The kernels never access memory outside the given tensors because
 * of such values; the outputs of those calls are unspecified. Synchronises: keep
 * it off the hot path. */
int32_t flashkda_check_device_faults(void* stream);

/* Segment summaries (flashkda::segment_summaries, compose_summaries; see
 * flashkda.h for the math): for one value head, tokens [begin, end) of a sequence
 * map an incoming state S_in [V, K] to S_in·M + B. Every backend: on the CUDA
 * backend the summaries of given ranges are synchronous (their ranges are read on
 * the host), the composition asynchronous on its stream. */
typedef struct flashkda_segment_summary_args {
  flashkda_forward_args inputs; /* the token tensors, shapes, cu_seqlens, the gate (lower_bound, gate_form, ...);
                                   out/states/scale unused */
  const int64_t* segments;      /* int64 [S, 2]: (begin, end) on the flattened B*T token axis */
  int64_t num_segments;         /* S */
  float* M;                     /* fp32 [S, HV, K, K] */
  float* B;                     /* fp32 [S, HV, V, K] */
} flashkda_segment_summary_args;

int32_t flashkda_segment_summaries(const flashkda_segment_summary_args* args, int32_t backend);

/* (M, B)[i] = (M1, B1)[i] o (M2, B2)[i] for i < count; M may be M1 or M2 itself and B
 * may be B1 or B2 itself (in place); any other overlap is refused. */
typedef struct flashkda_compose_summaries_args {
  int64_t count;
  int64_t head_dim_k; /* K */
  int64_t head_dim_v; /* V */
  const float* M1;    /* fp32 [count, K, K] */
  const float* B1;    /* fp32 [count, V, K] */
  const float* M2;
  const float* B2;
  float* M;
  float* B;
  void* stream; /* CUDA backend: a cudaStream_t (NULL = the legacy default stream) */
} flashkda_compose_summaries_args;

int32_t flashkda_compose_summaries(const flashkda_compose_summaries_args* args, int32_t backend);

/* 1 when the CUDA backend can run in this process, else 0 (and the reason is
 * in flashkda_last_error()). */
int32_t flashkda_cuda_available(void);

/* The message of the most recent call on this thread that returns a status, or of
 * flashkda_cuda_available ("" after success; flashkda_last_error,
 * flashkda_status_string and the version calls leave it as it is). Valid until the
 * next such call on the same thread. Never NULL. */
const char* flashkda_last_error(void);

/* Name of a status code, e.g. "kInvalidArgument". Never NULL. */
const char* flashkda_status_string(int32_t code);

/* "MAJOR.MINOR.PATCH" of the library, and its C ABI version. */
const char* flashkda_version(void);
int32_t flashkda_abi_version(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHKDA_FLASHKDA_C_H_ */
