// Paged K/V on the CUDA backend (Options::block_table): the portable forward loads each KV block
// from its page, and on Hopper the Hopper kernel's producer reads each block's page from the table
// for its TMA coordinates. Each case runs packed and paged on the same values (reference/paged.h:
// shuffled pages, spare pages, NaN in every row that holds no key, -1 in unreached entries): the
// paged call must match the float64 reference under the 2x rule and the packed call (on the same
// kernel and tile) to the bit. Then what the CUDA backend rejects, by name, and a table it is told not to check
// (clamped in the kernel: wrong pages, never memory outside k and v; the sanitizer set runs it).
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_check.h"
#include "gpu/gpu_paged.h"
#include "gpu/scoped_env.h"
#include "gpu/sm90_plan.h"

namespace fusedattn::testing {
namespace {

// Which kernels a check runs: the portable forward for both calls, or what dispatch picks (on
// Hopper the Hopper kernel reads the pages, FUSEDATTN_SM90_PAGED).
enum class Path { kPortable, kDispatch };

// The packed call, then the paged one on the same values: the reference and the bits. On the
// dispatch's path the packed call passes seqused_k (every sequence's whole length, if pr has none),
// so that it takes the tiles a paged call takes (loads_unwritten_rows).
SkipReason check_paged_gpu(Problem pr, DType dtype, int64_t page_size, Path path = Path::kPortable) {
  SCOPED_TRACE(pr.str() + " " + dtype_name(dtype) + " page_size " + std::to_string(page_size) +
               (path == Path::kPortable ? " portable" : " dispatch"));
  std::optional<PortablePathOnly> portable;
  if (path == Path::kPortable) portable.emplace();
  if (path == Path::kDispatch && pr.seqused_k.empty()) {
    const auto cu = pr.cu_seqlens_k();
    for (int b = 0; b < pr.batch; ++b) pr.seqused_k.push_back(cu[b + 1] - cu[b]);
  }
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(pr, dtype, Layout::kBSHD, rng, kDefaultStddev, /*with_backward=*/false);
  if (SkipReason skip = check_forward_gpu(c)) return skip;
  const std::vector<unsigned char> packed_out = bytes_of(c.out), packed_lse = bytes_of(c.lse);
  PagedKV paged = make_paged(c, page_size, rng);
  DeviceCase dc(c);
  const DevicePaged pages(paged);
  if (SkipReason skip = dc.forward(pages.args(dc))) return skip;
  Tensors plain = c.values;
  plain_forward(pr, dtype, plain);
  EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), plain.out, c.values.out, atol_for(dtype))) << "paged out";
  EXPECT_TRUE(obeys_2x_rule(c.lse.to_double(), plain.lse, c.values.lse, kLseAtol)) << "paged lse";
  EXPECT_TRUE(bytes_of(c.out) == packed_out) << "paged out differs from the packed call's";
  EXPECT_TRUE(bytes_of(c.lse) == packed_lse) << "paged lse differs from the packed call's";
  return std::nullopt;
}

// Ragged sequences (one without keys, one inside its first page, one ending inside its last),
// GQA, causal and window masks, seqused_k; decodes long enough for the key split (parts written
// to the workspace and combined), one of them a decode step of at most one query per sequence
// (the portable forward reads its grouped heads as rows, decode_groups_as_rows); pages of one
// block and of several; head dims 64 / 128 / 256 (KV blocks of 128, 64 and 64 keys).
TEST(GpuPaged, MatchesReferenceAndPackedCall) {
  FUSEDATTN_REQUIRE_GPU();
  for (const int d : {64, 128, 256}) {
    const Problem ragged = packed(4, 2, d, {3, 40, 1, 70}, {300, 0, 100, 700});
    Problem used = packed(8, 2, d, {1, 1, 4}, {2000, 260, 900});
    used.seqused_k = {1999, 0, 700};
    Problem step = packed(8, 2, d, {1, 0, 1, 1}, {2000, 300, 0, 900});
    step.seqused_k = {1999, 300, 0, 640};
    for (const DType dtype : kGpuDtypes) {
      FUSEDATTN_RUN_OR_SKIP(check_paged_gpu(ragged, dtype, kCudaPageRows));
      FUSEDATTN_RUN_OR_SKIP(check_paged_gpu(with_mask(ragged, true, -1, -1), dtype, 2 * kCudaPageRows));
      FUSEDATTN_RUN_OR_SKIP(check_paged_gpu(with_mask(ragged, false, 90, 10), dtype, kCudaPageRows));
      FUSEDATTN_RUN_OR_SKIP(check_paged_gpu(used, dtype, 2 * kCudaPageRows));
      FUSEDATTN_RUN_OR_SKIP(check_paged_gpu(with_mask(step, true, -1, -1), dtype, kCudaPageRows));
    }
  }
}

