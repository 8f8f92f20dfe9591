// Host side of the sm_90a backend: support checks, the launch heuristic, dispatch.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>

#include "common/sequences.h"
#include "sm90/fwd_launch.h"
#include "sm90/gate_inputs.h"
#include "sm90/kernel/params.h"
#include "sm90/kernel/segment_outputs.cuh"
#include "sm90/kernel/shared_storage.cuh"
#include "sm90/kernel/tile_scheduler.cuh"
#include "sm90/sm90_forward.h"
#include "sm90/segment_plan.h"

namespace flashkda::sm90 {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
std::atomic<int> g_force_v_split{0};
std::atomic<int> g_force_stages{0};
std::atomic<int64_t> g_force_seg_chunks{0};
std::atomic<int> g_force_records{0};
std::atomic<int> g_force_outputs{0};
std::atomic<int> g_force_compose{0};
std::atomic<int> g_force_output_chunks{0};
std::atomic<int> g_force_entry_storer{0};

Status cuda_status(cudaError_t err, const char* what) {
  return {StatusCode::kCudaError, std::string("backend kCuda: ") + what + ": " + cudaGetErrorString(err)};
}

int32_t state_type(DType t) {
  switch (t) {
    case DType::kBF16: return kStateBF16;
    case DType::kFP32: return kStateFP32;
    default: return kStateNone;
  }
}

// Facts of a device that cannot change while the process runs (the ordinals are
// fixed at CUDA's initialisation), read once per device: a Python fwd call read
// the compute capability three times (two validations, the dispatch) and the
// SM count once, seven runtime calls on the path of every small call. Each slot
// holds the value + 1 (0: not read yet; compute capability minor 0 is a value).
// Racing first readers store equal values; a failed query is not cached.
struct DeviceFacts {
  std::atomic<int> cc_major, cc_minor, num_sms;
};
DeviceFacts g_device_facts[kMaxCachedDevices];

cudaError_t cached_attribute(std::atomic<int> DeviceFacts::*slot, cudaDeviceAttr attr, int dev, int* value) {
  std::atomic<int>* cache = dev >= 0 && dev < kMaxCachedDevices ? &(g_device_facts[dev].*slot) : nullptr;
  const int cached = cache != nullptr ? cache->load(std::memory_order_relaxed) : 0;
  if (cached != 0) {
    *value = cached - 1;
    return cudaSuccess;
  }
  *value = 0;
  const cudaError_t err = cudaDeviceGetAttribute(value, attr, dev);
  if (cache != nullptr && err == cudaSuccess) cache->store(*value + 1, std::memory_order_relaxed);
  return err;
}

}  // namespace

bool compiled_in() { return true; }

bool device_supported(std::string* why) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) {
    if (why) *why = std::string("backend kCuda: no usable CUDA device (") + cudaGetErrorString(err) + ")";
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  int major = 0, minor = 0;
  cached_attribute(&DeviceFacts::cc_major, cudaDevAttrComputeCapabilityMajor, dev, &major);
  cached_attribute(&DeviceFacts::cc_minor, cudaDevAttrComputeCapabilityMinor, dev, &minor);
  if (major != 9 || minor != 0) {
    if (why)
      *why = "backend kCuda: the kernels are built for sm_90a (Hopper, compute capability 9.0); device " +
             std::to_string(dev) + " has compute capability " + std::to_string(major) + "." + std::to_string(minor);
    return false;
  }
  return true;
}

Status check_supported(const ForwardArgs& args) {
  std::string why;
  if (!device_supported(&why)) return Status::NotSupported(why);
  if (args.head_dim_k != args.head_dim_v || (args.head_dim_k != 64 && args.head_dim_k != 128))
    return Status::NotSupported("head_dim_k/head_dim_v: the CUDA backend supports K = V = 64 or 128 (got K=" +
                                std::to_string(args.head_dim_k) + ", V=" + std::to_string(args.head_dim_v) +
                                "); Backend::kCpuChunked runs any head dim");
  const int64_t hv = value_heads(args);
  const int64_t n = num_sequences(args);
  // The prologue's grid is (chunk slots, HV / H, H).
  if (args.num_heads > 65535 || hv / args.num_heads > 65535)
    return Status::NotSupported("num_heads/num_v_heads: the CUDA backend supports at most 65535 q/k heads and "
                                "65535 value heads per q/k head (got H=" + std::to_string(args.num_heads) +
                                ", HV=" + std::to_string(hv) + ")");
  // The kernels step through v and out a chunk at a time by 16 · HV · K
  // elements, a 32-bit product.
  constexpr int64_t kMaxValueHeads = int64_t{1} << 20;
  if (hv >= kMaxValueHeads)
    return Status::NotSupported("num_v_heads: the CUDA backend supports fewer than 2^20 value heads (got HV=" +
                                std::to_string(hv) + ")");
  if (num_chunk_slots(n, args.batch * args.seqlen) > int64_t{0x7fffffff})
    return Status::NotSupported("seqlen: too many 16-token chunks for one launch");
  // The workspace holds up to ~170 KB per (chunk slot, value head) (a record, o⁰ and
  // P, a segment state): bounding their product keeps its size, and the sums of its
  // parts, far inside size_t (2^62 bytes), where past it they would wrap and a too
  // small workspace pass the size check.
  constexpr int64_t kMaxSlotHeads = int64_t{1} << 44;
  if (num_chunk_slots(n, args.batch * args.seqlen) * hv > kMaxSlotHeads)
    return Status::NotSupported("seqlen x num_v_heads: the workspace would exceed 2^62 bytes (" +
                                std::to_string(num_chunk_slots(n, args.batch * args.seqlen)) + " chunk slots x " +
                                std::to_string(hv) + " value heads)");
  for (const TokenView& x : token_views(args, args.num_heads, hv, args.head_dim_k, args.head_dim_k))
    for (const auto& [which, stride] : {std::pair<const char*, int64_t>{"_token_stride", x.token_stride},
                                        {"_head_stride", x.head_stride}})
      if (stride > int64_t{0x7fffffff})
        return Status::NotSupported(std::string(x.name) + which + ": the CUDA backend needs strides below 2^31 " +
                                    "elements (got " + std::to_string(stride) + ")");
  if (n * hv * 4 > int64_t{0x7fffffff})
    return Status::NotSupported("num_seqs x num_v_heads: too many (sequence, head) pairs for one launch (" +
                                std::to_string(n * hv) + ")");
  return Status::Ok();
}

