// Weight-only quantised linear layers for the CPU: y = x W^T with W kept as a GGUF file's own integer codes.
//
// Layout (sparsekv/model/quant.py builds it from a GGUF tensor, exactly): W [N, K] in groups of G consecutive
// weights along K, w[n, k] = fma(code[n, k], scale[n, k / G], offset[n, k / G]) in float32;
//   bits 4: codes uint8 [N, K / 2], G = 32; byte j of group g holds element 32 g + j in its low nibble and
//           32 g + 16 + j in its high nibble (GGUF's Q4_0 / Q4_1 order)
//   bits 8: codes int8 [N, K], G = 16 or 32
// scale float32 [N, K / G]; offset float32 [N, K / G], or empty for a format without one (w = code * scale,
// the same value as the fma with 0); K a multiple of 32.
//
// Algorithm (qlinear), per output row n (rows split across threads, one row always one thread's):
//   for each 16-weight chunk c of the row:
//       w = fma(code[c], scale, offset)                       16 lanes, widened exactly from the codes
//       for each of up to kBatch rows m of x: acc[m][c % 4] = fma(w, x[m, 16 c ...], acc[m][c % 4])
//   y[m, n] = hsum((acc[m][0] + acc[m][1]) + (acc[m][2] + acc[m][3]))
// so each code is read and widened once per kBatch tokens, and four accumulators hide the FMA latency. A
// decode step's matmuls are M = 1 (or the batch's B); a prefill chunk's go through qdequant and MKL instead.
// The same bits at any thread count and for any instruction set (simd.h's rules).
//
// qdequant writes W as float32 [N, K] with the same fma.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "simd.h"

namespace {

using skv::V16;
using skv::kLanes;

constexpr int kBatch = 4;           // rows of x sharing one pass over the codes
constexpr int64_t kGrainRows = 16;  // output rows per work item, at least

struct QWeight {
  // pointers
  const uint8_t* codes;  // bits 4: [N, K / 2] packed; bits 8: [N, K] (int8 as bytes)
  const float* scale;    // [N, K / G]
  const float* offset;   // [N, K / G], or nullptr (no offset)
  // sizes
  int64_t N, K;
  int bits, group;
};

// The 32 weights of pair p (chunks 2p, 2p+1) of row n, dequantised.
inline void pair_weights(const QWeight& w, int64_t n, int64_t p, V16& w0, V16& w1) {
  const int64_t ng = w.K / w.group;
  const float* s = w.scale + n * ng;
  const float* o = w.offset == nullptr ? nullptr : w.offset + n * ng;
  V16 c0, c1;
  if (w.bits == 4) {
    skv::load_u4(w.codes + n * (w.K / 2) + p * 16, c0, c1);
  } else {
    const int8_t* q = reinterpret_cast<const int8_t*>(w.codes) + n * w.K + p * 32;
    c0 = skv::load_i8(q), c1 = skv::load_i8(q + kLanes);
  }
  const int64_t g0 = w.group == 32 ? p : 2 * p, g1 = w.group == 32 ? p : 2 * p + 1;   // group 16: one per chunk
  if (w.offset != nullptr) {
    w0 = skv::fma(c0, skv::splat(s[g0]), skv::splat(o[g0])), w1 = skv::fma(c1, skv::splat(s[g1]), skv::splat(o[g1]));
  } else {
    w0 = skv::mul(c0, skv::splat(s[g0])), w1 = skv::mul(c1, skv::splat(s[g1]));
  }
}

template <int M>
void rows(const QWeight& w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t pairs = w.K / 32;
  for (int64_t n = n0; n < n1; ++n) {
    V16 acc[M][4];
    for (int m = 0; m < M; ++m)
      for (int a = 0; a < 4; ++a) acc[m][a] = skv::zero();
    for (int64_t p = 0; p < pairs; ++p) {
      V16 w0, w1;
      pair_weights(w, n, p, w0, w1);
      const int a = static_cast<int>((2 * p) & 3);          // chunks 2p, 2p+1 -> accumulators a, a+1
      for (int m = 0; m < M; ++m) {
        const float* xm = x + m * ldx + p * 32;
        acc[m][a] = skv::fma(w0, skv::load(xm), acc[m][a]);
        acc[m][a + 1] = skv::fma(w1, skv::load(xm + kLanes), acc[m][a + 1]);
      }
    }
    for (int m = 0; m < M; ++m)
      y[m * ldy + n] = skv::hsum(skv::add(skv::add(acc[m][0], acc[m][1]), skv::add(acc[m][2], acc[m][3])));
  }
}

QWeight check(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset, int64_t bits,
              int64_t group) {
  TORCH_CHECK(bits == 4 || bits == 8, "qlinear: bits must be 4 or 8, got ", bits);
  TORCH_CHECK(group == 32 || (bits == 8 && group == 16), "qlinear: group must be 32 (or 16 with 8 bits), got ",
              group);
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous(), "qlinear: codes must be a contiguous [N, K'] tensor");
  TORCH_CHECK(codes.scalar_type() == (bits == 4 ? at::kByte : at::kChar), "qlinear: codes must be ",
              bits == 4 ? "uint8" : "int8", ", got ", codes.scalar_type());
  const int64_t N = codes.size(0), K = bits == 4 ? codes.size(1) * 2 : codes.size(1);
  TORCH_CHECK(K % 32 == 0, "qlinear: K must be a multiple of 32, got ", K);
  const bool has_offset = offset.numel() > 0;
  for (const at::Tensor* t : {&scale, &offset}) {
    if (t == &offset && !has_offset) continue;
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 && t->size(0) == N &&
                    t->size(1) == K / group,
                "qlinear: scale (and a non-empty offset) must be contiguous float32 [N, K / group] = [", N, ", ",
                K / group, "]");
  }
  return {static_cast<const uint8_t*>(codes.data_ptr()), scale.data_ptr<float>(),
          has_offset ? offset.data_ptr<float>() : nullptr, N, K, static_cast<int>(bits), static_cast<int>(group)};
}

}  // namespace

at::Tensor qlinear(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits,
                   int64_t group) {
  const QWeight w = check(codes, scale, offset, bits, group);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == w.K,
              "qlinear: x must be float32 [M, K] with K = ", w.K);
  x = x.contiguous();
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, w.N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, w.N, kGrainRows, [&](int64_t n0, int64_t n1) {
    for (int64_t m = 0; m < M; m += kBatch) {
      const float* xm = xp + m * w.K;
      float* ym = yp + m * w.N;
      switch (std::min<int64_t>(kBatch, M - m)) {
        case 1: rows<1>(w, xm, w.K, ym, w.N, n0, n1); break;
        case 2: rows<2>(w, xm, w.K, ym, w.N, n0, n1); break;
        case 3: rows<3>(w, xm, w.K, ym, w.N, n0, n1); break;
        default: rows<4>(w, xm, w.K, ym, w.N, n0, n1); break;
      }
    }
  });
  return y;
}

at::Tensor qdequant(at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits, int64_t group) {
  const QWeight w = check(codes, scale, offset, bits, group);
  at::Tensor out = at::empty({w.N, w.K}, scale.options());
  float* op = out.data_ptr<float>();
  at::parallel_for(0, w.N, kGrainRows, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t p = 0; p < w.K / 32; ++p) {
        V16 w0, w1;
        pair_weights(w, n, p, w0, w1);
        skv::store(op + n * w.K + p * 32, w0);
        skv::store(op + n * w.K + p * 32 + kLanes, w1);
      }
    }
  });
  return out;
}
