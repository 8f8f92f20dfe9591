// flash-kda public C++ API: the Kimi Delta Attention (KDA) forward.
//
// The math contract is the token recurrence (see docs/design.md and the spec,
// docs/spec.md, whose sections "spec section N" refers to):
//   q̂ = q/sqrt(|q|²+1e-6), k̂ = k/sqrt(|k|²+1e-6)
//   a = lower_bound·sigmoid(exp(A_log[h])·(g + dt_bias[h])),  b = sigmoid(beta)
//   (or a = g and b = beta as given: GateForm::kLogDecay, beta_is_probability)
//   S ← S·diag(exp(a));  S ← S + b·(v − S k̂) k̂ᵀ;  o = scale·S q̂
// with the state S of shape [V, K] per (sequence, value head).
//
// Tensors are row-major in the shapes documented on ForwardArgs, dense unless a
// stride field says otherwise (the q/k/v/g/beta token and head strides, the pool
// strides). bf16 data is passed as raw 16-bit patterns (uint16_t on the host,
// __nv_bfloat16 on the device): the API never needs a CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flashkda {

// Element type of an optional state tensor. kNone means "absent".
enum class DType : int32_t { kNone = 0, kBF16 = 1, kFP32 = 2 };

// Where and how the forward runs. All pointers of one call live in the memory of
// the chosen backend (host memory for the CPU backends, device memory for kCuda).
enum class Backend : int32_t {
  kCpuReference = 0,  // float64 token-by-token recurrence: the oracle. Slow.
  kCpuChunked = 1,    // chunk-16 algorithm in fp32, multithreaded: the CPU backend.
  kCuda = 2,          // sm_90a kernels (Hopper).
};

enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // the message names the argument and what was expected
  kNotSupported = 2,     // valid input, but this build / device / backend cannot run it
  kCudaError = 3,        // a CUDA runtime call failed; the message carries its text
  kInternal = 4,
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;

  bool ok() const { return code == StatusCode::kOk; }
  static Status Ok() { return {}; }
  static Status Invalid(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status NotSupported(std::string msg) { return {StatusCode::kNotSupported, std::move(msg)}; }
};

// Element type of slot indices into a state pool (forward and decode).
enum class IndexType : int32_t { kInt32 = 0, kInt64 = 1 };

// What g holds (ForwardArgs, DecodeArgs): fla's use_gate_in_kernel.
enum class GateForm : int32_t {
  // The raw gate, activated inside: a = lower_bound·sigmoid(exp(A_log[hv])·(g + dt_bias[hv]))
  // (FlashKDA's safe gate; fla's use_gate_in_kernel=True with lower_bound). g is bf16 or fp32.
  kSafeGate = 0,
  // The activation a itself: the natural log of each key channel's decay at
  // that token, a <= 0 (fla's use_gate_in_kernel=False, e.g. the output of
  // fla's fused_kda_gate, as vLLM's Kimi Linear layer passes it). bf16 or fp32
  // (g_dtype); A_log, dt_bias and lower_bound are not read (A_log and dt_bias
  // may be null). A decay of any strength is computed without overflow (a chunk
  // of 16 tokens whose decay passes 2^-116 takes a slower exact path on
  // kCpuChunked and kCuda); kCuda holds each token's decay at 2^-64 and above (a
  // = −inf keeps 2^-64 of the state rather than none: below fp32 rounding unless
  // the old state is ~2^40 times what follows). A value above 0 is not a decay: the CPU backends
  // refuse it (kInvalidArgument naming g), and kCuda, which cannot read device
  // values without a synchronisation, reads it as 0 and records it for
  // check_device_faults.
  kLogDecay = 1,
};