namespace {

// The segment scan (spec section 6) when the chains of chunk steps, not the
// GPU's throughput, bound the call: few heads, long sequences. The segment count
// follows segment_plan.h's rule; outputs by superposition replace pass 3's
// chains where that pays (superposition_pays).
constexpr int kSegmentStages = 4;

// Outputs by superposition against pass 3 by chains (both measured on the H200,
// docs/perf-log.md, "Outputs by superposition"): a chunk step takes ~0.9 µs in
// either pass, and the output kernel (wgmma, ~20 KB a chunk and head of o⁰ and P
// read and out written) does about 300 chunk-heads and 64-row parts in a step's
// time. The chains' chain is 2·seg_c steps, the superposed one seg_s steps plus
// the output kernel; superposition is taken when the model says it saves a tenth
// of the chains' chain or more. On the rows measured it picked every winner
// (12/8192 −4 %, 12/32768 −6 %, T = 1M at H = 1 and 4 −13 % and −9 %) and left
// the ties and losses (24/8192 level, 24/32768 +1 to +5 %) to the chains; it
// overstates the gain by a third or so (the superposed pass 1's steps are
// ~5 % slower), which the tenth's margin absorbs.
constexpr int64_t kSuperpositionMinGainTenths = 1;
bool superposition_pays(const ProblemShape& shape, int64_t seg_chains, int64_t seg_superposed) {
  const int64_t longest = shape.longest_chunks >= 0 ? shape.longest_chunks : shape.total_chunks;
  const int64_t chains = 2 * std::min(seg_chains, longest);
  const int64_t output_steps =
      shape.total_chunks * shape.heads * shape.row_parts / kOutputChunkHeadsPerStepAndRowPart;
  const int64_t superposed = std::min(seg_superposed, longest) + output_steps;
  return 10 * (chains - superposed) >= kSuperpositionMinGainTenths * chains;
}

// f(C_n) summed over the sequences' chunks C_n: the known lengths
// (ProblemShape::cu_seqlens_host); for a skewed shape one sequence holding every
// chunk and the others none; else equal lengths.
template <class F>
int64_t sum_over_sequences(const ProblemShape& shape, const F& f) {
  if (shape.skewed) return f(shape.total_chunks) + (shape.seqs - 1) * f(0);
  if (shape.cu_seqlens_host == nullptr)
    return shape.seqs * f(shape.longest_chunks >= 0 ? shape.longest_chunks
                                                    : (shape.total_chunks + shape.seqs - 1) / shape.seqs);
  int64_t total = 0;
  for (int64_t n = 0; n < shape.seqs; ++n)
    total += f((shape.cu_seqlens_host[n + 1] - shape.cu_seqlens_host[n] + kChunk - 1) / kChunk);
  return total;
}
// Pass 1's CTAs of the sequences that segments of `seg` chunks cut.
int64_t cut_sequences_pass1_ctas(const ProblemShape& shape, const SegmentRule& rule, int64_t seg) {
  return sum_over_sequences(shape, [&](int64_t c) { return rule.cut_ctas(c, seg); }) * shape.heads;
}

// What segment_plan.h's rule looks at for this shape on `num_sms` SMs. Unknown
// lengths (varlen without cu_seqlens_host): equal ones, unless skewed.
SegmentRule segment_rule(const ProblemShape& shape, int num_sms) {
  SegmentRule rule;
  rule.seqs = shape.seqs;
  rule.heads = shape.heads;
  rule.row_parts = shape.row_parts;
  rule.total_chunks = shape.total_chunks;
  rule.longest = shape.skewed ? shape.total_chunks
                 : shape.longest_chunks >= 0 ? shape.longest_chunks
                                             : (shape.total_chunks + shape.seqs - 1) / shape.seqs;
  rule.superposable = shape.superposable;
  rule.wave = kSegmentCtasPerSm * num_sms;
  return rule;
}

int64_t choose_segment_chunks(const ProblemShape& shape, int num_sms) {
  const SegmentRule rule = segment_rule(shape, num_sms);
  const bool known = shape.skewed || shape.cu_seqlens_host != nullptr;
  return segment_chunks(rule, known, [&](int64_t seg) { return cut_sequences_pass1_ctas(shape, rule, seg); });
}

// The shape the split calls plan from: shapes only, never the lengths of
// cu_seqlens_host, so that a summaries call and its resume plan the same
// segments (and size the same workspace) whether or not each got the host copy.
// Varlen: ceil(T/16) + N − 1 chunks bound Σ ceil(L_n/16) for any lengths.
ProblemShape split_shape(const ForwardArgs& args) {
  ProblemShape shape;
  shape.seqs = num_sequences(args);
  shape.heads = value_heads(args);
  shape.row_parts = args.head_dim_k / 64;
  const bool varlen = args.cu_seqlens != nullptr || args.cu_seqlens_int32 != nullptr;
  shape.total_chunks = varlen ? (args.batch * args.seqlen + kChunk - 1) / kChunk + shape.seqs - 1
                              : shape.seqs * ((args.seqlen + kChunk - 1) / kChunk);
  return shape;
}

// The segments of a summaries call and its resume call (ForwardArgs::summaries_M).
// Pass 1 summarises every segment (2R 4-warp CTAs per segment and head, none
// running for real) and the resume's pass 3 runs every segment, so a segment
// count whose pass 1 overflows one wave runs it in two: heads · 2R · G_total <=
// the wave. Any cut pays here (pass 1 and pass 3 are separate calls, each a
// chain of one segment), so no minimum segments per chain.
int64_t split_segment_chunks(const ProblemShape& shape, int num_sms) {
  if (shape.seqs <= 0 || shape.heads <= 0 || shape.total_chunks <= 0) return 0;
  const int64_t segments = kSegmentCtasPerSm * num_sms / (2 * shape.row_parts * shape.heads);
  if (segments <= shape.seqs) return 0;
  const int64_t parts = shape.seqs == 1 ? segments : segments - shape.seqs;  // as SegmentRule::spread_chunks
  return std::max(kMinSegmentChunks, (shape.total_chunks + parts - 1) / parts);
}

// The output kernel's CTAs per (segment slot, value head), of `per_cta` chunks each
// (by default the smaller CTA, so the most CTAs the launch can take: the plan's
// grid-size bound).
int64_t output_parts(int64_t seg_chunks, int64_t per_cta = kOutputChunksPerCta) {
  return (seg_chunks + per_cta - 1) / per_cta;
}
// Chunks an output CTA for `chunk_heads` chunks of (sequence, value head) in all:
// the deep form where its grid is still kOutputDeepMinWaves waves (fwd_launch.h).
int64_t output_chunks_per_cta(int64_t chunk_heads, int num_sms) {
  const int forced = g_force_output_chunks.load();
  if (forced == kOutputChunksPerCta || forced == kOutputChunksPerCtaDeep) return forced;
  const int64_t deep_ctas = chunk_heads / kOutputChunksPerCtaDeep;
  return deep_ctas >= kOutputDeepMinWaves * kOutputCtasPerSm * num_sms ? kOutputChunksPerCtaDeep : kOutputChunksPerCta;
}

int64_t slots_for(const ForwardArgs& args) {
  return num_chunk_slots(num_sequences(args), args.batch * args.seqlen);
}
int64_t segment_slots_for(const ForwardArgs& args, int64_t seg_chunks) {
  return num_sequences(args) + (args.batch * args.seqlen + kChunk * seg_chunks - 1) / (kChunk * seg_chunks);
}
constexpr int64_t kMaxGridCtas = 0x7fffffff;
// The segment states (or the sequence order) start on a 256-byte boundary after the records.
constexpr size_t kSegmentStateAlign = 256;
size_t records_bytes(const ForwardArgs& args) {
  const size_t b = static_cast<size_t>(slots_for(args) * value_heads(args)) * sizeof(ChunkOperands);
  return (b + kSegmentStateAlign - 1) / kSegmentStateAlign * kSegmentStateAlign;
}

// A one-pass plan of a varlen batch runs its sequences longest first
// (tile_scheduler.cuh): N int32 after the records.
bool orders_sequences(const ForwardArgs& args, const LaunchPlan& plan) {
  const bool varlen = args.cu_seqlens != nullptr || args.cu_seqlens_int32 != nullptr;
  return varlen && num_sequences(args) > 1 && plan.seg_chunks == 0;
}
size_t sequence_order_bytes(const ForwardArgs& args) {
  return static_cast<size_t>(num_sequences(args)) * sizeof(int32_t);
}

}  // namespace

