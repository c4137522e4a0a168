// One decoder layer of a decode step (one sequence, one new token) in one call, so that a step's per-layer work
// leaves Python: sparsekv/model/fused.py calls it once per layer with arguments laid out once per engine.
//
//   h = norm_in(x)                                        RMSNorm: x / sqrt(mean(x^2) + eps) * (offset + w)
//   q, k, v = qlinear(h)                                  q [Hq, D], k, v [H, D] (one fused projection or three)
//   q, k = qk_norm(q), qk_norm(k)                         per head, when the layer has one (Gemma 3)
//   q, k = rope(q), rope(k)                               HF's rotate-half with the step's cos, sin [D]
//   q = q * q_gain                                        when the model scales queries (Gemma 3)
//   K[h, block, row], V[h, block, row] = k, v             the store's pool, in its dtype (float32 or bf16, nearest)
//   summaries[s][h, block] extended by the stored row     kmin (min, rounded down) / kmax (max, rounded up)
//   blocks = route_topk(q, kmin, kmax) or as given        route.cpp's minmax routing, or every block (dense)
//   o = paged_decode(q, K, V, table, blocks)              paged_decode.cpp
//   prenorm   x = x + o_proj(o);  x = x + mlp(norm_post(x))
//   sandwich  x = x + norm_post(o_proj(o));  x = x + norm_post_ff(mlp(norm_pre_ff(x)))
//   mlp(h) = down(act(gate h) * up h), act silu or tanh-GELU
//
// Every step is what sparsekv/model/model.py computes (Attention.qkv, Attention.step, DecoderLayer.residual) and
// what BlockStore.write stores (codec.write, then each summary's `extend` and `cast`), in float32, with these
// choices of its own: the norm's sum of squares in float64, one loop order; exp from simd.h. With
// -ffp-contract=off every operation is IEEE, so the result is the same bits for any instruction set and thread
// count (qlinear and paged_decode keep the same promise).
//
// Arguments (checked here; fused.py builds them):
//   x       [1, dim] float32
//   w       norm weights, then linears: [norm_in, norm_post, norm_pre_ff | empty, norm_post_ff | empty,
//           q_norm | empty, k_norm | empty] + for each linear (codes, scale, offset): the qkv parts (1 or 3),
//           o, the gate/up parts (1 or 2), down
//   meta    [Hq, H, D, n_qkv, n_gu, sandwich, act (0 silu, 1 gelu_tanh), then (bits, group, int8) per linear;
//           int8 1: its input quantised to int8 per 32 values first (qlinear_q8), 0: float32 (qlinear)]
//   fmeta   [eps, norm offset, q_gain (0: none)]
//   k, v    the layer's pool [H, NB, bs, D] contiguous, float32 or bfloat16 (written at [h, block, row])
//   sums    the summaries the store keeps, each [H, NB, D] contiguous float32 or bfloat16; kinds: 0 kmin, 1 kmax
//   table   [nb] int64 physical block of each logical block; blocks [H, K] int64 (read when route_kind < 0)
//   route_kind  -1: attend `blocks`; 0: minmax routing over sums of kinds 0 and 1 (top_k, sink, local)
// Returns {x' [1, dim] float32, the routed selection [H, K] int64 (empty when route_kind < 0)}.
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "simd.h"

at::Tensor qlinear(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits,
                   int64_t group);
at::Tensor qlinear_q8(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits,
                      int64_t group);
std::vector<at::Tensor> paged_decode(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor table,
                                        at::Tensor blocks, int64_t num_tokens, int64_t splits, int64_t min_token);
std::vector<at::Tensor> route_topk(at::Tensor q, at::Tensor a, at::Tensor b, at::Tensor table,
                                      int64_t kind, int64_t top_k, int64_t sink, int64_t local);

namespace {

constexpr int kNorms = 6;         // norm slots at the head of `w`
constexpr int kMetaFixed = 7;     // meta entries before the per-linear (bits, group, int8)
constexpr int kMetaLinear = 3;    // meta entries per linear

struct Linear {
  at::Tensor codes, scale, offset;
  int64_t bits, group, int8;
  at::Tensor operator()(const at::Tensor& x) const {
    return int8 ? qlinear_q8(x, codes, scale, offset, bits, group) : qlinear(x, codes, scale, offset, bits, group);
  }
};

// out[i] = x[i] / sqrt(mean(x^2) + eps) * (offset + w[i]); out may alias x.
void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps, float offset) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * (offset + w[i]);
}

