// The CPU forward's transposed copy of K (src/cpu/transposed_rows.h): its storage is kept by the
// calling thread from one call to the next and never zeroed, so a call must not see what an
// earlier one left there, and two copies alive at once on one thread must not share it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/cpu_check.h"
#include "cpu/config.h"
#include "cpu/copy_storage.h"

namespace fusedattn::testing {
namespace {

using cpu::FUSEDATTN_CPU_ISA::CopyStorage;

TEST(CpuKeyCopy, StorageIsKeptForTheNextCopyOnTheSameThread) {
  const float* first = nullptr;
  {
    const CopyStorage a(1000);
    first = a.data();
  }
  const CopyStorage b(600);  // no larger: the kept block serves it
  EXPECT_EQ(b.data(), first);
}

TEST(CpuKeyCopy, TwoCopiesAtOnceOnOneThreadHaveStorageOfTheirOwn) {
  CopyStorage a(256);
  const CopyStorage b(256);
  EXPECT_NE(a.data(), b.data());
  std::fill(a.data(), a.data() + 256, 1.f);  // both whole: writing one leaves the other alone
  std::fill(b.data(), b.data() + 256, 2.f);
  EXPECT_EQ(a.data()[255], 1.f);
}

// A forward whose keys are all NaN fills the kept storage with NaN; the next forwards, laid out
// over it differently (other key lengths, none a multiple of the score product's column passes),
// must match the reference: no score they use comes from an earlier call's floats.
TEST(CpuKeyCopy, ACallAfterNanKeysSeesNoneOfThem) {
  for (const DType dtype : kCpuDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    {
      // Several query blocks per head read each key tile, so the forward makes the copy.
      const Problem p = dense(1, 2, 2, 3 * cpu::FUSEDATTN_CPU_ISA::kBlockQ, 200, 64);
      std::mt19937_64 rng = fresh_rng();
      HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
      std::fill(c.values.k.begin(), c.values.k.end(), std::numeric_limits<double>::quiet_NaN());
      refill_inputs(c);
      // A finite start, not the NaN poison: the NaN outputs must be written.
      c.out.fill(std::vector<double>(c.out.to_double().size(), 7.0));
      forward(forward_args(c));
      for (const double x : c.out.to_double()) ASSERT_TRUE(std::isnan(x));
    }
    check_forward(dense(1, 2, 1, 2 * cpu::FUSEDATTN_CPU_ISA::kBlockQ + 5, 97, 64), dtype);
    check_forward(with_mask(dense(2, 2, 2, 150, 41, 32), true, -1, -1), dtype);
  }
}

}  // namespace
}  // namespace fusedattn::testing