Status launch_plan_for(const ForwardArgs& args, int num_sms, LaunchPlan* plan) {
  // The two calls of a context-parallel forward always run the segment scan's
  // passes, with their own segment count (split_segment_chunks); where they do
  // not cut, every sequence is one segment.
  const bool split = args.summaries_M != nullptr || args.resume_from_summaries;
  if (!split) {
    const ProblemShape shape = problem_shape(args);
    *plan = effective_launch_plan(shape, num_sms);
    // Lengths only the device holds: the finest segments any lengths would need
    // (one sequence holding every token), if those cut at all, and the device
    // picks the segments from the true lengths (LaunchPlan::device_segments).
    // Assumed equal instead, a long prefill among short sequences ran whole at a
    // few heads: 1.2-1.6x the time of its split (docs/perf-log.md).
    const bool lengths_unknown =
        shape.seqs > 1 && (args.cu_seqlens != nullptr || args.cu_seqlens_int32 != nullptr) &&
        args.cu_seqlens_host == nullptr;
    if (lengths_unknown && g_force_seg_chunks.load() == 0) {
      ProblemShape skewed = shape;
      skewed.skewed = true;
      skewed.longest_chunks = shape.total_chunks;
      const LaunchPlan finest = effective_launch_plan(skewed, num_sms);
      if (finest.seg_chunks > 0) {
        *plan = finest;
        plan->device_segments = true;
      }
    }
    // Several sequences of a varlen call: the passes take their work from the
    // lists the prologue's set-up CTA writes (LaunchPlan::listed_segments).
    const bool varlen = args.cu_seqlens != nullptr || args.cu_seqlens_int32 != nullptr;
    plan->listed_segments = varlen && shape.seqs > 1;
  } else {
    const int64_t forced = g_force_seg_chunks.load();
    plan->seg_chunks = forced > 0 ? forced : forced < 0 ? 0 : split_segment_chunks(split_shape(args), num_sms);
    if (plan->seg_chunks <= 0)
      plan->seg_chunks = std::max<int64_t>(1, (args.batch * args.seqlen + kChunk - 1) / kChunk);
    plan->v_split = 2;
    plan->stages = kSegmentStages;
    plan->superposed_outputs = false;
  }
  // The segment scan's grids (pass 1: 4 CTAs per segment slot and head; pass 2:
  // kComposeCtasPerSeqHead per sequence and head, twice in a summaries call)
  // must fit a launch.
  if (plan->seg_chunks > 0 &&
      (segment_slots_for(args, plan->seg_chunks) * value_heads(args) * 4 > kMaxGridCtas ||
       num_sequences(args) * value_heads(args) * kComposeCtasPerSeqHead * 2 > kMaxGridCtas)) {
    if (split)
      return Status::NotSupported("num_seqs x num_v_heads: too many (sequence, head) pairs for the summaries and "
                                  "resume calls of backend kCuda");
    plan->seg_chunks = 0;
    plan->superposed_outputs = false;
  }
  if (plan->superposed_outputs && segment_slots_for(args, plan->seg_chunks) * value_heads(args) *
                                          output_parts(plan->seg_chunks) > kMaxGridCtas)
    plan->superposed_outputs = false;
  if (plan->seg_chunks <= 0) plan->device_segments = plan->listed_segments = false;
  return Status::Ok();
}

