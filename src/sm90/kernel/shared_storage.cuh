// Shared-memory layouts of the two kernels, and the per-chunk record that the
// prologue kernel hands to the recurrence kernel through global memory.
//
// Operand matrices that feed mma fragments are padded so that the fragment
// loads of a warp (8 rows x 4 words) hit 32 distinct banks:
//   [16][128] rows padded to 136 elements (272 B = 68 words: rows land 4 banks apart),
//   [*][16]   rows padded to 24 elements  (48 B = 12 words: rows land 12 banks apart).
// Both paddings keep every row 16-byte aligned for cp.async and ldmatrix.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

namespace flashkda::sm90 {

constexpr int kChunk = 16;     // tokens per chunk (see docs/design.md: why 16)
constexpr int kHeadDim = 128;  // K = V of the on-chip tiles
// The caller's K = V (template argument kDim of the kernels that touch its
// tensors): 128, or 64 run on the same 128-wide tiles with key and value columns
// 64..127 zero. Those columns are loaded as zeros and never stored; a zero
// column of q, k and v keeps the state's columns and rows past 64 at zero
// through every product and decay (their gates are made finite: exp_a = 0 there,
// whatever A_log), so the result is the 64-wide recurrence's. The recurrence computes only the state's first 64
// rows, the prologue the whole padded chunk.
template <int kDim>
constexpr bool is_supported_head_dim() {
  return kDim == 64 || kDim == kHeadDim;
}
constexpr int kLdRow = kHeadDim + 8;
constexpr int kLdT = kChunk + 8;

// Shared-memory scratch of the inverse (2.4 KB): N transposed on the way in, X
// on the way out; the fragment layouts and the column-per-lane layout meet here.
// Row pitches avoid bank conflicts: nT's scattered fragment stores land 8t + g
// (20 words a row, still 16-byte aligned for the vector reads); x's two
// half-warp row sets land 16 banks apart (18 words a row).
constexpr int kInverseNtPitch = 20;
constexpr int kInverseXPitch = 18;
struct InverseScratch {
  float nT[kChunk][kInverseNtPitch];  // nT[p][i] = N_ip
  float x[kChunk][kInverseXPitch];    // X row-major
};

// The record's [rows][128] operands in a canonical 128-byte-swizzled layout of
// wgmma (the recurrence reads them straight from shared memory with
// descriptors, sm90/kernel/wgmma.cuh): blocks of 8 rows x 64 columns (1 KB, the
// swizzle atom), the two 64-column atoms of an 8-row group side by side, the
// groups one after the other; within an atom row r's 16-byte chunk c sits at
// chunk c ^ (r % 8). A row's 64 columns of an atom stay in one 128-byte line,
// so row-wise stores (prologue) and 8-row ldmatrix reads hit distinct banks,
// and a given (row % 8, column) is one fixed offset from its group's start
// whatever the array, so the prologue's stores into three of them share one
// address register. Offsets in elements; atoms start 1024-byte aligned.
__host__ __device__ constexpr int sw128_offset(int row, int col) {
  return (row / 8) * 1024 + (col / 64) * 512 + (row % 8) * 64 + ((((col % 64) / 8) ^ (row % 8)) * 8) + col % 8;
}
constexpr int kSw128AtomBytes = 1024;
constexpr int kSw128GroupBytes = 2 * kSw128AtomBytes;  // 8 rows x 128 columns
// A thread of the prologue's element map owns rows 4q..4q+3 (q its row group):
// they share row / 8 and bit 2 of row % 8, so row r of the four sits at a
// per-thread base plus r·64 + ((c ^ r) << 3), c the base row's swizzled chunk.
constexpr bool sw128_row_split_holds() {
  for (int col = 0; col < 128; ++col)
    for (int i0 = 0; i0 < 32; i0 += 4)
      for (int r = 0; r < 4; ++r) {
        const int base = (i0 / 8) * 1024 + (col / 64) * 512 + (i0 % 8) * 64 + col % 8;
        const int c = ((col % 64) / 8) ^ (i0 % 8);
        if (base + r * 64 + ((c ^ r) << 3) != sw128_offset(i0 + r, col)) return false;
      }
  return true;
}
static_assert(sw128_row_split_holds(), "the prologue's split row offsets");

// Everything the sequential recurrence needs of one (chunk, value head), laid
// out exactly as the recurrence kernel reads it from shared memory, so that the
// hand-over is a flat 16-byte copy in both kernels. "hi/lo" pairs carry a value
// as the sum of two bf16 numbers (~16 significant bits) where one bf16 rounding
// would dominate the error budget (docs/design.md, "Accuracy").
struct alignas(kSw128AtomBytes) ChunkOperands {
  // Rows 0-15: −w = −A_w·K_dec; rows 16-31: Q_dec = scale·q̂·2^G; [token][key],
  // sw128_offset(row, key): the B operand (K-major) of S·[−w; Q_dec]ᵀ.
  __nv_bfloat16 wq[2 * kChunk * kHeadDim];
  // K_res = k̂·2^(G_last−G), hi + lo, [token][key], sw128_offset(token, key):
  // the B operand (MN-major) of the state update.
  __nv_bfloat16 kres_hi[kChunk * kHeadDim];
  __nv_bfloat16 kres_lo[kChunk * kHeadDim];
  __nv_bfloat16 mqk_hi[kChunk * kChunk];  // lower_incl(Q_dec K_invᵀ), tile16_offset (B of Uᵀ·Mqkᵀ)
  __nv_bfloat16 mqk_lo[kChunk * kChunk];
  __nv_bfloat16 aw_hi[kChunk * kChunk];   // A_w = INV·diag(b), tile16_offset     (B of uᵀ = Vᵀ A_wᵀ)
  __nv_bfloat16 aw_lo[kChunk * kChunk];
  float decay_last[kHeadDim];            // 2^G_last
};
static_assert(sizeof(ChunkOperands) % 16 == 0, "copied as 16-byte vectors");
static_assert(offsetof(ChunkOperands, kres_hi) % kSw128AtomBytes == 0 &&
                  offsetof(ChunkOperands, kres_lo) % kSw128AtomBytes == 0,
              "swizzle atoms start 1024-byte aligned");
constexpr int kWqRows = 2 * kChunk;

// K_res enters the state update as hi + lo: its single-bf16 rounding left the
// state 0.5–5 % off on near-collinear keys with slow decay, where rounding
// errors in directions the keys rarely visit are never decayed or overwritten
// (docs/design.md, "Degenerate keys"). It is stored token-major (wgmma reads it
// MN-major), so that the prologue writes it with conflict-free row stores (a
// transposed [key][token] layout cost the prologue 8-way bank conflicts on
// every store).

// The 16x16 matrices of the record (Mqk, A_w) without padding: rows of two
// 16-byte chunks, the two swapped on rows 4-7 of every 8, so that the 8 rows of
// an ldmatrix land in 8 distinct bank groups (32-byte rows alone put rows r and
// r + 4 in one group). 512 bytes instead of 768 padded.
__host__ __device__ constexpr int tile16_offset(int row, int col) {
  return row * kChunk + ((((col >> 3) ^ ((row >> 2) & 1)) << 3) | (col & 7));
}
constexpr int kOperandVectors = sizeof(ChunkOperands) / 16;

// The vectors of a record that a head dim's recurrence reads, as a map from
// 0 .. record_vectors<kDim>() - 1 to vector indices of ChunkOperands (the same
// in shared and global memory: the prologue stores and the recurrence loads
// exactly these). K = 128: all of them. K = 64: the recurrence's products run
// over keys 0..63 only (recurrence.cuh), i.e. the first 1 KB atom of each 2 KB
// 8-row group of wq, kres_hi and kres_lo (sw128_offset), the 16x16 tiles whole,
// and the first 64 of decay_last: 10,496 of the record's 18,944 bytes.
constexpr int kRecordAtomVectors = kSw128AtomBytes / 16;                     // 64
constexpr int kRecordSwizzledAtoms = offsetof(ChunkOperands, mqk_hi) / kSw128AtomBytes;  // 16: wq, kres_hi, kres_lo
constexpr int kRecordTileVectors = (offsetof(ChunkOperands, decay_last) - offsetof(ChunkOperands, mqk_hi)) / 16;
static_assert(offsetof(ChunkOperands, mqk_hi) % kSw128AtomBytes == 0 &&
                  offsetof(ChunkOperands, decay_last) == offsetof(ChunkOperands, aw_lo) + sizeof(ChunkOperands::aw_lo),
              "record layout: the swizzled atoms, then the 16x16 tiles, then decay_last");
template <int kDim>
__host__ __device__ constexpr int record_vectors() {
  return kDim == kHeadDim ? kOperandVectors
                          : (kRecordSwizzledAtoms / 2) * kRecordAtomVectors + kRecordTileVectors + kDim * 4 / 16;
}
template <int kDim>
__host__ __device__ constexpr int record_vector(int i) {
  if (kDim == kHeadDim) return i;
  constexpr int kHalfAtoms = (kRecordSwizzledAtoms / 2) * kRecordAtomVectors;  // the even atoms: keys 0..63
  return i < kHalfAtoms ? (i / kRecordAtomVectors) * 2 * kRecordAtomVectors + i % kRecordAtomVectors
                        : kRecordSwizzledAtoms * kRecordAtomVectors + (i - kHalfAtoms);
}
// Copy j of a record by kThreads threads (vector tid + j·kThreads of the map above)
// moves record_vector<kDim>(tid + j·kThreads) = tid + record_copy_offset(j, tid):
// with a compile-time j the offset is a constant, or a constant plus tid's whole
// atoms (the copies of keys 0..63 move whole 64-vector atoms), so the prologue's
// stores and the recurrence's loads need no index arithmetic per vector.
template <int kDim, int kThreads>
__host__ __device__ constexpr int record_copy_offset(int j, int tid) {
  if constexpr (kDim == kHeadDim) {
    return j * kThreads;
  } else {
    constexpr int kHalfAtoms = (kRecordSwizzledAtoms / 2) * kRecordAtomVectors;  // the even atoms: keys 0..63
    static_assert(kHalfAtoms % kThreads == 0 && kThreads % kRecordAtomVectors == 0, "whole atoms a copy");
    return j * kThreads < kHalfAtoms ? 2 * j * kThreads + (tid & ~(kRecordAtomVectors - 1))
                                     : j * kThreads + (kRecordSwizzledAtoms * kRecordAtomVectors - kHalfAtoms);
  }
}
template <int kDim, int kThreads>
constexpr bool record_copy_offsets_match() {
  for (int i = 0; i < record_vectors<kDim>(); ++i)
    if (i % kThreads + record_copy_offset<kDim, kThreads>(i / kThreads, i % kThreads) != record_vector<kDim>(i))
      return false;
  return true;
}
static_assert(record_copy_offsets_match<64, 128>() && record_copy_offsets_match<64, 256>() &&
                  record_copy_offsets_match<128, 128>() && record_copy_offsets_match<128, 256>(),
              "record_copy_offset is record_vector for the thread counts of the recurrence and the prologue");
static_assert(record_vectors<64>() * 16 == 10496 && record_vector<64>(record_vectors<64>() - 1) ==
                                                        (offsetof(ChunkOperands, decay_last) + 64 * 4) / 16 - 1,
              "K = 64 records: keys 0..63 of the swizzled operands, the tiles, decay_last[0..63]");

// At K = 128 the prologue stores the record in two parts, by when they are final:
// Q_dec (rows 16-31 of wq) and K_res hi + lo after the decayed operands, while
// warps 0 and 1 build the matrices (the other six warps would wait at the
// barrier); −w (rows 0-15 of wq), Mqk, A_w, decay_last and the alignment padding
// at the end. (The padding stays in the late part: in PrologueSmem it is where
// the derived members begin, q and A_w in fp16, which build_inverse writes.)
// K = 64 stores its half record at the end in one piece: the early part measured
// 0.5-1 % slower there (docs/perf-log.md). Vector indices of ChunkOperands:
constexpr int kRecordQdecVector =  // row 16 of wq
    static_cast<int>(offsetof(ChunkOperands, wq) + kChunk * kHeadDim * sizeof(__nv_bfloat16)) / 16;
constexpr int kRecordEarlyEnd = static_cast<int>(offsetof(ChunkOperands, mqk_hi)) / 16;  // K_res lo's end
static_assert(offsetof(ChunkOperands, kres_hi) == offsetof(ChunkOperands, wq) + sizeof(ChunkOperands::wq) &&
                  offsetof(ChunkOperands, kres_lo) + sizeof(ChunkOperands::kres_lo) == offsetof(ChunkOperands, mqk_hi),
              "the early part: Q_dec, K_res hi, K_res lo, contiguous");

// Prologue kernel (one CTA per chunk and head): raw inputs, intermediates, and
// the record it writes out (the ChunkOperands base).
// Arrays in one union are never live at the same time (a barrier separates the
// last use of one from the first of the other, see prologue_kernel.cuh); the
// overlap brings the CTA under 56 KB, so four fit on an SM instead of three.
struct PrologueSmem : ChunkOperands {
  union alignas(16) {
    uint16_t q[kChunk][kHeadDim];       // raw bf16 q; read up to write_decayed_operands
    __half aw_f16[kChunk][kLdT];        // A_w in fp16 (A of w); written by build_inverse
  };
  union alignas(16) {
    uint16_t k[kChunk][kHeadDim];       // raw bf16 k, rows past the end zero; read up to write_decayed_operands
    InverseScratch inverse;             // warp 0's (I + L)^{-1}; used by build_inverse only
  };
  union alignas(16) {
    uint16_t g[kChunk][kHeadDim];       // raw bf16 g; read by gate_prefix (or gate_prefix_general) only
    __half kdec16[kChunk][kLdRow];      // k̂·2^G in fp16 (B of w, by transposing ldmatrix); written by write_decayed_operands
  };
  union alignas(16) {
    struct {
      __nv_bfloat16 kdec_lo[kChunk][kLdRow];  // written by write_decayed_operands
      __nv_bfloat16 kdec_hi[kChunk][kLdRow];  // k̂·2^G   (A of L)
    };
    float g_part[4][kHeadDim];  // per row group, its column totals of γ (over kdec_lo); read by finish_gate_prefix
    // A wide chunk's k̂ in fp32 (wide_decay.cuh), where K_dec's hi + lo are never
    // formed; written after g_part's last read.
    float wide_khat[kChunk][kHeadDim];
  };
  union alignas(16) {
    struct {
      __nv_bfloat16 kinv_hi[kChunk][kLdRow];  // k̂·2^-G  (B of L and Mqk)
      __nv_bfloat16 kinv_lo[kChunk][kLdRow];
    };
    // The general inputs' fp32 g (read by gate_prefix_general), then a wide chunk's
    // G (wide_decay.cuh), where K_inv is never formed.
    float wide_g[kChunk][kHeadDim];
  };
  alignas(16) __nv_bfloat16 qdec_lo[kChunk][kLdRow];  // low part of Q_dec (A of Mqk; the high part is in wq)
  float rnorm_q_scaled[kChunk];  // scale/sqrt(|q|²+1e-6)
  float rnorm_k[kChunk];         // 1/sqrt(|k|²+1e-6)
  float dt_bias[kHeadDim];       // the value head's dt_bias; 0 in padding columns
  float beta_sig[kChunk];  // b: sigmoid(beta), or beta as given; 0.5 or 0 on pad rows (harmless: their k is 0)
};

// Recurrence kernel: a ring of chunk records with this CTA's slice of v, and a
// per-warp staging tile for the output.
template <int kVCta, int kStages, int kStateWarps>
struct RecurrenceSmem {
  static constexpr int kLdV = kVCta + 8;
  struct Stage {
    ChunkOperands ops;  // 1024-byte aligned, so every stage is
    alignas(16) uint16_t v[kChunk][kLdV];
  };
  Stage stage[kStages];
  alignas(16) __nv_bfloat16 out[kStateWarps][kChunk][kLdT];  // [warp][token][v]
  uint64_t record_full[kStages];  // K = 128: the stage's record has arrived (bulk copy, chunk_loader.cuh)
};

}  // namespace flashkda::sm90