// On Hopper the Hopper kernel reads the pages (d64/d128 on their 128-row tiles, d192/d256 on their
// 64-key tiles, whose blocks lie in one page; masked d192/d256 calls take the portable path, as
// with seqused_k): each shape is first asserted to run there, then checked as above, bit for bit
// against the packed call with seqused_k on the same tile.
TEST(GpuPaged, HopperKernelReadsPages) {
  SKIP_UNLESS_HOPPER();
  SkipReason skipped;
  for (const int d : {64, 128, 192, 256}) {
    const Problem ragged = packed(4, 2, d, {3, 40, 1, 200}, {300, 0, 100, 700});
    Problem used = packed(8, 2, d, {1, 1, 4}, {2000, 260, 900});
    used.seqused_k = {1999, 0, 700};
    std::vector<Problem> shapes = {ragged, used};
    if (d <= 128) shapes.push_back(with_mask(ragged, true, -1, -1));
    for (const DType dtype : kGpuDtypes)
      for (const Problem& pr : shapes)
        for (const int64_t page : {kCudaPageRows, 2 * kCudaPageRows}) {
          SCOPED_TRACE(pr.str() + " " + dtype_name(dtype) + " page_size " + std::to_string(page));
          // A shape dispatch sends elsewhere fails; one of a head dim this build has no Hopper
          // forward for is dropped, and the test skips at its end.
          const auto work = expect_sm90_work(pr, dtype, skipped, page);
          if (!work) continue;
          EXPECT_EQ(page % work->shape.block_n, 0) << "a KV block straddles pages";
          FUSEDATTN_RUN_OR_SKIP(check_paged_gpu(pr, dtype, page, Path::kDispatch));
        }
  }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// FUSEDATTN_SM90_PAGED=0 sends paged calls to the portable forward (A/B measurements rely on the
// switch): dispatch picks the Hopper forward for the paged call without the switch and the portable
// one with it; and the call on the dispatch's path (the Hopper forward allowed, no
// FUSEDATTN_DISABLE_SM90) under the switch matches the reference and, to the bit, the same call on
// the portable path.
TEST(GpuPaged, SwitchSendsPagedCallsToThePortableForward) {
  SKIP_UNLESS_HOPPER();
  const Problem pr = packed(4, 2, 128, {3, 40}, {300, 700});
  constexpr DType kDtype = DType::kFloat16;
  {
    const ScopedEnv unset("FUSEDATTN_SM90_PAGED", "");  // empty reads as unset, in case the run set it
    SkipReason skipped;
    const bool on_hopper_forward = expect_sm90_work(pr, kDtype, skipped, kCudaPageRows).has_value();
    FUSEDATTN_RUN_OR_SKIP(skipped);
    ASSERT_TRUE(on_hopper_forward) << "without the switch the paged call runs on the Hopper forward";
  }
  const ScopedEnv off("FUSEDATTN_SM90_PAGED", "0");
  ASSERT_EQ(planned_forward_arch(pr, kDtype, kCudaPageRows), "sm80")
      << "FUSEDATTN_SM90_PAGED=0 must send the paged call to the portable forward";
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(pr, kDtype, Layout::kBSHD, rng, kDefaultStddev, /*with_backward=*/false);
  Tensors ref = c.values, plain = c.values;
  reference_forward(pr, ref);
  plain_forward(pr, kDtype, plain);
  PagedKV paged = make_paged(c, kCudaPageRows, rng);
  DeviceCase dc(c);
  const DevicePaged pages(paged);
  FUSEDATTN_RUN_OR_SKIP(dc.forward(pages.args(dc)));  // the dispatch's path
  EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), plain.out, ref.out, atol_for(kDtype))) << "paged out";
  EXPECT_TRUE(obeys_2x_rule(c.lse.to_double(), plain.lse, ref.lse, kLseAtol)) << "paged lse";
  const std::vector<unsigned char> out = bytes_of(c.out), lse = bytes_of(c.lse);
  {
    const PortablePathOnly portable;
    FUSEDATTN_RUN_OR_SKIP(dc.forward(pages.args(dc)));
  }
  EXPECT_TRUE(bytes_of(c.out) == out) << "out under the switch differs from the portable path's";
  EXPECT_TRUE(bytes_of(c.lse) == lse) << "lse under the switch differs from the portable path's";
}

