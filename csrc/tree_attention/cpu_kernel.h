// The CPU kernel of tree_attention on raw pointers, sizes and strides (no torch types), built
// three times: with AVX-512 flags (cpu_avx512.cpp), with AVX2 + FMA (cpu_avx2.cpp) and for any
// x86-64 (cpu_generic.cpp); cpu.cpp picks one at run time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace eagle3::tree_attention::cpu {

enum class DType { kFloat, kHalf, kBFloat16 };

// Keys per block: the kernel computes a [rows, kKeys] score tile, updates the online softmax
// and accumulates the tile's values before it moves on. Two 16-float vectors wide.
inline constexpr int64_t kKeys = 32;
// Keys per register tile of the q.K micro kernel (x 16 packed query rows).
inline constexpr int64_t kKeyTile = 8;
// Query rows per register tile of the P.V micro kernel.
inline constexpr int64_t kRowTile = 4;
// Head-dim columns per register tile of the P.V micro kernel (four 16-float vectors).
inline constexpr int64_t kColTile = 64;
// Packed query rows of one task at most (cpu.cpp splits the rows so; per-row arrays on the stack).
inline constexpr int64_t kMaxTaskRows = 64;
// Tree tokens whose positions a windowed task keeps on the stack (cpu.cpp refuses larger trees
// with a window).
inline constexpr int64_t kMaxWindowTree = 1024;

// The KV cache as pages: position s of request b is row s % page_size of page
// block_table[b][s / page_size]. A contiguous [B, S_max, Hkv, D] cache is one page per
// request (block_table == nullptr, page b, page_size = S_max), so one code path reads both.
// (The accessor is in cpu_kernel_impl.h: nothing inline here, since this header is also
// compiled with AVX-512 flags and the linker may keep any one copy of an inline function.)
struct KvCache {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_page = 0, k_row = 0, k_head = 0;  // strides (elements) of k
  int64_t v_page = 0, v_row = 0, v_head = 0;  // strides (elements) of v
  const int32_t* block_table = nullptr;       // [B, bt_stride] or nullptr
  int64_t bt_stride = 0;
  int64_t page_size = 0;
};

struct Params {
  DType dtype = DType::kFloat;
  const void* q = nullptr;  // [B, N, Hq, D]
  int64_t q_batch = 0, q_token = 0, q_head = 0;
  void* out = nullptr;      // [B, N, Hq, D]
  int64_t o_batch = 0, o_token = 0, o_head = 0;
  KvCache kv;
  const int64_t* cache_lens = nullptr;  // [B]
  const uint8_t* mask = nullptr;        // bool [B, N, N]
  int64_t m_batch = 0, m_row = 0, m_col = 0;
  int64_t batch = 0, tree = 0, q_heads = 0, kv_heads = 0;
  int64_t head_dim = 0;   // Dqk (q, k)
  int64_t v_dim = 0;      // Dv (v, out)
  float scale = 1.f;
  int64_t window = 0;     // sliding window in positions, 0 = none
  float softcap = 0.f;    // logit soft-cap, 0 = none
  const float* sinks = nullptr;         // [Hq] sink logits or nullptr
  const int64_t* tree_start = nullptr;  // [B] slot of tree token 0, or nullptr (= cache_lens)
  float* part_out = nullptr;  // [splits, B, N, Hq, Dv] fp32, for tasks of a KV split
  float* part_lse = nullptr;  // [splits, B, N, Hq] log2-sum-exp of each split's scores
  bool bf16_dot = false;  // the CPU has AVX512-BF16 (used by the AVX-512 build for bf16 q . K)
};

// Floats of scratch one task of `rows` query rows needs (64-byte aligned by the caller).
size_t scratch_floats(int64_t head_dim, int64_t v_dim, int64_t rows);

// One task: request b, kv head h, packed query rows [row_begin, row_end) of the N x G rows
// (row r is tree token r / G, q head h * G + r % G) over the cache positions
// start + [kv_begin, kv_end), start = the request's window_start (0 without a window), clipped
// to [start, cache_lens[b] + N). With split < 0 the task covers all positions and writes its
// rows of the output (sinks applied); otherwise it writes its rows of split `split` to
// part_out (normalized) and part_lse, and the caller merges the splits (and the sinks).
struct Task {
  int64_t b = 0, h = 0, row_begin = 0, row_end = 0;
  int64_t kv_begin = 0, kv_end = 0;
  int64_t split = -1;
};

void run_task_avx512(const Params& p, const Task& t, float* scratch);
void run_task_avx2(const Params& p, const Task& t, float* scratch);
void run_task_generic(const Params& p, const Task& t, float* scratch);

}  // namespace eagle3::tree_attention::cpu