int32_t device_plan_pieces(const ProblemShape& shape, bool superposed, int64_t piece, int num_sms) {
  return device_plan_pieces(
      segment_rule(shape, num_sms), superposed, piece,
      [&](const SegmentRule& r, int64_t seg) { return cut_sequences_pass1_ctas(shape, r, seg); },
      [&](const auto& f) { return sum_over_sequences(shape, f); });
}

namespace {

// The plan for these arguments on the current device (the SM count read once).
Status plan_for(const ForwardArgs& args, LaunchPlan* plan, int* device, int* sms = nullptr) {
  int dev = 0, num_sms = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cached_attribute(&DeviceFacts::num_sms, cudaDevAttrMultiProcessorCount, dev, &num_sms);
  if (err != cudaSuccess) return cuda_status(err, "reading the device's SM count");
  const Status s = launch_plan_for(args, num_sms, plan);
  if (!s.ok()) return s;
  if (device != nullptr) *device = dev;
  if (sms != nullptr) *sms = num_sms;
  return Status::Ok();
}
// Bytes of the workspace's segment-scan states for `seg_chunks` (0 when 0).
size_t segment_state_bytes(const ForwardArgs& args, int64_t seg_chunks) {
  if (seg_chunks <= 0) return 0;
  return static_cast<size_t>(segment_slots_for(args, seg_chunks) * value_heads(args)) * sizeof(SegmentState);
}
// Bytes of the chunks' o⁰ and P (outputs by superposition): one ChunkOutputs per
// chunk slot and value head, 12 KB at K = 128 (6 at 64).
size_t chunk_output_bytes(const ForwardArgs& args) {
  const size_t tile = args.head_dim_k == 64 ? sizeof(ChunkOutputs<64>) : sizeof(ChunkOutputs<kHeadDim>);
  return static_cast<size_t>(slots_for(args) * value_heads(args)) * tile;
}

// A varlen call with periodic checkpoints: every sequence's first entry (N int64,
// checkpoints.cuh), on a 256-byte boundary after the rest of the workspace.
bool tabulates_first_entries(const ForwardArgs& args) {
  const bool varlen = args.cu_seqlens != nullptr || args.cu_seqlens_int32 != nullptr;
  return varlen && args.checkpoints != nullptr;
}
size_t first_entries_offset(const ForwardArgs& args, const LaunchPlan& plan) {
  const size_t before = records_bytes(args) + segment_state_bytes(args, plan.seg_chunks) +
                        (plan.superposed_outputs ? chunk_output_bytes(args) : 0) +
                        (orders_sequences(args, plan) ? sequence_order_bytes(args) : 0);
  return (before + kSegmentStateAlign - 1) / kSegmentStateAlign * kSegmentStateAlign;
}
// The segment plan the device writes (LaunchPlan::listed_segments), after the first
// entries, or where they would start: its DeviceSegmentPlan, then the list of
// segments past the first, then the cut sequences (their room: list_room), then
// the sequences longest first (the segment 0s' order).
size_t device_plan_offset(const ForwardArgs& args, const LaunchPlan& plan) {
  return first_entries_offset(args, plan) +
         (tabulates_first_entries(args) ? static_cast<size_t>(num_sequences(args)) * sizeof(int64_t) : 0);
}
// The room of a listed plan's lists (segment_list_room), which also sizes the
// grids that read them. With the host's lengths (LaunchPlan::device_segments
// false) the lists counted as the set-up CTA will write them: the segments past
// each sequence's first, and the sequences the composition walks. Sized by the
// bounds below instead, the composition took its register form over every
// sequence that could be cut (32 CTAs a sequence and head): 28 µs (ncu) at 12
// heads for one long sequence among 15 short ones (docs/perf-log.md).
// Lengths the device's only: bounds for any lengths. A cut sequence has more
// than a piece's tokens, so at most T / (16·piece) + 1 are cut. A cut sequence
// n of C_n <= L_n / 16 + 1 chunks has G_n − 1 < C_n / (m·piece) segments past
// its first (m pieces a segment), m·(G_n − 1) < C_n / piece pieces in them; the
// cut ones hold at most T tokens, so the later segments' pieces are fewer than
// (T / 16 + max_cut) / piece whatever the lengths and m. Sized by the segment
// slots (N + T / (16·piece)), a batch of many short sequences launched thousands
// of CTAs that found nothing (docs/perf-log.md). The segment slots are no fewer
// (N >= 2 where the plan lists), so the grids' limit holds.
ListRoom list_room(const ForwardArgs& args, const LaunchPlan& plan) {
  ListRoom r;
  const int64_t n = num_sequences(args);
  if (!plan.device_segments && args.cu_seqlens_host != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = (args.cu_seqlens_host[i + 1] - args.cu_seqlens_host[i] + kChunk - 1) / kChunk;
      const int64_t count = segments_of(c, plan.seg_chunks);
      r.later += count - 1;
      r.cut += composed(count, plan.superposed_outputs) ? 1 : 0;
    }
    r.later = std::max<int64_t>(1, r.later);  // grids of one CTA at least
    r.cut = std::max<int64_t>(1, r.cut);
    return r;
  }
  const int64_t chunks = args.batch * args.seqlen / kChunk;
  r.cut = std::min(n, chunks / plan.seg_chunks + 1);
  r.later = std::min(segment_slots_for(args, plan.seg_chunks), (chunks + r.cut) / plan.seg_chunks + 1);
  return r;
}
size_t device_plan_bytes(const ForwardArgs& args, const LaunchPlan& plan) {
  const ListRoom room = list_room(args, plan);
  return sizeof(DeviceSegmentPlan) + static_cast<size_t>(room.later) * sizeof(SegmentRef) +
         static_cast<size_t>(room.cut) * sizeof(int32_t) + sequence_order_bytes(args);
}
}  // namespace