// A small paged case on the device, for the rejections.
struct PagedCall {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(packed(2, 2, 64, {2, 3}, {300, 9}), DType::kFloat16, Layout::kBSHD, rng, kDefaultStddev,
                         /*with_backward=*/false);
  PagedKV paged;
  explicit PagedCall(int64_t page_size) : paged(make_paged(c, page_size, rng)) {}
};

TEST(GpuPaged, RejectsWhatTheKernelsCannotReadByName) {
  FUSEDATTN_REQUIRE_GPU();
  {
    PagedCall call(kCudaPageRows / 2);  // pages shorter than the kernels' KV blocks can be
    DeviceCase dc(call.c);
    const DevicePaged pages(call.paged);
    expect_error([&] { forward(pages.args(dc)); }, ErrorCode::kUnsupported, "k", "multiple of 128 rows");
  }
  {
    PagedCall call(kCudaPageRows);  // sequence 0's second page (keys 128-255) names no page
    static_cast<int32_t*>(call.paged.table.data())[1] = static_cast<int32_t>(call.paged.k.shape()[0]);
    DeviceCase dc(call.c);
    const DevicePaged pages(call.paged);
    expect_error([&] { forward(pages.args(dc)); }, ErrorCode::kInvalidArgument, "block_table", "entry [0, 1]");
  }
}

// The caller vouches for the offsets (checked_rows_q/k), so nothing reads the table on the host:
// reached entries out of range on both sides are clamped into the pages. The outputs are
// whatever those pages give; what is checked is that the call runs and, under compute-sanitizer
// (GpuSanitizer.PagedKVClampsUncheckedEntries), reads nothing outside k and v.
void run_unchecked_table() {
  PagedCall call(kCudaPageRows);
  auto* entries = static_cast<int32_t*>(call.paged.table.data());
  entries[0] = -7;       // sequence 0, keys 0-127
  entries[2] = 1 << 20;  // sequence 0, keys 256-299
  DeviceCase dc(call.c);
  const DevicePaged pages(call.paged);
  ForwardArgs a = pages.args(dc);
  a.options.checked_rows_q = call.c.problem.total_q();
  a.options.checked_rows_k = call.c.problem.total_k();
  FUSEDATTN_RUN_OR_SKIP(dc.forward(a));
}

TEST(GpuPaged, UncheckedTableEntriesAreClamped) {
  FUSEDATTN_REQUIRE_GPU();
  run_unchecked_table();
}

}  // namespace

// The paged loads under compute-sanitizer (tools/gpu_check.sh filters on *Sanitizer*): a ragged
// case with the key split on the portable forward and (on Hopper) on the Hopper kernel at d64 and
// d256, and the clamped table.
TEST(GpuSanitizer, PagedKV) {
  FUSEDATTN_REQUIRE_GPU();
  Problem used = packed(4, 2, 64, {1, 3, 2}, {2000, 130, 0});
  used.seqused_k = {1900, 130, 0};
  FUSEDATTN_RUN_OR_SKIP(check_paged_gpu(with_mask(used, true, -1, -1), DType::kFloat16, kCudaPageRows));
  FUSEDATTN_RUN_OR_SKIP(check_paged_gpu(used, DType::kBFloat16, kCudaPageRows));
  FUSEDATTN_RUN_OR_SKIP(check_paged_gpu(used, DType::kFloat16, kCudaPageRows, Path::kDispatch));
  FUSEDATTN_RUN_OR_SKIP(
      check_paged_gpu(packed(4, 2, 256, {5, 70}, {300, 129}), DType::kFloat16, kCudaPageRows, Path::kDispatch));
  run_unchecked_table();
}

}  // namespace fusedattn::testing