// Arguments of one KDA forward. Shapes (row-major; dense unless the stride
// fields below say otherwise):
//   q, k        bf16 [B, T, H,  K]
//   v, out      bf16 [B, T, HV, V]
//   g           bf16 [B, T, HV, K]     raw gate (before activation); or, with
//                                      gate_form kLogDecay, the log decay (bf16 or fp32)
//   beta        bf16 [B, T, HV]        raw beta logit; or b itself (beta_is_probability),
//                                      bf16 or fp32 (beta_dtype)
//   A_log       fp32 [HV]
//   dt_bias     fp32 [HV, K]
//   initial_state, final_state   bf16 or fp32 [N, HV, V, K], each optional
//                                ([N, HV, K, V] with states_key_major)
//   cu_seqlens  int64 [N+1]        optional (or cu_seqlens_int32); requires B == 1
// N is the number of sequences: num_seqs with cu_seqlens, else B.
// HV (value heads) is a multiple of H; value head hv reads q/k head hv / (HV/H).
// final_state may be initial_state itself (the same pointer, dtype and layout): an
// in-place update, on every backend and every call (the resume call included)
// bitwise the call with a final state of its own. Any other output that shares
// memory with an input or another output is refused (kInvalidArgument naming
// both) where the overlap is certain: the two byte ranges meet and one argument
// is dense and holds the other's first or last byte. Strided views whose ranges
// interleave (slices of one fused projection) may share no byte and are not
// refused; inputs may share memory with each other. The same holds for
// decode() (DecodeArgs), where state_out_pool may be state_pool itself (same
// pointer and stride: in place).