size_t device_segment_plan_offset(const ForwardArgs& args, const LaunchPlan& plan) {
  return device_plan_offset(args, plan);
}

ListRoom segment_list_room(const ForwardArgs& args, const LaunchPlan& plan) { return list_room(args, plan); }

Status workspace_size(const ForwardArgs& args, size_t* bytes) {
  // One ChunkOperands record per (chunk slot, value head): 19 KB per 16 tokens
  // and head, a little more than the q, k, v, g inputs themselves. Stored in its
  // shared-memory layout (swizzled where it would otherwise need padding):
  // unpacking a dense record cost the recurrence kernel more instructions than
  // the bytes saved (docs/perf-log.md). When the plan splits sequences, 128 KB
  // of fp32 segment states per (segment slot, value head) follow, and, with
  // outputs by superposition, 16 KB of o⁰ and P per (chunk slot, value head);
  // else, in a varlen batch, the sequences' order (4 bytes a sequence). A varlen
  // call with periodic checkpoints adds 8 bytes a sequence (their first entries),
  // one with listed segments (LaunchPlan::listed_segments) its plan:
  // 16 bytes, 8 for each of at most (T / 16 + N) / piece + 1 later pieces
  // (list_room), and at most 8 a sequence.
  LaunchPlan plan;
  Status s = plan_for(args, &plan, nullptr);
  if (!s.ok()) return s;
  const size_t seg = segment_state_bytes(args, plan.seg_chunks);
  if (seg > 0) *bytes = records_bytes(args) + seg + (plan.superposed_outputs ? chunk_output_bytes(args) : 0);
  else if (orders_sequences(args, plan)) *bytes = records_bytes(args) + sequence_order_bytes(args);
  else *bytes = static_cast<size_t>(slots_for(args) * value_heads(args)) * sizeof(ChunkOperands);
  if (tabulates_first_entries(args) || plan.listed_segments)
    *bytes = device_plan_offset(args, plan) + (plan.listed_segments ? device_plan_bytes(args, plan) : 0);
  return Status::Ok();
}

ProblemShape problem_shape(const ForwardArgs& args) {
  ProblemShape shape;
  const int64_t n = num_sequences(args);
  shape.seqs = n;
  shape.heads = value_heads(args);
  shape.row_parts = args.head_dim_k / 64;
  shape.superposable = args.checkpoints == nullptr && args.slot_checkpoint_offsets == nullptr &&
                       args.summaries_M == nullptr && !args.resume_from_summaries;
  auto chunks = [](int64_t len) { return (len + kChunk - 1) / kChunk; };
  if (args.cu_seqlens == nullptr && args.cu_seqlens_int32 == nullptr) {
    shape.longest_chunks = chunks(args.seqlen);
    shape.total_chunks = n * shape.longest_chunks;
  } else if (args.cu_seqlens_host == nullptr) {
    shape.total_chunks = (args.batch * args.seqlen + kChunk - 1) / kChunk;  // lengths unknown: about this many
  } else {
    shape.longest_chunks = 0;
    shape.cu_seqlens_host = args.cu_seqlens_host;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = chunks(args.cu_seqlens_host[i + 1] - args.cu_seqlens_host[i]);
      shape.total_chunks += c;
      shape.longest_chunks = std::max(shape.longest_chunks, c);
    }
  }
  return shape;
}

// Sequences long enough (on average) for the plan's per-CTA machinery to pay:
// one 8-warp CTA a chain where chains are many, and the entry storer. Both
// measured on the H200 on either side of 16 chunks (docs/perf-log.md: "one
// 8-warp CTA a chain ...", "The entry storer").
constexpr int64_t kLongChainChunks = 16;
bool long_chains(const ProblemShape& shape) { return shape.total_chunks >= kLongChainChunks * shape.seqs; }

