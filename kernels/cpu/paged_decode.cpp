// Fused paged decode attention for the CPU: one pass over the selected K/V tiles, in place.
//
// Algorithm (flash-decoding on the CPU):
//   work items = (kv head h, split s); split s of head h owns a contiguous run of that head's
//   entries in blocks[h] (every logical block for dense, the selected ones for sparse; -1 entries
//   are padding and are skipped).
//   per item, for each of its blocks j (physical tile p = table[j], rows = valid tokens of j):
//       s[g, r]  = scale * q[h*G + g] . K[h, p, r]          for the G query heads of the group
//       m_new[g] = max(m[g], max_r s[g, r])
//       acc[g]   = acc[g] * exp(m[g] - m_new[g]) + sum_r exp(s[g, r] - m_new[g]) * V[h, p, r]
//       l[g]     = l[g]   * exp(m[g] - m_new[g]) + sum_r exp(s[g, r] - m_new[g])
//   merge the splits of each head with their (m, l):  out = sum_s acc_s e^(m_s - M) / L,
//   lse = M + log L, with M = max_s m_s and L = sum_s l_s e^(m_s - M).
// Every K and V row is read once, straight from the store's head-major pool (no gather copy);
// the G query heads of a group share each row. Storage is float32 or bfloat16; accumulation is
// always float32.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// A finite "minus infinity": the kernel is compiled with -ffast-math (so that exp vectorises), which
// assumes no infinities; exp(kNegBig - x) is 0 for every finite score x.
constexpr float kNegBig = -3.0e38f;

inline float to_f(float x) { return x; }
// bfloat16 as its raw 16 bits: the float with those bits on top, a shift the compiler vectorises.
inline float to_f(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <typename T>
inline float dot(const float* __restrict q, const T* __restrict k, int64_t D) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t d = 0; d < D; ++d) acc += q[d] * to_f(k[d]);
  return acc;
}

template <typename T>
inline void axpy(float a, const T* __restrict v, float* __restrict out, int64_t D) {
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) out[d] += a * to_f(v[d]);
}

template <typename T>
void run(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* blocks, int64_t K, int64_t H, int64_t G, int64_t D, int64_t NB, int64_t bs,
         int64_t N, int64_t S, float scale, float* m_buf, float* l_buf, float* acc_buf) {
  // blocks: [H, K] logical ids per head (-1: padding); m/l: [H, S, G]; acc: [H, S, G, D]
  at::parallel_for(0, H * S, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(G * bs);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / S, sp = item % S;
      const int64_t lo = K * sp / S, hi = K * (sp + 1) / S;
      float* m = m_buf + item * G;
      float* l = l_buf + item * G;
      float* acc = acc_buf + item * G * D;
      std::fill(m, m + G, kNegBig);
      std::fill(l, l + G, 0.f);
      std::fill(acc, acc + G * D, 0.f);
      const float* qh = q + h * G * D;
      for (int64_t i = lo; i < hi; ++i) {
        const int64_t j = blocks[h * K + i];
        if (j < 0) continue;
        const int64_t rows = std::min(bs, N - j * bs);
        if (rows <= 0) continue;
        const int64_t tile = (h * NB + table[j]) * bs * D;
        const T* kt = k + tile;
        const T* vt = v + tile;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t g = 0; g < G; ++g) s[g * bs + r] = scale * dot(qh + g * D, kt + r * D, D);
        for (int64_t g = 0; g < G; ++g) {
          float* sg = s.data() + g * bs;
          float mx = m[g];
          for (int64_t r = 0; r < rows; ++r) mx = std::max(mx, sg[r]);
          const float corr = std::exp(m[g] - mx);      // 0 on the first tile (m = kNegBig)
          float* ag = acc + g * D;
          if (corr != 1.f) {
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) ag[d] *= corr;
          }
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t r = 0; r < rows; ++r) {          // vectorised exp (libmvec under -ffast-math)
            sg[r] = std::exp(sg[r] - mx);
            sum += sg[r];
          }
          for (int64_t r = 0; r < rows; ++r) axpy(sg[r], vt + r * D, ag, D);
          l[g] = l[g] * corr + sum;
          m[g] = mx;
        }
      }
    }
  });
}

}  // namespace

