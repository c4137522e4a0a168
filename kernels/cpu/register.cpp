// The operators of the CPU extension, registered once with torch.library as torch.ops.sparsekv_cpu.*.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

std::vector<at::Tensor> paged_decode(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor table,
                                        at::Tensor blocks, int64_t num_tokens, int64_t splits, int64_t min_token);
at::Tensor minmax_scores(at::Tensor q, at::Tensor kmin, at::Tensor kmax, at::Tensor table);
std::vector<at::Tensor> route_topk(at::Tensor q, at::Tensor a, at::Tensor b, at::Tensor table,
                                      int64_t kind, int64_t top_k, int64_t sink, int64_t local);
at::Tensor qlinear(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits,
                   int64_t group);
at::Tensor qdequant(at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t bits, int64_t group);

TORCH_LIBRARY(sparsekv_cpu, lib) {
  lib.def("paged_decode(Tensor q, Tensor k, Tensor v, Tensor table, Tensor blocks, int num_tokens, int splits, "
          "int min_token=0) -> Tensor[]");
  lib.def("minmax_scores(Tensor q, Tensor kmin, Tensor kmax, Tensor table) -> Tensor");
  lib.def("route_topk(Tensor q, Tensor a, Tensor b, Tensor table, int kind, int top_k, int sink, int local) "
          "-> Tensor[]");
  lib.def("qlinear(Tensor x, Tensor codes, Tensor scale, Tensor offset, int bits, int group) -> Tensor");
  lib.def("qdequant(Tensor codes, Tensor scale, Tensor offset, int bits, int group) -> Tensor");
}

TORCH_LIBRARY_IMPL(sparsekv_cpu, CPU, lib) {
  lib.impl("paged_decode", &paged_decode);
  lib.impl("minmax_scores", &minmax_scores);
  lib.impl("route_topk", &route_topk);
  lib.impl("qlinear", &qlinear);
  lib.impl("qdequant", &qdequant);
}