LaunchPlan choose_launch_plan(const ProblemShape& shape, int num_sms) {
  LaunchPlan plan;
  // Checkpoint calls write their periodic entries through the entry storer
  // (entry_storer.cuh) where the records come by bulk copy and the sequences are
  // long. With 4-8 chunks a sequence (batches of 64-1024 sequences of 64-128
  // tokens, 32-96 heads) its warpgroup cost 3-6 % of the call, with 16 and more it
  // saved 1-2 %. The cp.async checkpoint variant (4-warp CTAs, one an SM) has no
  // storer: beside cp.async records it cost 3-4 %.
  plan.entry_storer = long_chains(shape);
  // Rows of S are independent, so a (sequence, head) can be served by several
  // CTAs that each own a slice of V and share the chunk records through L2.
  // Measured on the H200 (docs/perf-log.md, 2026-11-29, late): two 4-warp
  // CTAs per (sequence, head) beat one 8-warp CTA in every row of the standard
  // table except 64/8x1024 (within 1 %; the kernels of that day: with many
  // chains the 8-warp CTA has since caught up, below), and a quarter slice
  // never paid. When the longest chain of chunks bounds the kernel (the longest
  // sequence has more chunks than half of what each of the 2 x SMs resident
  // 8-warp CTAs would get of the whole) four records in flight are best
  // (varlen-6: 3 stages lose 6 %); when the total work does, three (measured
  // faster at 8 x 1024, H = 96, though at its registers two CTAs an SM still
  // bound it, as with four: recurrence_kernel.cuh; that row now takes the
  // 8-warp CTA below, batches of short sequences keep them). A varlen call
  // without cu_seqlens_host may hide a long sequence: treated as chain-bound.
  constexpr int64_t kResidentCtasPerSm = 2;
  const int64_t work_per_cta =
      shape.total_chunks * shape.heads / std::max<int64_t>(1, kResidentCtasPerSm * num_sms);
  const bool chain_bound = shape.longest_chunks < 0 || 2 * shape.longest_chunks > work_per_cta;
  plan.v_split = 2;
  plan.stages = chain_bound ? 4 : 3;
  // With the state's products as wgmma (2026-11-30): when every (sequence, head)
  // gets an SM to itself as one 8-warp CTA but two 4-warp CTAs would double up
  // on some SMs, the busiest SM holds 8 state warps either way, and the single
  // CTA is faster (H = 96, T = 8192: 1.129 against 1.160 ms). With one 4-warp
  // CTA per SM the split is far better (H = 64, T = 8192: 0.752 against 0.937).
  const int64_t chains = shape.seqs * shape.heads;
  const bool an_sm_each = chains <= num_sms && 2 * chains > num_sms;
  // With at least three chains an SM of at least 16 chunks each on average
  // (2026-12-03: 96 heads x 8 x 1024 and varlen-6, 32-96 heads x 16 x 512 and
  // 32 x 256, 64 heads x 8 x 1024) the 8-warp CTA was level or 1-3.6 % faster,
  // and 0.3-2.7 % faster with checkpoints, at a higher SM clock (likely, not
  // profiled: it brings each record into shared memory once for its 128 rows,
  // where two 4-warp CTAs bring it twice). Between one and three chains an SM
  // (48 and 64 heads x 3 x 2048, 64 heads x varlen-6) the 4-warp CTAs were
  // level or faster, by up to 10 %: smaller CTAs fill the last wave better. On
  // shorter sequences the 8-warp CTA was level (8 chunks: 16-96 heads x 64 x
  // 128) or 2.5-4.7 % slower (one chunk: 512 x 16), where a CTA's set-up (the
  // state's loads, the first records) is most of it.
  constexpr int64_t kManyChainsPerSm = 3;
  const bool many_long_chains = chains >= kManyChainsPerSm * num_sms && long_chains(shape);
  if (an_sm_each || many_long_chains) {
    plan.v_split = 1;
    plan.stages = 4;
  }
  // Only where pass 3 by chains would cut too: at T = 1024 two segments
  // superposed measured slower than one chain (the extra launches and the
  // composition cost more than 32 steps).
  ProblemShape by_chains = shape;
  by_chains.superposable = false;
  plan.seg_chunks = choose_segment_chunks(by_chains, num_sms);
  if (plan.seg_chunks > 0 && shape.superposable) {
    const int64_t seg = choose_segment_chunks(shape, num_sms);
    if (seg > 0 && superposition_pays(shape, plan.seg_chunks, seg)) {
      plan.seg_chunks = seg;
      plan.superposed_outputs = true;
    }
  }
  // Only where the cut is faster than one pass (segment_plan.h, cut_pays).
  if (plan.seg_chunks > 0 &&
      !cut_pays(segment_rule(shape, num_sms), plan.seg_chunks, plan.superposed_outputs,
                [&](const auto& f) { return sum_over_sequences(shape, f); })) {
    plan.seg_chunks = 0;
    plan.superposed_outputs = false;
  }
  if (plan.seg_chunks > 0) {
    plan.v_split = 2;
    plan.stages = kSegmentStages;
  }
  return plan;
}

int staged_compose_rows(int64_t chains, int64_t dim, int num_sms) {
  for (const int rows : {4, 8, 16, 32})
    if (chains * (dim / rows) <= num_sms) return rows;
  return 0;
}

void set_launch_override(const LaunchOverride& forced) {
  g_force_v_split.store(forced.v_split);
  g_force_stages.store(forced.stages);
  g_force_seg_chunks.store(forced.seg_chunks);
  g_force_records.store(forced.records);
  g_force_outputs.store(forced.outputs);
  g_force_compose.store(forced.compose);
  g_force_output_chunks.store(forced.output_chunks);
  g_force_entry_storer.store(forced.entry_storer);
}

LaunchPlan effective_launch_plan(const ProblemShape& given, int num_sms) {
  const int outputs = g_force_outputs.load();
  ProblemShape shape = given;
  if (outputs == 1) shape.superposable = false;  // pass 3 by chains, planned as such
  LaunchPlan plan = choose_launch_plan(shape, num_sms);
  if (outputs == 2 && shape.superposable && plan.seg_chunks > 0 && !plan.superposed_outputs) {
    const int64_t seg = choose_segment_chunks(shape, num_sms);  // the superposed count
    if (seg > 0) plan.seg_chunks = seg;
    plan.superposed_outputs = true;
  }
  const int v_split = g_force_v_split.load();
  if (v_split == 1 || v_split == 2) plan.v_split = v_split;
  const int stages = g_force_stages.load();
  if (stages == 3 || stages == 4) plan.stages = stages;
  const int64_t seg = g_force_seg_chunks.load();
  if (seg != 0) {
    plan.seg_chunks = seg > 0 ? seg : 0;
    plan.superposed_outputs = seg > 0 && shape.superposable && (outputs == 2 || superposition_pays(shape, seg, seg));
  }
  if (plan.seg_chunks > 0) plan.v_split = 2;  // the segment scan runs 4-warp CTAs
  if (plan.v_split != 2) plan.stages = 4;  // the only instantiations built
  const int storer = g_force_entry_storer.load();
  if (storer == 1 || storer == 2) plan.entry_storer = storer == 2;
  return plan;
}