struct ForwardArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* g = nullptr;
  const void* beta = nullptr;
  const float* A_log = nullptr;
  const float* dt_bias = nullptr;
  void* out = nullptr;

  const void* initial_state = nullptr;
  DType initial_state_dtype = DType::kNone;
  void* final_state = nullptr;
  DType final_state_dtype = DType::kNone;
  // initial_state and final_state as [N, HV, K, V] (key-major: fla's layout of
  // chunk_kda's initial_state and final state) instead of [N, HV, V, K]: value
  // row i, key j of sequence n, value head hv at ((n·HV + hv)·K + j)·V + i. So a
  // caller holding fla's layout passes its tensors as they are, instead of a
  // transposed copy in and out. Not with state_pool (slots are [HV, V, K]).
  // Every backend takes it.
  bool states_key_major = false;

  // Sequence boundaries, in the backend's memory (device memory for kCuda).
  const int64_t* cu_seqlens = nullptr;
  // Optional host copy of the same boundaries. When given, it is validated
  // (starts at 0, non-decreasing, ends at T), checkpoints_capacity is checked
  // against it, and kCuda's launch plan sees the lengths (a long sequence among
  // short ones is cut into segments where that pays); the kernels read only the
  // device copy. For the CPU backends cu_seqlens is already a host pointer and
  // is validated directly.
  const int64_t* cu_seqlens_host = nullptr;
  int64_t num_seqs = 0;  // N when cu_seqlens is given; ignored otherwise
  // The same boundaries as int32 (vLLM's offsets), instead of cu_seqlens (one of
  // the two). Every backend takes it (kCuda reads it on the device, like cu_seqlens).
  const int32_t* cu_seqlens_int32 = nullptr;

  // Strided token tensors, e.g. views of one fused projection output (spec
  // section 7): element strides (in elements of the tensor's own dtype) between
  // consecutive tokens of the flattened B·T axis and between heads, the last
  // dimension contiguous; 0 means dense (q, k: H·K and K; v: HV·V and V; g: HV·K
  // and K; beta: HV and 1). The CPU backends take any; kCuda needs q, k, v, g
  // strides that are multiples of 16 bytes (16-byte aligned rows: 8 bf16
  // elements, 4 for an fp32 g) and every stride below 2^31.
  int64_t q_token_stride = 0, q_head_stride = 0;
  int64_t k_token_stride = 0, k_head_stride = 0;
  int64_t v_token_stride = 0, v_head_stride = 0;
  int64_t g_token_stride = 0, g_head_stride = 0;
  int64_t beta_token_stride = 0, beta_head_stride = 0;

  int64_t batch = 0;        // B
  int64_t seqlen = 0;       // T (tokens per batch row; total tokens with cu_seqlens)
  int64_t num_heads = 0;    // H  (q/k heads)
  int64_t num_v_heads = 0;  // HV (value heads); 0 means HV = H
  int64_t head_dim_k = 0;   // K
  int64_t head_dim_v = 0;   // V

  float scale = 0.f;          // usually K^-0.5; set it: the default 0 is valid and gives out = 0
  float lower_bound = -5.f;   // in [-5, 0) (read with GateForm::kSafeGate only)

  // What g and beta hold (fla's use_gate_in_kernel and use_beta_sigmoid_in_kernel).
  // The defaults are FlashKDA's: the raw gate and the beta logit, both bf16.
  GateForm gate_form = GateForm::kSafeGate;
  DType g_dtype = DType::kBF16;     // kBF16 or kFP32 (either gate form)
  bool beta_is_probability = false; // true: b = beta as given (no sigmoid)
  DType beta_dtype = DType::kBF16;  // kBF16 or kFP32

  // Forward on a state pool (serving engines, spec section 7), instead of
  // initial_state / final_state (which must then be null). Sequence n starts
  // from slot state_indices[n] of state_pool and its final state goes back to
  // the same slot, in place: element (hv, i, j) of slot s is
  // state_pool[s·pool_stride + (hv·V + i)·K + j]. A negative index means no
  // slot: the sequence starts from zero and its final state is neither read from
  // nor written to the pool (its slot checkpoints, below, still go to the slots
  // they name). has_initial_state (optional, one byte per sequence, 0 or
  // not) marks sequences that start from zero although they have a slot (their
  // final state is still written). A slot named by more than one sequence (in
  // state_indices or slot checkpoints): what it keeps, and the state a sequence
  // reading it starts from, are unspecified on kCuda, where sequences run
  // concurrently (the CPU backends read every slot first, then write final
  // states, then slot checkpoints, in sequence order). All three arrays live in
  // the backend's memory. Every backend runs it.
  void* state_pool = nullptr;
  DType state_pool_dtype = DType::kNone;       // kFP32 or kBF16 with a pool
  int64_t pool_size = 0;                       // P slots
  int64_t pool_stride = 0;                     // elements between slots; 0 = HV·V·K
  const void* state_indices = nullptr;         // [N], int32 or int64
  IndexType state_index_type = IndexType::kInt32;
  const uint8_t* has_initial_state = nullptr;  // [N] or null (every sequence with a slot has a state)

  // Checkpoints for prefix caching (optional, spec section 7): the state of each
  // sequence at the start of each of its checkpoint_interval-token pieces, i.e.
  // after 0, c, 2c, ... tokens: ceil(L_n / c) entries for a sequence of L_n
  // tokens (its final state, after all L_n, is final_state / the pool slot).
  // Sequence n's entries start at checkpoint_offset(n) = Σ_{m<n} ceil(L_m / c)
  // (a B·T batch: n·ceil(T/c)); an entry is [HV, K, V] (key-major, the layout of
  // fla's return_intermediate_states `h`, which SGLang reads with c = 64), or
  // [HV, V, K] with checkpoints_value_major. checkpoints_capacity says how many
  // entries the buffer holds (at least the total, checked where the lengths are
  // on the host: cu_seqlens for the CPU backends, cu_seqlens_host for kCuda;
  // without a host copy kCuda skips any entry past the capacity, unreported).
  // Capacity 0 is an empty buffer, which may be null (with checkpoint_interval
  // and checkpoints_dtype set): valid where the sequences need no entry.
  // Every backend writes them.
  void* checkpoints = nullptr;
  DType checkpoints_dtype = DType::kNone;  // kBF16 or kFP32 with checkpoints
  int64_t checkpoint_interval = 0;         // c: a positive multiple of 16
  int64_t checkpoints_capacity = 0;        // entries in the buffer
  bool checkpoints_value_major = false;

  // Checkpoints into pool slots (vLLM's "align" prefix caching; needs state_pool):
  // for sequence n, up to two token offsets slot_checkpoint_offsets[2n + i]
  // (multiples of 16 in [16, L_n]; negative: none, whatever the slot) whose states
  // go to pool slots slot_checkpoint_slots[2n + i] (state_index_type; negative:
  // none, whatever the offset), in the
  // pool's dtype and layout. Host memory for the CPU backends, device memory for
  // kCuda (which skips an out-of-range offset or slot and records it for
  // check_device_faults).
  const int64_t* slot_checkpoint_offsets = nullptr;  // [N, 2]
  const void* slot_checkpoint_slots = nullptr;       // [N, 2]

  // A forward in two calls around an exchange of summaries: context parallelism
  // (flash_kda.distributed.cp_fwd), where each device holds pieces of sequences
  // and a piece's incoming state depends on the pieces before it, on other
  // devices. See "Segment summaries" below for (M, B); spec section 6.
  //
  // 1. The summaries call (summaries_M and summaries_B, both given): for each
  //    sequence n and value head hv, the summary (M, B) of all of the sequence's
  //    tokens, fp32 [N, HV, K, K] and [N, HV, V, K], and nothing else: out
  //    (which may be null), the states and checkpoints are not written, and
  //    initial_state / final_state must be null.
  // 2. The resume call (resume_from_summaries): the ordinary forward of these
  //    arguments (out, final_state from initial_state). On kCuda it runs only the
  //    part that depends on the initial states, reusing what the summaries call
  //    left in the workspace: the two calls must have the same token tensors,
  //    A_log, dt_bias, scale, lower_bound, shapes and cu_seqlens (the segments
  //    are planned from the shapes alone), on the same device, and the
  //    workspace must be passed
  //    untouched from the first to the second (otherwise the results are
  //    unspecified, though no access leaves the given tensors); it
  //    serves one resume. cu_seqlens values out of order or range are recorded
  //    for check_device_faults by the summaries call, which checks them; the
  //    resume call, which must get the same values, does not check them again.
  //    The CPU backends need no workspace and run the whole forward. Not with
  //    state_pool or checkpoints (either call).
  float* summaries_M = nullptr;
  float* summaries_B = nullptr;
  bool resume_from_summaries = false;
};