// q [Hq, D] float32; k, v [H, NB, bs, D] (one layer, head-major, contiguous) float32 or bfloat16;
// table [nb] int64 physical ids in logical order; blocks [H, K] int64 logical ids per head, -1 for
// padding (dense: every block); num_tokens N; splits S per head.
// Returns out [Hq, D] float32 and lse [Hq] float32.
std::vector<torch::Tensor> paged_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor table,
                                        torch::Tensor blocks, int64_t num_tokens, int64_t splits) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == torch::kFloat32 && q.is_contiguous(), "q must be [Hq, D] float32");
  TORCH_CHECK(k.dim() == 4 && k.is_contiguous() && v.is_contiguous() && k.sizes() == v.sizes(),
              "k and v must be contiguous [H, NB, bs, D]");
  TORCH_CHECK(k.scalar_type() == v.scalar_type() &&
                  (k.scalar_type() == torch::kFloat32 || k.scalar_type() == torch::kBFloat16),
              "k and v must be float32 or bfloat16");
  TORCH_CHECK(table.scalar_type() == torch::kInt64 && blocks.scalar_type() == torch::kInt64 &&
                  table.is_contiguous() && blocks.is_contiguous(), "table and blocks must be contiguous int64");
  const int64_t H = k.size(0), NB = k.size(1), bs = k.size(2), D = k.size(3);
  TORCH_CHECK(q.size(1) == D && q.size(0) % H == 0, "q must be [H * G, D]");
  TORCH_CHECK(blocks.dim() == 2 && blocks.size(0) == H, "blocks must be [H, K]");
  const int64_t G = q.size(0) / H, K = blocks.size(1), S = std::max<int64_t>(1, splits);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  auto m = torch::empty({H, S, G}, f32), l = torch::empty({H, S, G}, f32), acc = torch::empty({H, S, G, D}, f32);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (k.scalar_type() == torch::kFloat32) {
    run<float>(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), table.data_ptr<int64_t>(),
               blocks.data_ptr<int64_t>(), K, H, G, D, NB, bs, num_tokens, S, scale,
               m.data_ptr<float>(), l.data_ptr<float>(), acc.data_ptr<float>());
  } else {
    run<uint16_t>(q.data_ptr<float>(), reinterpret_cast<const uint16_t*>(k.data_ptr<c10::BFloat16>()),
                  reinterpret_cast<const uint16_t*>(v.data_ptr<c10::BFloat16>()),
                       table.data_ptr<int64_t>(), blocks.data_ptr<int64_t>(), K, H, G, D,
                       NB, bs, num_tokens, S, scale, m.data_ptr<float>(), l.data_ptr<float>(), acc.data_ptr<float>());
  }
  // Merge the splits of each head (small: H * S * G * D).
  auto M = std::get<0>(m.max(1, true));                          // [H, 1, G]
  auto w = (m - M).exp();                                        // [H, S, G]; 0 for empty splits
  auto L = (l * w).sum(1);                                       // [H, G]
  auto out = (acc * w.unsqueeze(-1)).sum(1) / L.unsqueeze(-1);   // [H, G, D]
  auto lse = M.squeeze(1) + L.log();
  return {out.reshape({H * G, D}), lse.reshape({H * G})};
}


// ---------------------------------------------------------------------------------------------
// Quest's bound for every block of one sequence, read straight from the store's summaries.
//   bound[h, g, j] = scale * sum_d max(q[h*G+g, d] * kmin[h, table[j], d], q[h*G+g, d] * kmax[h, table[j], d])
// kmin, kmax: [H, NB, D] (one layer, head-major, contiguous) float32 or bfloat16; q [Hq, D] float32.
namespace {

template <typename T>
void minmax_run(const float* q, const T* kmin, const T* kmax, const int64_t* table, int64_t nb, int64_t H,
                int64_t G, int64_t D, int64_t NB, float scale, float* out) {
  at::parallel_for(0, H * nb, 64, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / nb, j = item % nb;
      const T* lo = kmin + (h * NB + table[j]) * D;
      const T* hi = kmax + (h * NB + table[j]) * D;
      for (int64_t g = 0; g < G; ++g) {
        const float* qg = q + (h * G + g) * D;
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < D; ++d) acc += std::max(qg[d] * to_f(lo[d]), qg[d] * to_f(hi[d]));
        out[(h * G + g) * nb + j] = scale * acc;
      }
    }
  });
}

}  // namespace

torch::Tensor minmax_scores(torch::Tensor q, torch::Tensor kmin, torch::Tensor kmax, torch::Tensor table) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == torch::kFloat32 && q.is_contiguous(), "q must be [Hq, D] float32");
  TORCH_CHECK(kmin.dim() == 3 && kmin.is_contiguous() && kmax.is_contiguous() && kmin.sizes() == kmax.sizes() &&
                  kmin.scalar_type() == kmax.scalar_type() &&
                  (kmin.scalar_type() == torch::kFloat32 || kmin.scalar_type() == torch::kBFloat16),
              "kmin and kmax must be contiguous [H, NB, D] float32 or bfloat16");
  TORCH_CHECK(table.scalar_type() == torch::kInt64 && table.is_contiguous() && table.dim() == 1,
              "table must be a contiguous [nb] int64 tensor");
  const int64_t H = kmin.size(0), NB = kmin.size(1), D = kmin.size(2), nb = table.numel();
  TORCH_CHECK(q.size(1) == D && q.size(0) % H == 0, "q must be [H * G, D]");
  const int64_t G = q.size(0) / H;
  auto out = torch::empty({H, G, nb}, torch::TensorOptions().dtype(torch::kFloat32));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (kmin.scalar_type() == torch::kFloat32) {
    minmax_run<float>(q.data_ptr<float>(), kmin.data_ptr<float>(), kmax.data_ptr<float>(), table.data_ptr<int64_t>(),
                      nb, H, G, D, NB, scale, out.data_ptr<float>());
  } else {
    minmax_run<uint16_t>(q.data_ptr<float>(), reinterpret_cast<const uint16_t*>(kmin.data_ptr<c10::BFloat16>()),
                         reinterpret_cast<const uint16_t*>(kmax.data_ptr<c10::BFloat16>()),
                              table.data_ptr<int64_t>(), nb, H, G, D, NB, scale, out.data_ptr<float>());
  }
  return out;
}

TORCH_LIBRARY(sparsekv_cpu, lib) {
  lib.def("paged_decode(Tensor q, Tensor k, Tensor v, Tensor table, Tensor blocks, int num_tokens, int splits) "
          "-> Tensor[]");
  lib.def("minmax_scores(Tensor q, Tensor kmin, Tensor kmax, Tensor table) -> Tensor");
}

TORCH_LIBRARY_IMPL(sparsekv_cpu, CPU, lib) {
  lib.impl("paged_decode", &paged_decode);
  lib.impl("minmax_scores", &minmax_scores);
}
