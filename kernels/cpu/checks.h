// The argument checks of the extension's operators: each operator runs its own before its loops, so a call from
// Python (the wrappers in kernels/cpu_decode.py, or torch.ops.sparsekv_cpu.* directly) can never index past a
// tensor, divide by zero or read memory it was not given.
//
// Rules, for every operator:
//   1. every tensor's rank, dtype, sizes (> 0 where a loop divides by or walks them) and, where it is read in place,
//      contiguity are checked;
//   2. every index the loops follow is checked against the range it addresses (block ids against the table, table
//      entries against the pool, token counts against the table's capacity), in one pass over the index tensor
//      before the work starts: O(number of indices), never inside the hot loops;
//   3. a wrong dtype raises TORCH_CHECK_TYPE (Python TypeError), every other bad argument TORCH_CHECK_VALUE
//      (ValueError), with a message naming the operator, the argument and the expected value;
//   4. nothing is written before every check has passed: decode_layer checks its whole call before it stores the
//      new token's K/V (only qlinear_q8's test of its activations for NaN or inf, a value computed after the store,
//      can still refuse the step once it has written).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

namespace skv {

// Every value of `t` (contiguous int64, checked by the caller) lies in [lo, hi); else a ValueError naming the
// first value out of range and its flat position. `what`: what the range is, for the message.
inline void check_range(const at::Tensor& t, int64_t lo, int64_t hi, const char* op, const char* name,
                        const char* what) {
  const int64_t* p = t.data_ptr<int64_t>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK_VALUE(p[i] >= lo && p[i] < hi, op, ": ", name, " must hold values in [", lo, ", ", hi, ") (", what,
                      "), got ", p[i], " at flat index ", i);
}

}  // namespace skv

// paged_decode.cpp: q [Hq, D] float32; k, v [H, NB, bs, D]; table [nb] int64 with entries in [0, NB);
// 1 <= num_tokens <= nb * bs; 0 <= min_token < num_tokens; splits >= 1. `op` names the caller in messages.
void check_paged_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                        int64_t num_tokens, int64_t splits, int64_t min_token, const char* op);
// paged_decode.cpp: blocks [H, K] int64, K >= 1, entries in [-1, nb) (-1: padding).
void check_blocks(const at::Tensor& blocks, int64_t H, int64_t nb, const char* op);
// route.cpp: q [Hq, D] float32; a, b [H, NB, D] alike; table [nb] int64, nb >= 1, entries in [0, NB).
void check_summaries(const at::Tensor& q, const at::Tensor& a, const at::Tensor& b, const at::Tensor& table,
                     const char* op);
// route.cpp: route_topk's scalars: kind 0, 1 or 2; top_k >= 1, sink >= 0, local >= 1.
void check_route_args(int64_t kind, int64_t top_k, int64_t sink, int64_t local, const char* op);
// qlinear.cpp: a linear's codes, scale and offset for `bits` and `group` (and qlinear_q8's own rule when `q8`);
// returns its (N, K).
std::pair<int64_t, int64_t> check_qlinear(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset,
                                          int64_t bits, int64_t group, bool q8);