// Slot checkpoints per sequence (ForwardArgs::slot_checkpoint_offsets).
constexpr int64_t kSlotCheckpointsPerSequence = 2;

// Bytes of scratch memory forward() needs for these arguments on this backend
// (0 is a valid answer). The workspace must be in the backend's memory,
// 256-byte aligned, and share no byte of the `bytes` the call uses with any
// argument (forward() refuses it, naming the argument). Returns an error status
// for arguments forward() would reject.
Status workspace_size(const ForwardArgs& args, Backend backend, size_t* bytes);

// Runs the forward. `stream` is a cudaStream_t for kCuda (nullptr = the legacy
// default stream) and ignored by the CPU backends. The CUDA path is
// asynchronous with respect to the host, allocates nothing, and is safe to
// capture in a CUDA graph.
Status forward(const ForwardArgs& args, Backend backend, void* workspace, size_t workspace_bytes,
               void* stream);

// Validates arguments without running anything (forward() calls this first).
Status validate(const ForwardArgs& args, Backend backend);

// Whether kCuda can run in this process: the kernels were compiled in and a
// device of compute capability 9.0 is present. On false, *why says which.
bool cuda_backend_available(std::string* why = nullptr);

// ---------------------------------------------------------------------------
// Decode: a few new tokens per running sequence, states in an engine's pool.
// ---------------------------------------------------------------------------

// Programmatic dependent launch for the CUDA decode (DecodeArgs). The values
// are those of the C ABI's field: -1 off, 0 auto, 1 on.
enum class PdlMode : int32_t {
  kOff = -1,
  kAuto = 0,  // the measured choice per step size; currently on everywhere (docs/perf-log.md)
  kOn = 1,
};

