// The CPU backend's register-blocked tile products (src/cpu/tile_math.h): accumulate_pb (O += P V,
// dQ += dS K) and accumulate_ptb (dV += P^T dO, dK += dS^T Q) take kRowsPerPass output rows at a
// time where their rows see the same keys. Each output element must be the same sum as the plain
// fold's (the same terms in the same order), bit for bit, so that results do not depend on which
// rows share a block; and both must be right (against double).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/tile_math.h"

namespace fusedattn::testing {
namespace {

namespace isa = cpu::FUSEDATTN_CPU_ISA;
using isa::ColRange;

constexpr int kRows = 17;  // two blocks of 6 (AVX2) or four of 4 (AVX-512), then a tail
constexpr int kKeys = 37;
constexpr double kRelTol = 1e-5;

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Element (row, col) of a row-major matrix with `ld` elements per row.
size_t at(int row, int ld, int col = 0) { return static_cast<size_t>(row) * static_cast<size_t>(ld) + static_cast<size_t>(col); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every head dim class: whole blocks of columns, blocks and a vector tail, a tail alone.
class CpuTileMath : public ::testing::TestWithParam<int> {};

TEST_P(CpuTileMath, BlockedPvIsThePlainFoldBitForBit) {
  const int dim = GetParam();
  std::mt19937 rng(1000 + dim);
  const int ldp = kKeys + 3;
  const std::vector<float> p = random_floats(at(kRows, ldp), rng), b = random_floats(at(kKeys, dim), rng);
  const std::vector<float> c0 = random_floats(at(kRows, dim), rng);
  // All rows see the same keys (blocked), then rows whose ranges differ (folded).
  for (const bool cut : {false, true}) {
    std::vector<ColRange> ranges(kRows, ColRange{2, kKeys - 1});
    if (cut)
      for (int r = 0; r < kRows; r += 3) ranges[r] = ColRange{r % 5, kKeys - r % 4};
    std::vector<float> blocked = c0, plain = c0;
    isa::accumulate_pb(p.data(), ldp, ranges.data(), kRows, b.data(), dim, blocked.data());
    for (int r = 0; r < kRows; ++r)
      isa::detail::fold_terms(plain.data() + at(r, dim), dim, [&](auto&& term) {
        for (int j = ranges[r].begin; j < ranges[r].end; ++j) term(p[at(r, ldp, j)], b.data() + at(j, dim));
      });
    EXPECT_TRUE(same_bits(blocked, plain)) << "dim " << dim << (cut ? " cut rows" : "");
    for (int r = 0; r < kRows; ++r)
      for (int d = 0; d < dim; ++d) {
        double want = c0[at(r, dim, d)];
        for (int j = ranges[r].begin; j < ranges[r].end; ++j)
          want += double{p[at(r, ldp, j)]} * b[at(j, dim, d)];
        ASSERT_NEAR(blocked[at(r, dim, d)], want, kRelTol * (1 + std::fabs(want))) << r << "," << d;
      }
  }
}

TEST_P(CpuTileMath, BlockedPtvIsThePlainFoldBitForBit) {
  const int dim = GetParam();
  std::mt19937 rng(2000 + dim);
  const int ldp = kKeys + 3;
  const std::vector<float> p = random_floats(at(kRows, ldp), rng), a = random_floats(at(kRows, dim), rng);
  const std::vector<float> c0 = random_floats(at(kKeys, dim), rng);
  const std::vector<ColRange> ranges(kRows, ColRange{0, kKeys});  // a tile no mask cuts
  std::vector<float> blocked = c0, plain = c0;
  isa::accumulate_ptb(p.data(), ldp, ranges.data(), kRows, a.data(), dim, kKeys, blocked.data());
  for (int j = 0; j < kKeys; ++j)
    isa::detail::fold_terms(plain.data() + at(j, dim), dim, [&](auto&& term) {
      for (int r = 0; r < kRows; ++r) term(p[at(r, ldp, j)], a.data() + at(r, dim));
    });
  EXPECT_TRUE(same_bits(blocked, plain)) << "dim " << dim;
  for (int j = 0; j < kKeys; ++j)
    for (int d = 0; d < dim; ++d) {
      double want = c0[at(j, dim, d)];
      for (int r = 0; r < kRows; ++r) want += double{p[at(r, ldp, j)]} * a[at(r, dim, d)];
      ASSERT_NEAR(blocked[at(j, dim, d)], want, kRelTol * (1 + std::fabs(want))) << j << "," << d;
    }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, CpuTileMath, ::testing::Values(8, 40, 64, 72, 128, 256),
                         [](const auto& info) { return "d" + std::to_string(info.param); });

}  // namespace
}  // namespace fusedattn::testing