// HF's rotate-half, in place on one head: x*cos + rot(x)*sin with rot = (-x[h:], x[:h]).
void rope(float* x, const float* cos, const float* sin, int64_t D) {
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; ++i) {
    const float a = x[i], b = x[i + h];
    x[i] = a * cos[i] + (-b) * sin[i];
    x[i + h] = b * cos[i + h] + a * sin[i + h];
  }
}

// e[i] = exp(min(x[i], 88)) with simd.h's exp (one algorithm on every instruction set).
void exp_clamped(const float* x, float* e, int64_t n) {
  float buf[skv::kLanes];
  for (int64_t i = 0; i < n; i += skv::kLanes) {
    const int m = static_cast<int>(std::min<int64_t>(skv::kLanes, n - i));
    for (int j = 0; j < skv::kLanes; ++j) buf[j] = j < m ? std::min(x[i + j], 88.0f) : 0.0f;
    skv::store(buf, skv::exp(skv::load(buf)));
    std::memcpy(e + i, buf, m * sizeof(float));
  }
}

// gate[i] = act(gate[i]) * up[i]: silu(g) = g / (1 + e^-g); tanh-GELU 0.5 g (1 + tanh(c (g + 0.044715 g^3))),
// tanh(z) = 1 - 2 / (1 + e^{2z}).
void gated(float* gate, const float* up, int64_t n, int64_t act) {
  std::vector<float> t(n), e(n);
  const float c = 0.7978845608028654f;                        // sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    t[i] = act == 0 ? -g : 2.0f * (c * (g + 0.044715f * g * g * g));
  }
  exp_clamped(t.data(), e.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float a = act == 0 ? g / (1.0f + e[i]) : 0.5f * g * (1.0f + (1.0f - 2.0f / (1.0f + e[i])));
    gate[i] = a * up[i];
  }
}

// bfloat16 `x` rounded to nearest (as torch's .to(bfloat16)), then moved one step down (dir < 0) or up (dir > 0)
// where that rounding went the wrong way: summaries.cast's directed rounding.
uint16_t bf16_directed(float x, int dir) {
  const uint16_t y = c10::BFloat16(x).x;
  const float yf = skv::bf16_to_float(y);
  if (dir == 0 || std::isnan(x) || (dir < 0 ? !(yf > x) : !(yf < x))) return y;
  // nextafter(y, -inf) / nextafter(y, +inf) on the bit pattern (y finite here: x is finite and yf overshot it)
  const bool neg = (y & 0x8000) != 0, zero = (y & 0x7fff) == 0;
  if (zero) return dir < 0 ? 0x8001 : 0x0001;
  return (dir < 0) == neg ? static_cast<uint16_t>(y + 1) : static_cast<uint16_t>(y - 1);
}

// min (dir < 0) or max of a stored summary and a new row value, a NaN in either giving NaN (torch.minimum's rule)
inline float extend(float old, float r, int dir) {
  if (std::isnan(old) || std::isnan(r)) return std::numeric_limits<float>::quiet_NaN();
  return dir < 0 ? std::min(old, r) : std::max(old, r);
}

void check_pool(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 4 && t.is_contiguous() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16),
              "decode_layer: ", name, " must be a contiguous float32 or bfloat16 [H, NB, bs, D] pool");
}

}  // namespace