Status forward(const ForwardArgs& args, void* workspace, size_t, void* stream) {
  const int64_t n = num_sequences(args);
  const int64_t hv = value_heads(args);
  if (n == 0 || hv == 0) return Status::Ok();

  FwdParams p{};
  p.q = static_cast<const uint16_t*>(args.q);
  p.k = static_cast<const uint16_t*>(args.k);
  p.v = static_cast<const uint16_t*>(args.v);
  set_gate_inputs(p, args);
  p.A_log = args.A_log;
  p.dt_bias = args.dt_bias;
  p.out = static_cast<uint16_t*>(args.out);
  p.initial_state = args.initial_state;
  p.final_state = args.final_state;
  p.states_key_major = args.states_key_major ? 1 : 0;
  p.initial_state_type = state_type(args.initial_state ? args.initial_state_dtype : DType::kNone);
  p.final_state_type = state_type(args.final_state ? args.final_state_dtype : DType::kNone);
  p.cu_seqlens = args.cu_seqlens;
  p.cu_seqlens32 = args.cu_seqlens_int32;
  p.seqlen = args.seqlen;
  const int64_t K = args.head_dim_k;  // = V: check_supported
  // Strides, dense ones resolved; below 2^31: check_supported.
  store_strides32(token_views(args, args.num_heads, hv, K, K),
                  {{&p.q_tok, &p.q_head}, {&p.k_tok, &p.k_head}, {&p.v_tok, &p.v_head}, {&p.g_tok, &p.g_head},
                   {&p.beta_tok, &p.beta_head}});
  if (args.state_pool != nullptr) {
    p.state_pool = args.state_pool;
    p.pool_type = state_type(args.state_pool_dtype);
    p.index_is_int64 = args.state_index_type == IndexType::kInt64 ? 1 : 0;
    p.pool_size = args.pool_size;
    p.pool_stride = args.pool_stride != 0 ? args.pool_stride : hv * K * K;  // 64-bit: slots may be far apart
    p.state_indices = args.state_indices;
    p.has_initial_state = args.has_initial_state;
    p.slot_ck_offsets = args.slot_checkpoint_offsets;
    p.slot_ck_slots = args.slot_checkpoint_slots;
  }
  if (args.checkpoints != nullptr) {
    p.checkpoints = args.checkpoints;
    p.ck_type = state_type(args.checkpoints_dtype);
    p.ck_value_major = args.checkpoints_value_major ? 1 : 0;
    p.ck_chunks = args.checkpoint_interval / kChunk;
    p.ck_capacity = args.checkpoints_capacity;
  }
  p.total_tokens = args.batch * args.seqlen;
  p.num_seqs = static_cast<int32_t>(n);
  p.head_dim = static_cast<int32_t>(K);
  p.num_heads = static_cast<int32_t>(args.num_heads);
  p.num_v_heads = static_cast<int32_t>(hv);
  p.scale = args.scale;
  p.lower_bound_log2e = args.lower_bound * kLog2e;
  p.chunk_records = workspace;
  p.num_slots = slots_for(args);

  // Checkpoints run the recurrence variant that writes them (4 stages).
  const bool checkpoints = p.checkpoints != nullptr || p.slot_ck_offsets != nullptr;
  LaunchPlan plan;
  int dev = 0, num_sms = 0;
  Status planned = plan_for(args, &plan, &dev, &num_sms);
  if (!planned.ok()) return planned;
  const bool entry_storer = checkpoints && plan.entry_storer;
  // K = V = 64: one 4-warp CTA per (sequence, head) holds the whole state (the
  // 64-wide instantiations, 4 stages); the plan's segment count still applies.
  const bool dim64 = K == 64;
  p.v_split = dim64 ? 1 : plan.v_split;
  if (orders_sequences(args, plan))
    p.seq_order = reinterpret_cast<int32_t*>(static_cast<char*>(workspace) + records_bytes(args));
  if (tabulates_first_entries(args))
    p.ck_first_entries = reinterpret_cast<int64_t*>(static_cast<char*>(workspace) + first_entries_offset(args, plan));
  if (plan.seg_chunks > 0) {
    // The segment scan's pieces, set before the prologue: the set-up CTA of a
    // listed plan lists the segments from them (plan_segments_on_device).
    p.seg_chunks = plan.seg_chunks;
    p.num_seg_slots = segment_slots_for(args, plan.seg_chunks);
    p.superpose = plan.superposed_outputs ? 1 : 0;
  }
  if (plan.listed_segments) {
    // Where the plan the device writes goes; the rule applied there only where
    // the lengths are the device's alone.
    p.device_rule = plan.device_segments ? 1 : 0;
    p.later_first = plan.device_segments ? 0 : 1;  // FwdParams::later_first says why
    char* at = static_cast<char*>(workspace) + device_plan_offset(args, plan);
    const ListRoom room = list_room(args, plan);
    p.max_later = static_cast<int32_t>(room.later);
    p.max_cut = static_cast<int32_t>(room.cut);
    p.seg_plan = reinterpret_cast<DeviceSegmentPlan*>(at);
    p.seg_list = reinterpret_cast<SegmentRef*>(at + sizeof(DeviceSegmentPlan));
    p.seg_cut = reinterpret_cast<int32_t*>(p.seg_list + p.max_later);
    p.seq_order = p.seg_cut + p.max_cut;
    p.num_sms = num_sms;
  }
  const int64_t num_ctas = n * hv * p.v_split;
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaSuccess;
  p.split_mode = args.summaries_M != nullptr ? kSplitSummaries
                 : args.resume_from_summaries ? kSplitResume
                                              : kSplitNone;
  p.summaries_M = args.summaries_M;
  p.summaries_B = args.summaries_B;
  // Resuming: the records and the segment summaries are in the workspace already.
  if (p.num_slots > 0 && p.split_mode != kSplitResume) {
    err = launch_prologue(p, dev, s);
    if (err != cudaSuccess) return cuda_status(err, "launching the prologue kernel");
  }
  // The 4-warp recurrence CTAs (64 rows of the state each): the segment scan's
  // passes, V split 2, and every launch at K = 64. At K = 128 their records come
  // by bulk copy (no proxy fence in the chunk loop) where CTAs share SMs, and by
  // cp.async where each has an SM to itself: there the bulk copies measured 2-3 %
  // slower in every run, also with six stages in flight, so not because a record
  // lands late (docs/perf-log.md, "records six stages deep"); the cause is not
  // known. The 3-stage plan (many CTAs an SM) always takes bulk copies.
  auto records_by_bulk_copy = [&](int64_t ctas) {
    const int forced = g_force_records.load();
    return forced != 0 ? forced == 2 : ctas > num_sms;
  };
  auto launch_4warps = [&](int64_t ctas) {
    if (dim64)
      return checkpoints ? launch_recurrence<4, 4, true, 64>(p, ctas, dev, s)
                         : launch_recurrence<4, 4, false, 64>(p, ctas, dev, s);
    const bool bulk = records_by_bulk_copy(ctas);
    if (checkpoints && bulk && entry_storer)
      return launch_recurrence<4, 4, true, 128, kRecordsByBulkCopy, false, kWithEntryStorer>(p, ctas, dev, s);
    if (checkpoints)
      return bulk ? launch_recurrence<4, 4, true, 128, kRecordsByBulkCopy>(p, ctas, dev, s)
                  : launch_recurrence<4, 4, true>(p, ctas, dev, s);
    if (plan.stages == 3) return launch_recurrence<4, 3, false, 128, kRecordsByBulkCopy>(p, ctas, dev, s);
    return bulk ? launch_recurrence<4, 4, false, 128, kRecordsByBulkCopy>(p, ctas, dev, s)
                : launch_recurrence<4, 4, false>(p, ctas, dev, s);
  };
  if (plan.seg_chunks > 0) {
    // The segment scan: summaries, their composition, the segments from their states.
    p.seg_states = reinterpret_cast<float*>(static_cast<char*>(workspace) + records_bytes(args));
    const int64_t row_parts = K / 64;  // 4-warp CTAs own 64 rows
    // Segment slots, or the listed plan's entries: the passes' grids past the segment 0s.
    const int64_t later = plan.listed_segments ? p.max_later : p.num_seg_slots;
    auto compose = [&] {
      const int64_t kinds = p.split_mode == kSplitSummaries ? 2 : 1;
      const int forced = g_force_compose.load();
      const bool forced_rows = forced == 4 || forced == 8 || forced == 16 || forced == 32;
      const int64_t seqs = plan.listed_segments ? p.max_cut : n;  // a listed plan lists the cut ones
      const int rows = forced == 1 ? 0 : forced_rows ? forced : staged_compose_rows(seqs * hv * kinds, K, num_sms);
      return launch_segment_compose(p, dev, rows, s);
    };
    auto run_pass = [&](RecurrencePass pass, int64_t ctas) {
      p.pass = pass;
      return launch_4warps(ctas);
    };
    if (plan.superposed_outputs) {
      // Pass 1 leaves o⁰ and P; the composition also writes the final states; the
      // output kernel forms out (segment_outputs.cuh).
      p.output_chunks = static_cast<int32_t>(output_chunks_per_cta(p.total_tokens / kChunk * hv, num_sms));
      p.output_parts = static_cast<int32_t>(output_parts(plan.seg_chunks, p.output_chunks));
      p.chunk_outputs =
          static_cast<char*>(workspace) + records_bytes(args) + segment_state_bytes(args, plan.seg_chunks);
      auto superposed_pass = [&](RecurrencePass pass, int64_t ctas) {
        p.pass = pass;
        return dim64 ? launch_recurrence<4, 4, false, 64, kRecordsByCpAsync, true>(p, ctas, dev, s)
                     : launch_recurrence<4, 4, false, 128, kRecordsByBulkCopy, true>(p, ctas, dev, s);
      };
      // The device's segment 0s write out themselves: the kernel without superposition.
      if (plan.listed_segments && !p.later_first) err = run_pass(kPassFirstSegments, n * hv * row_parts);
      if (err == cudaSuccess) err = superposed_pass(kPassSummaries, later * hv * 2 * row_parts);
      if (err == cudaSuccess && p.later_first) err = run_pass(kPassFirstSegments, n * hv * row_parts);
      if (err != cudaSuccess) return cuda_status(err, "launching the segment summaries (recurrence kernel)");
      err = compose();
      if (err != cudaSuccess) return cuda_status(err, "launching the segment composition kernel");
      err = launch_segment_output(p, later * hv * p.output_parts, dev, s);
      if (err != cudaSuccess) return cuda_status(err, "launching the segment output kernel");
      return Status::Ok();
    }
    if (p.split_mode != kSplitResume) {
      if (plan.listed_segments && !p.later_first) err = run_pass(kPassFirstSegments, n * hv * row_parts);
      if (err == cudaSuccess) err = run_pass(kPassSummaries, later * hv * 2 * row_parts);
      if (err == cudaSuccess && p.later_first) err = run_pass(kPassFirstSegments, n * hv * row_parts);
      if (err != cudaSuccess) return cuda_status(err, "launching the segment summaries (recurrence kernel)");
    }
    err = compose();
    if (err != cudaSuccess) return cuda_status(err, "launching the segment composition kernel");
    if (p.split_mode == kSplitSummaries) return Status::Ok();
    err = run_pass(kPassFromStates, later * hv * row_parts);
    if (err != cudaSuccess) return cuda_status(err, "launching the segments from their states (recurrence kernel)");
    return Status::Ok();
  }
  p.pass = kPassWhole;
  if (dim64 || p.v_split == 2) {
    err = launch_4warps(num_ctas);
  } else if (p.v_split == 1) {
    if (checkpoints && entry_storer)
      err = launch_recurrence<8, 4, true, 128, kRecordsByBulkCopy, false, kWithEntryStorer>(p, num_ctas, dev, s);
    else if (checkpoints)
      err = launch_recurrence<8, 4, true, 128, kRecordsByBulkCopy>(p, num_ctas, dev, s);
    else
      err = launch_recurrence<8, 4, false, 128, kRecordsByBulkCopy>(p, num_ctas, dev, s);
  } else {
    err = cudaErrorInvalidValue;
  }
  if (err != cudaSuccess) return cuda_status(err, "launching the recurrence kernel");
  return Status::Ok();
}

}  // namespace flashkda::sm90
