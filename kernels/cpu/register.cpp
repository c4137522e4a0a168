// The operators of the CPU extension, registered once with torch.library as torch.ops.sparsekv_cpu.*.
#include <torch/extension.h>

#include <vector>

std::vector<torch::Tensor> paged_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor table,
                                        torch::Tensor blocks, int64_t num_tokens, int64_t splits);
torch::Tensor minmax_scores(torch::Tensor q, torch::Tensor kmin, torch::Tensor kmax, torch::Tensor table);
std::vector<torch::Tensor> route_topk(torch::Tensor q, torch::Tensor a, torch::Tensor b, torch::Tensor table,
                                      int64_t kind, int64_t top_k, int64_t sink, int64_t local);

TORCH_LIBRARY(sparsekv_cpu, lib) {
  lib.def("paged_decode(Tensor q, Tensor k, Tensor v, Tensor table, Tensor blocks, int num_tokens, int splits) "
          "-> Tensor[]");
  lib.def("minmax_scores(Tensor q, Tensor kmin, Tensor kmax, Tensor table) -> Tensor");
  lib.def("route_topk(Tensor q, Tensor a, Tensor b, Tensor table, int kind, int top_k, int sink, int local) "
          "-> Tensor[]");
}

TORCH_LIBRARY_IMPL(sparsekv_cpu, CPU, lib) {
  lib.impl("paged_decode", &paged_decode);
  lib.impl("minmax_scores", &minmax_scores);
  lib.impl("route_topk", &route_topk);
}