std::vector<at::Tensor> decode_layer(at::Tensor x, std::vector<at::Tensor> w, std::vector<int64_t> meta,
                                     std::vector<double> fmeta, at::Tensor cos, at::Tensor sin, at::Tensor k_pool,
                                     at::Tensor v_pool, std::vector<at::Tensor> sums, std::vector<int64_t> kinds,
                                     at::Tensor table, at::Tensor blocks, int64_t block, int64_t row,
                                     int64_t num_tokens, int64_t min_token, int64_t splits, int64_t route_kind,
                                     int64_t top_k, int64_t sink, int64_t local) {
  TORCH_CHECK(meta.size() >= kMetaFixed && fmeta.size() == 3, "decode_layer: meta and fmeta are malformed");
  const int64_t Hq = meta[0], H = meta[1], D = meta[2], n_qkv = meta[3], n_gu = meta[4], sandwich = meta[5],
                act = meta[6];
  const int64_t n_lin = n_qkv + 1 + n_gu + 1;
  TORCH_CHECK((n_qkv == 1 || n_qkv == 3) && (n_gu == 1 || n_gu == 2) && (act == 0 || act == 1),
              "decode_layer: n_qkv must be 1 or 3, n_gu 1 or 2, act 0 or 1");
  TORCH_CHECK(static_cast<int64_t>(meta.size()) == kMetaFixed + kMetaLinear * n_lin &&
                  static_cast<int64_t>(w.size()) == kNorms + 3 * n_lin,
              "decode_layer: w must hold ", kNorms + 3 * n_lin, " tensors and meta ", kMetaFixed + kMetaLinear * n_lin,
              " entries");
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "decode_layer: x must be contiguous float32 [1, dim]");
  const int64_t dim = x.size(1);
  TORCH_CHECK(cos.numel() == D && sin.numel() == D && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous(),
              "decode_layer: cos and sin must be contiguous float32 [D]");
  check_pool(k_pool, "k");
  check_pool(v_pool, "v");
  TORCH_CHECK(k_pool.sizes() == v_pool.sizes() && k_pool.scalar_type() == v_pool.scalar_type() &&
                  k_pool.size(0) == H && k_pool.size(3) == D && Hq % H == 0,
              "decode_layer: k and v must both be [H, NB, bs, D] with H = ", H, " and D = ", D);
  const int64_t NB = k_pool.size(1), bs = k_pool.size(2);
  TORCH_CHECK(block >= 0 && block < NB && row >= 0 && row < bs, "decode_layer: block or row out of range");
  TORCH_CHECK(sums.size() == kinds.size(), "decode_layer: one kind per summary");
  for (const at::Tensor& s : sums)
    TORCH_CHECK(s.dim() == 3 && s.is_contiguous() && s.size(0) == H && s.size(1) == NB && s.size(2) == D &&
                    (s.scalar_type() == at::kFloat || s.scalar_type() == at::kBFloat16),
                "decode_layer: each summary must be a contiguous float32 or bfloat16 [H, NB, D]");
  for (int i = 0; i < kNorms; ++i)
    TORCH_CHECK(w[i].numel() == 0 || (w[i].scalar_type() == at::kFloat && w[i].is_contiguous()),
                "decode_layer: norm weights must be contiguous float32");
  std::vector<Linear> lin;
  for (int64_t j = 0; j < n_lin; ++j)
    lin.push_back({w[kNorms + 3 * j], w[kNorms + 3 * j + 1], w[kNorms + 3 * j + 2],
                   meta[kMetaFixed + kMetaLinear * j], meta[kMetaFixed + kMetaLinear * j + 1],
                   meta[kMetaFixed + kMetaLinear * j + 2]});
  const float eps = static_cast<float>(fmeta[0]), noff = static_cast<float>(fmeta[1]),
              gain = static_cast<float>(fmeta[2]);
  const float* xp = x.data_ptr<float>();

  // attention input and projections
  at::Tensor h = at::empty({1, dim}, x.options());
  rms_norm(xp, w[0].data_ptr<float>(), h.data_ptr<float>(), dim, eps, noff);
  at::Tensor q = at::empty({Hq, D}, x.options());
  std::vector<float> k(H * D), v(H * D);
  if (n_qkv == 1) {
    const at::Tensor y = lin[0](h);
    TORCH_CHECK(y.size(1) == (Hq + 2 * H) * D, "decode_layer: the qkv projection must give (Hq + 2 H) D outputs");
    const float* yp = y.data_ptr<float>();
    std::memcpy(q.data_ptr<float>(), yp, Hq * D * sizeof(float));
    std::memcpy(k.data(), yp + Hq * D, H * D * sizeof(float));
    std::memcpy(v.data(), yp + (Hq + H) * D, H * D * sizeof(float));
  } else {
    const at::Tensor yq = lin[0](h), yk = lin[1](h), yv = lin[2](h);
    TORCH_CHECK(yq.size(1) == Hq * D && yk.size(1) == H * D && yv.size(1) == H * D,
                "decode_layer: q, k, v projections must give Hq D, H D and H D outputs");
    std::memcpy(q.data_ptr<float>(), yq.data_ptr<float>(), Hq * D * sizeof(float));
    std::memcpy(k.data(), yk.data_ptr<float>(), H * D * sizeof(float));
    std::memcpy(v.data(), yv.data_ptr<float>(), H * D * sizeof(float));
  }
  float* qp = q.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  for (int64_t i = 0; i < Hq; ++i) {
    if (w[4].numel()) rms_norm(qp + i * D, w[4].data_ptr<float>(), qp + i * D, D, eps, noff);
    rope(qp + i * D, cp, sp, D);
    if (gain != 0.0f)
      for (int64_t d = 0; d < D; ++d) qp[i * D + d] = qp[i * D + d] * gain;
  }
  for (int64_t i = 0; i < H; ++i) {
    if (w[5].numel()) rms_norm(k.data() + i * D, w[5].data_ptr<float>(), k.data() + i * D, D, eps, noff);
    rope(k.data() + i * D, cp, sp, D);
  }

  // the store: K and V rows in the pool's dtype, then each summary extended by the row as stored
  const bool bf = k_pool.scalar_type() == at::kBFloat16;
  std::vector<float> stored(H * D);
  for (int64_t i = 0; i < H; ++i) {
    const int64_t at_row = ((i * NB + block) * bs + row) * D;
    for (int64_t d = 0; d < D; ++d) {
      if (bf) {
        const c10::BFloat16 kb(k[i * D + d]), vb(v[i * D + d]);
        k_pool.data_ptr<at::BFloat16>()[at_row + d] = kb;
        v_pool.data_ptr<at::BFloat16>()[at_row + d] = vb;
        stored[i * D + d] = static_cast<float>(kb);
      } else {
        k_pool.data_ptr<float>()[at_row + d] = k[i * D + d];
        v_pool.data_ptr<float>()[at_row + d] = v[i * D + d];
        stored[i * D + d] = k[i * D + d];
      }
    }
  }
  const at::Tensor* kmin = nullptr;
  const at::Tensor* kmax = nullptr;
  for (size_t s = 0; s < sums.size(); ++s) {
    TORCH_CHECK(kinds[s] == 0 || kinds[s] == 1, "decode_layer: summary kinds must be 0 (kmin) or 1 (kmax)");
    (kinds[s] == 0 ? kmin : kmax) = &sums[s];
    const int dir = kinds[s] == 0 ? -1 : 1;
    const bool sbf = sums[s].scalar_type() == at::kBFloat16;
    for (int64_t i = 0; i < H; ++i) {
      const int64_t at_sum = (i * NB + block) * D;
      for (int64_t d = 0; d < D; ++d) {
        const float r = stored[i * D + d];
        if (sbf) {
          uint16_t* p = reinterpret_cast<uint16_t*>(sums[s].data_ptr<at::BFloat16>()) + at_sum + d;
          const float old = skv::bf16_to_float(*p);
          *p = bf16_directed(row == 0 ? r : extend(old, r, dir), dir);
        } else {
          float* p = sums[s].data_ptr<float>() + at_sum + d;
          *p = row == 0 ? r : extend(*p, r, dir);
        }
      }
    }
  }

  // attention over every block or the routed ones
  at::Tensor sel = at::empty({0}, blocks.options());           // returned: the routed selection, else empty
  if (route_kind >= 0) {
    TORCH_CHECK(route_kind == 0 && kmin != nullptr && kmax != nullptr,
                "decode_layer: minmax routing (route_kind 0) needs the kmin and kmax summaries");
    sel = route_topk(q, *kmin, *kmax, table, 0, top_k, sink, local)[0];
  }
  const at::Tensor o = paged_decode(q, k_pool, v_pool, table, route_kind >= 0 ? sel : blocks, num_tokens, splits,
                                    min_token)[0];
  at::Tensor y = lin[n_qkv](o.reshape({1, Hq * D}));
  TORCH_CHECK(y.size(1) == dim, "decode_layer: o_proj must give dim outputs");

  // residual and MLP
  at::Tensor out = at::empty({1, dim}, x.options());
  float* op = out.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (sandwich) rms_norm(yp, w[1].data_ptr<float>(), yp, dim, eps, noff);
  for (int64_t i = 0; i < dim; ++i) op[i] = xp[i] + yp[i];
  rms_norm(op, w[sandwich ? 2 : 1].data_ptr<float>(), h.data_ptr<float>(), dim, eps, noff);
  const int64_t g0 = n_qkv + 1;
  at::Tensor gate, up;
  if (n_gu == 1) {
    const at::Tensor gu = lin[g0](h);
    const int64_t I = gu.size(1) / 2;
    gate = gu.narrow(1, 0, I).contiguous(), up = gu.narrow(1, I, I).contiguous();
  } else {
    gate = lin[g0](h), up = lin[g0 + 1](h);
  }
  TORCH_CHECK(gate.sizes() == up.sizes(), "decode_layer: gate and up must have the same width");
  gated(gate.data_ptr<float>(), up.data_ptr<float>(), gate.size(1), act);
  at::Tensor m = lin[g0 + n_gu](gate);
  TORCH_CHECK(m.size(1) == dim, "decode_layer: down_proj must give dim outputs");
  float* mp = m.data_ptr<float>();
  if (sandwich) rms_norm(mp, w[3].data_ptr<float>(), mp, dim, eps, noff);
  for (int64_t i = 0; i < dim; ++i) op[i] = op[i] + mp[i];
  return {out, sel};
}