// Arguments of one decode step. Sequence n has t_n new tokens: t_n =
// tokens_per_seq (>= 1) for every n, or cu_seqlens[n+1] − cu_seqlens[n] (>= 0)
// when cu_seqlens is given. A sequence with no tokens keeps its state: the slot
// is left as it is in place, copied to state_out_pool when that is given, and
// nothing is written with speculative verify (its states go to the token
// columns, and it has none). Tokens are laid out sequence after sequence (T = Σ t_n):
//   q, k        bf16 [T, H,  K]
//   v, out      bf16 [T, HV, V]
//   g           bf16 [T, HV, K]   (or the log decay, bf16 or fp32: gate_form)
//   beta        bf16 [T, HV]      (or b itself, bf16 or fp32: beta_is_probability)
//   A_log, dt_bias  fp32 [HV], [HV, K]
// Sequence n's state is slot state_indices[n] of the pool: element (hv, i, j) of
// slot s lives at state_pool[s·pool_stride + (hv·V + i)·K + j] ([V, K] layout per
// head, pool_stride >= HV·V·K elements between slots). A negative index marks a
// padding entry: its tokens are skipped and nothing of it is written.
// The recurrence of the contract runs token by token; the final state goes back
// to the same slot in place, or to state_out_pool (same index, own stride).
struct DecodeArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* g = nullptr;
  const void* beta = nullptr;
  const float* A_log = nullptr;
  const float* dt_bias = nullptr;
  void* out = nullptr;

  int64_t num_seqs = 0;        // N
  int64_t tokens_per_seq = 1;  // t, when cu_seqlens is null
  const int64_t* cu_seqlens = nullptr;       // [N+1], backend memory; optional
  const int64_t* cu_seqlens_host = nullptr;  // optional host copy, validated when given
  const int32_t* cu_seqlens_int32 = nullptr; // int32 [N+1] instead of cu_seqlens (every backend; kCuda reads it on the device)
  int64_t total_tokens = 0;    // T (= N·t without cu_seqlens)

  // Strided token tensors, as ForwardArgs' (views of one fused projection output):
  // element strides between consecutive tokens and between heads, the last
  // dimension contiguous; 0 means dense (q, k: H·K and K; v: HV·V and V; g: HV·K
  // and K; beta: HV and 1). The CPU backends take any; kCuda any below 2^31 whose
  // last head starts below 2^31 elements in ((heads - 1) x head stride, a dense
  // head stride too), since its kernels keep the strides as int32 (no 16-byte row
  // rule: the decode kernels read elements).
  int64_t q_token_stride = 0, q_head_stride = 0;
  int64_t k_token_stride = 0, k_head_stride = 0;
  int64_t v_token_stride = 0, v_head_stride = 0;
  int64_t g_token_stride = 0, g_head_stride = 0;
  int64_t beta_token_stride = 0, beta_head_stride = 0;

  void* state_pool = nullptr;
  DType state_dtype = DType::kFP32;  // kFP32 or kBF16
  int64_t pool_size = 0;             // slots
  int64_t pool_stride = 0;           // elements between slots; 0 means HV·V·K
  void* state_out_pool = nullptr;    // null: in place
  int64_t state_out_stride = 0;      // 0 means pool_stride
  const void* state_indices = nullptr;  // [N], int32 or int64
  IndexType index_type = IndexType::kInt32;

  // Speculative verify: when non-null, also the state after every token, in the
  // state dtype, [T, HV, V, K] (token-major, dense).
  void* per_token_states = nullptr;

  // Speculative verify on pool slots (the semantics of fla's serving-form
  // fused_recurrent_kda): with verify_slots = C >= 2 (or C = 1 with
  // num_accepted_tokens: no draft tokens, every count 1), state_indices is [N, C] and
  // sequence n (at most C tokens) starts from slot state_indices[n, j], j =
  // num_accepted_tokens[n] − 1 (0 without num_accepted_tokens: [N] of
  // index_type, values in [1, C]); the state after its token t goes to slot
  // state_indices[n, t] in place. A negative starting slot makes the sequence a
  // padding entry (nothing read or written); a negative slot for token t skips
  // that write. Not with state_out_pool or per_token_states. Every backend; on
  // kCuda the indices and counts live on the device: a count outside [1, C], a
  // slot past the pool and the tokens of a sequence longer than C (without
  // cu_seqlens_host) are skipped and reported by check_device_faults.
  int64_t verify_slots = 0;                   // 0, or 1 without num_accepted_tokens: [N] indices
  const void* num_accepted_tokens = nullptr;  // [N], index_type, or null

  int64_t num_heads = 0;
  int64_t num_v_heads = 0;  // 0 means HV = H
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  float scale = 0.f;  // usually K^-0.5; set it: the default 0 is valid and gives out = 0
  float lower_bound = -5.f;
  // As ForwardArgs' (fla's use_gate_in_kernel and use_beta_sigmoid_in_kernel).
  GateForm gate_form = GateForm::kSafeGate;
  DType g_dtype = DType::kBF16;
  bool beta_is_probability = false;
  DType beta_dtype = DType::kBF16;

  // kCuda only: whether to launch with programmatic dependent launch (PDL), so
  // the decode kernel may be scheduled while the previous kernel in the stream
  // still runs, hiding its launch latency (in CUDA graphs too). Safe with any
  // predecessor: the kernel reads and writes nothing before that kernel has
  // completed and its writes are visible; it also lets the next kernel, if that
  // one was launched with PDL, be scheduled early. kAuto is the measured choice
  // per step size (docs/perf-log.md, decode): currently on everywhere.
  PdlMode programmatic_dependent_launch = PdlMode::kAuto;
};

Status validate_decode(const DecodeArgs& args, Backend backend);
// No workspace. `stream` as for forward(); safe to capture in a CUDA graph.
Status decode(const DecodeArgs& args, Backend backend, void* stream);

// ---------------------------------------------------------------------------
// Device-resident arguments
// ---------------------------------------------------------------------------

