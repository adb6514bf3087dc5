// Paged K/V on the CPU backend (Options::block_table): each case runs packed and paged on the
// same values (reference/paged.h: shuffled pages, spare pages, NaN in every row that holds no
// key, unreached table entries -1). The paged call must match the float64 reference (fp32
// tolerance or the 2x rule) and the packed call to the bit, since only where the rows are read
// from changes. Then every malformed table or paged tensor is rejected by name.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_check.h"
#include "reference/paged.h"

namespace fusedattn::testing {
namespace {

void check_paged(const Problem& pr, DType dtype, int64_t page_size) {
  SCOPED_TRACE(pr.str() + " " + dtype_name(dtype) + " page_size " + std::to_string(page_size));
  HostCase c = check_forward(pr, dtype);  // the packed call, against the reference
  const std::vector<unsigned char> packed_out = bytes_of(c.out), packed_lse = bytes_of(c.lse);
  std::mt19937_64 rng = fresh_rng();
  PagedKV paged = make_paged(c, page_size, rng);
  c.out.poison();
  c.lse.poison();
  forward(paged_forward_args(c, paged));
  Tensors plain = c.values;
  if (dtype != DType::kFloat32) plain_forward(pr, dtype, plain);
  const std::string name = case_name(c) + " paged";
  expect_matches("out", dtype, c.out.to_double(), c.values.out, plain.out, kFp32OutAtol, kFp32OutRtol,
                 atol_for(dtype), name);
  expect_matches("lse", dtype, c.lse.to_double(), c.values.lse, plain.lse, kFp32LseAtol, kFp32LseRtol, kLseAtol,
                 name);
  EXPECT_TRUE(bytes_of(c.out) == packed_out) << "paged out differs from the packed call's";
  EXPECT_TRUE(bytes_of(c.lse) == packed_lse) << "paged lse differs from the packed call's";
}

// Ragged sequences (one without keys, one shorter than a page, one of several pages ending
// inside its last), GQA, causal and sliding-window masks, seqused_k, decode steps, page sizes from
// one row to more than any sequence.
TEST(CpuPaged, MatchesReferenceAndPackedCall) {
  const Problem ragged = packed(4, 2, 64, {3, 40, 1, 70}, {300, 0, 5, 129});
  Problem used = packed(2, 1, 40, {1, 1, 4}, {200, 64, 90});
  used.seqused_k = {150, 64, 0};
  // A decode step (one query row each): src/cpu/decode.cpp reads the pages key by key.
  Problem decode = packed(4, 2, 64, {1, 1, 0, 1}, {300, 0, 5, 1500});
  decode.seqused_k = {300, 0, 5, 1200};
  for (const DType dtype : kCpuDtypes) {
    for (const int64_t page_size : {1, 16, 256}) check_paged(decode, dtype, page_size);
    for (const int64_t page_size : {1, 7, 64, 512}) check_paged(ragged, dtype, page_size);
    check_paged(with_mask(ragged, true, -1, -1), dtype, 16);
    check_paged(with_mask(ragged, false, 20, 3), dtype, 32);
    check_paged(used, dtype, 16);
  }
}

// The pages and the table of a small case, then one defect at a time.
struct PagedCall {
  HostCase c;
  PagedKV paged;
  ForwardArgs args;
  PagedCall() : c(make_case(packed(2, 2, 32, {2, 3}, {40, 9}), DType::kFloat32, Layout::kBSHD, rng())), paged(make(c)) {
    args = paged_forward_args(c, paged);
  }
  static std::mt19937_64& rng() {
    static std::mt19937_64 r = fresh_rng();
    return r;
  }
  static PagedKV make(const HostCase& c) { return make_paged(c, 16, rng()); }
  int32_t* table() { return static_cast<int32_t*>(paged.table.data()); }
};

void expect_paged_error(const ForwardArgs& a, ErrorCode code, const std::string& argument, const std::string& mentions) {
  expect_error([&] { forward(a); }, code, argument, mentions);
}

TEST(CpuPaged, RejectsBadTablesByName) {
  {
    PagedCall call;  // sequence 0's third page (keys 32-39) names no page of k
    call.table()[2] = static_cast<int32_t>(call.paged.k.shape()[0]);
    expect_paged_error(call.args, ErrorCode::kInvalidArgument, "block_table", "entry [0, 2]");
  }
  {
    PagedCall call;
    call.table()[3] = -5;  // sequence 1 (9 keys) reaches only its first column: column 0 of row 1
    call.table()[call.paged.table.shape()[1]] = -5;
    expect_paged_error(call.args, ErrorCode::kInvalidArgument, "block_table", "entry [1, 0] is -5");
  }
  {
    PagedCall call;  // too few columns for sequence 0's 40 keys in pages of 16
    HostTensor narrow(DType::kInt32, {2, 2});
    narrow.fill({0, 1, 2, 3});
    call.args.options.block_table = narrow.view();
    expect_paged_error(call.args, ErrorCode::kShapeMismatch, "block_table", "need 3 pages");
  }
  {
    PagedCall call;
    HostTensor wrong_batch(DType::kInt32, {3, 4});
    wrong_batch.fill(std::vector<double>(12, 0));
    call.args.options.block_table = wrong_batch.view();
    expect_paged_error(call.args, ErrorCode::kShapeMismatch, "block_table", "[2, max_pages_per_seq]");
  }
  {
    PagedCall call;
    HostTensor floats(DType::kFloat32, {2, 4});
    floats.fill(std::vector<double>(8, 0));
    call.args.options.block_table = floats.view();
    expect_paged_error(call.args, ErrorCode::kDtypeMismatch, "block_table", "int32");
  }
  {
    PagedCall call;  // the entries of a row must be contiguous
    call.args.options.block_table.stride[1] = 2;
    expect_paged_error(call.args, ErrorCode::kLayout, "block_table", "contiguous");
  }
}

TEST(CpuPaged, RejectsBadPagedTensorsAndCallsByName) {
  {
    PagedCall call;  // k given as packed rows while a table pages it
    call.args.k = call.c.k.view();
    expect_paged_error(call.args, ErrorCode::kShapeMismatch, "k", "[num_pages, page_size, heads, head_dim]");
  }
  {
    PagedCall call;  // pages of no rows
    call.args.k.shape[1] = 0;
    call.args.v.shape[1] = 0;
    expect_paged_error(call.args, ErrorCode::kShapeMismatch, "k", "at least one page");
  }
  {
    PagedCall call;  // a dense call
    HostCase dense_case = make_case(dense(2, 2, 2, 4, 40, 32), DType::kFloat32, Layout::kBSHD, PagedCall::rng());
    ForwardArgs a = forward_args(dense_case);
    a.k = call.paged.k.view();
    a.v = call.paged.v.view();
    a.options.block_table = call.paged.table.view();
    expect_paged_error(a, ErrorCode::kInvalidArgument, "block_table", "variable-length");
  }
  {
    PagedCall call;  // the backward
    forward(call.args);
    BackwardArgs b = backward_args_of(call.args);
    HostTensor dout(DType::kFloat32, q_shape(call.c.problem)), dq = dout;
    dout.fill(std::vector<double>(dout.numel(), 1.0));
    b.dout = dout.view();
    b.dq = dq.view();
    b.dk = call.paged.k.view();
    b.dv = call.paged.v.view();
    expect_error([&] { backward(b); }, ErrorCode::kUnsupported, "block_table", "forward only");
  }
}

}  // namespace
}  // namespace fusedattn::testing
