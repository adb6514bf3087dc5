// Runs one small forward on the CPU backend through an installed fusedattn, and one call the API
// turns down, so that the installed headers, library and its link dependencies all take part.
#include <cmath>
#include <cstdio>
#include <vector>

#include "fusedattn/attention.h"

int main() {
  using namespace fusedattn;
  constexpr int kBatch = 1, kSeq = 16, kHeads = 2, kDim = 8;
  std::vector<float> q(kBatch * kSeq * kHeads * kDim), k(q.size()), v(q.size()), out(q.size());
  std::vector<float> lse(kBatch * kHeads * kSeq);
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = std::sin(0.37f * static_cast<float>(i));
    k[i] = std::cos(0.11f * static_cast<float>(i));
    v[i] = std::sin(0.05f * static_cast<float>(i) + 1.f);
  }
  const auto view = [](std::vector<float>& t) {
    return TensorView::contiguous(t.data(), DType::kFloat32, {kBatch, kSeq, kHeads, kDim});
  };
  ForwardArgs args{view(q), view(k), view(v), view(out),
                   TensorView::contiguous(lse.data(), DType::kFloat32, {kBatch, kHeads, kSeq})};
  args.options.causal = true;
  args.options.backend = Backend::kCPU;
  forward(args);
  for (float x : out)
    if (!std::isfinite(x)) return std::printf("consumer: non-finite output\n"), 1;
  args.out = args.q;  // written over what it reads: validation names it
  try {
    forward(args);
    return std::printf("consumer: an output over q was accepted\n"), 1;
  } catch (const Error& e) {
    if (e.argument() != "out") return std::printf("consumer: wrong argument named: %s\n", e.what()), 1;
  }
  std::printf("consumer: ok (%s, out[0] = %.6f)\n", device_name(Backend::kCPU).c_str(), out[0]);
  return 0;
}