// The values of cu_seqlens (forward and decode), of state_indices (the forward's
// pool and decode), of slot_checkpoint_offsets / slot_checkpoint_slots and of
// decode's num_accepted_tokens live in device memory for kCuda, and the host
// cannot check them without a synchronisation (unless a cu_seqlens_host copy is
// given, for cu_seqlens). Whatever they hold, no kernel reads or writes outside
// the tensors it was given: sequence bounds are clamped to 0 <= begin <= end <= T,
// and indices past the pool and offsets or counts out of range are skipped. The
// kernel that meets such a value records it on its device; the outputs of that
// call are then unspecified.
//
// check_device_faults() turns the record into an error: it waits for `stream`
// (a cudaStream_t; nullptr = the legacy default stream), reads and clears the
// record of the current device, and returns kInvalidArgument naming the
// argument, the rule and the first offending sequence when anything was
// recorded since the last check (on any stream of that device), else kOk. It
// synchronises, so it belongs off the hot path (after a batch, in a debug mode,
// or where the caller synchronises anyway); it cannot run during CUDA graph
// capture. In a build without CUDA it returns kOk.
Status check_device_faults(void* stream = nullptr);

// ---------------------------------------------------------------------------
// Segment summaries: a run of tokens as an affine map of the state
// ---------------------------------------------------------------------------
//
// For one (sequence, value head), the tokens [begin, end) map the state they
// start from to the state they leave, S_out = S_in·M + B, with the rows of the
// state S [V, K] as row vectors, M [K, K] and B [V, K]: B is the run's final state
// from a zero state, and M what the run does to any state (the final state of the
// same recurrence on K rows, started from the identity, with v = 0). Runs that
// follow each other compose,
//   (M1, B1)∘(M2, B2) = (M1·M2, B1·M2 + B2),
// so a long sequence split into segments can be summarised segment by segment in
// parallel (on several devices), the summaries composed along the sequence into
// each segment's incoming state S_in (of the segment before it: S_in·M + B), and
// each segment's forward run from that state (forward() with initial_state):
// the same outputs and final state as one straight run. docs/design.md,
// "Segment summaries", has the method and its error; spec section 6.
//
// Backends: kCpuReference (float64 token recurrence, rounded to fp32 at the end),
// kCpuChunked (two runs of the chunked fp32 algorithm: B from a zero state, M
// from the identity) and kCuda (each range as a one-sequence summaries call;
// synchronous: the ranges and cu_seqlens are read on the host). On every
// backend, a forward's summaries call (ForwardArgs::summaries_M) also summarises
// whole sequences, and the resume call runs from given incoming states.
struct SegmentSummaryArgs {
  // The tokens: q, k, v, g, beta, A_log, dt_bias, the shapes, cu_seqlens,
  // lower_bound and the gate fields (gate_form, g_dtype, ...) as for forward(). Its out, scale and states are not used (the
  // state does not depend on scale).
  ForwardArgs inputs;
  // int64 [S, 2], in the backend's memory: segment s is the tokens
  // [segments[2s], segments[2s+1]) of the flattened B·T axis, all in one
  // sequence (begin == end: an empty run, (I, 0)). Segments may overlap and come
  // in any order.
  const int64_t* segments = nullptr;
  int64_t num_segments = 0;
  float* M = nullptr;  // fp32 [S, HV, K, K]
  float* B = nullptr;  // fp32 [S, HV, V, K]
};
Status segment_summaries(const SegmentSummaryArgs& args, Backend backend);

// count compositions at once: (M, B)[i] = (M1, B1)[i] ∘ (M2, B2)[i], the run of
// summary 1 followed by the run of summary 2. Sums in float64. M may be M1 or M2
// itself and B may be B1 or B2 itself (in place); any other overlap of an output with
// an input or with the other output is refused. Every backend; on kCuda (K, V <= 128) the
// call is asynchronous on `stream` and safe to capture in a CUDA graph.
struct ComposeSummariesArgs {
  int64_t count = 0;
  int64_t head_dim_k = 0;  // K
  int64_t head_dim_v = 0;  // V
  const float* M1 = nullptr;  // fp32 [count, K, K]
  const float* B1 = nullptr;  // fp32 [count, V, K]
  const float* M2 = nullptr;
  const float* B2 = nullptr;
  float* M = nullptr;  // fp32 [count, K, K]
  float* B = nullptr;  // fp32 [count, V, K]
  void* stream = nullptr;  // kCuda: a cudaStream_t (nullptr = the legacy default stream)
};
Status compose_summaries(const ComposeSummariesArgs& args, Backend backend);

// Human-readable names, for messages and tools.
const char* to_string(DType dtype);
const char* to_string(Backend backend);
const char* to_string(StatusCode code);
const char* to_string(IndexType type);
const char* to_string(GateForm form);

}  // namespace flashkda
