// Offsets checked on the device (Options::check_on_device, and every variable-length call captured
// into a CUDA graph, src/cuda/offsets_check.cu): valid offsets give the host-checked call's bits;
// each fault the host check names poisons the outputs with the device check's NaN and is raised by
// check_device_errors() in the host check's words; a captured call checks, at each replay, the
// offsets its tensors hold then. The sanitizer set runs the faults (offsets far outside the
// tensors), which the kernels must survive without a read or write outside them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_check.h"
#include "gpu/gpu_paged.h"
#include "gpu/scoped_env.h"

namespace fusedattn::testing {
namespace {

// The bits the device check poisons with: a NaN of each output's type, unlike the tests' own
// poison (every bit set), so that a poisoned output shows the check ran.
uint32_t device_nan_bits(DType dtype) {
  if (dtype == DType::kBFloat16) return 0x7FC0;
  if (dtype == DType::kFloat16) return 0x7E00;
  return 0x7FC00000;
}

bool every_element_is(const HostTensor& t, uint32_t bits) {
  const std::size_t size = dtype_size(t.dtype());
  const auto* bytes = static_cast<const unsigned char*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint32_t v = 0;
    std::memcpy(&v, bytes + i * size, size);
    if (v != bits) return false;
  }
  return true;
}

int32_t* entries(HostTensor& t) { return static_cast<int32_t*>(t.data()); }

// Ragged sequences (one without keys), GQA; max_seqlen above every length, so that a fault in the
// rows is not also one of the maxima.
Problem ragged(int head_dim) {
  Problem p = packed(4, 2, head_dim, {3, 40, 1, 70}, {300, 0, 100, 700});
  p.max_seqlen_bound = 1000;
  return p;
}

// A case on the device, paged where page_size > 0, whose forward runs host- or device-checked.
struct Call {
  std::mt19937_64 rng = fresh_rng();
  HostCase c;
  std::optional<PagedKV> paged;
  std::optional<DeviceCase> dc;
  std::optional<DevicePaged> pages;
  Call(const Problem& pr, DType dtype, int64_t page_size, bool backward = false)
      : c(make_case(pr, dtype, Layout::kBSHD, rng, kDefaultStddev, backward)) {
    if (page_size > 0) paged.emplace(make_paged(c, page_size, rng));
    dc.emplace(c);
    if (paged) pages.emplace(*paged);
  }
  ForwardArgs args(bool on_device) const {
    ForwardArgs a = pages ? pages->args(*dc) : dc->forward_args();
    a.options.check_on_device = on_device;
    return a;
  }
  // The host copies of the offsets and the table, edited by a fault and uploaded again.
  void upload_offsets() {
    dc->cu_q.upload(c.cu_q);
    dc->cu_k.upload(c.cu_k);
    if (pages) pages->table.upload(paged->table);
  }
};

// Both calls on the same values, on the portable kernels and where dispatch sends them (the
// Hopper kernel on an H200): the same bits, and no fault recorded.
TEST(GpuDeviceChecks, ValidOffsetsGiveTheHostCheckedBits) {
  FUSEDATTN_REQUIRE_GPU();
  for (const bool portable_only : {true, false}) {
    std::optional<PortablePathOnly> portable;
    if (portable_only) portable.emplace();
    for (const int d : {64, 128})
      for (const DType dtype : kGpuDtypes)
        for (const int64_t page : {int64_t{0}, kCudaPageRows}) {
          Problem pr = page > 0 ? ragged(d) : with_mask(ragged(d), true, -1, -1);
          if (page > 0) pr.seqused_k = {290, 0, 100, 650};  // entries past the used keys hold -1
          SCOPED_TRACE(pr.str() + " " + dtype_name(dtype) + " page " + std::to_string(page) +
                       (portable_only ? " portable" : " dispatch"));
          Call call(pr, dtype, page);
          FUSEDATTN_RUN_OR_SKIP(call.dc->forward(call.args(false)));
          const auto out = bytes_of(call.c.out), lse = bytes_of(call.c.lse);
          FUSEDATTN_RUN_OR_SKIP(call.dc->forward(call.args(true)));
          EXPECT_TRUE(bytes_of(call.c.out) == out) << "out differs from the host-checked call's";
          EXPECT_TRUE(bytes_of(call.c.lse) == lse) << "lse differs from the host-checked call's";
          EXPECT_NO_THROW(check_device_errors(kGpu));
        }
  }
}

// The backward checks its offsets on the device too, with the host-checked call's bits (in
// deterministic mode: the default sums dQ in whatever order the CTAs come).
TEST(GpuDeviceChecks, BackwardMatchesTheHostCheckedCall) {
  FUSEDATTN_REQUIRE_GPU();
  Call call(with_mask(ragged(64), true, -1, -1), DType::kFloat16, 0, /*backward=*/true);
  FUSEDATTN_RUN_OR_SKIP(call.dc->forward(call.args(false)));
  BackwardArgs a = call.dc->backward_args();
  a.deterministic = true;
  FUSEDATTN_RUN_OR_SKIP(call.dc->backward(a));
  const auto dq = bytes_of(call.c.dq), dk = bytes_of(call.c.dk), dv = bytes_of(call.c.dv);
  a.options.check_on_device = true;
  FUSEDATTN_RUN_OR_SKIP(call.dc->backward(a));
  EXPECT_TRUE(bytes_of(call.c.dq) == dq && bytes_of(call.c.dk) == dk && bytes_of(call.c.dv) == dv);
  EXPECT_NO_THROW(check_device_errors(kGpu));
}

// One fault of each kind the host check names, made in the host copies of a valid case.
struct Fault {
  const char* name;
  int64_t page_size;  // 0: unpaged
  std::function<void(Call&, ForwardArgs&)> make;
};

std::vector<Fault> faults() {
  return {
      {"q offsets start past 0", 0, [](Call& c, ForwardArgs&) { entries(c.c.cu_q)[0] = 1; }},
      {"q offsets decrease", 0, [](Call& c, ForwardArgs&) { entries(c.c.cu_q)[2] = 2; }},
      {"q offsets pass the rows", 0, [](Call& c, ForwardArgs&) { entries(c.c.cu_q)[4] += 1; }},
      {"a query sequence above max_seqlen_q", 0, [](Call&, ForwardArgs& a) { a.options.max_seqlen_q = 39; }},
      {"k offsets decrease", 0, [](Call& c, ForwardArgs&) { entries(c.c.cu_k)[3] = 250; }},
      {"k offsets far past the rows", 0, [](Call& c, ForwardArgs&) { entries(c.c.cu_k)[4] = 1 << 30; }},
      {"a reached page outside the pool", kCudaPageRows,
       [](Call& c, ForwardArgs&) { entries(c.paged->table)[1] = static_cast<int32_t>(c.paged->k.shape()[0]); }},
      {"a negative reached page", kCudaPageRows, [](Call& c, ForwardArgs&) { entries(c.paged->table)[0] = -5; }},
      {"keys past the table's columns", kCudaPageRows,
       [](Call& c, ForwardArgs& a) {
         entries(c.c.cu_k)[4] += static_cast<int32_t>(c.paged->table.shape()[1] * kCudaPageRows);
         a.options.max_seqlen_k = int64_t{1} << 24;
       }},
  };
}

// Runs each fault host-checked (it must throw) and device-checked (it must not): the outputs are
// the device check's NaN, and check_device_errors() throws what the host check threw, once.
void expect_faults_found(DType dtype, bool portable_only) {
  std::optional<PortablePathOnly> portable;
  if (portable_only) portable.emplace();
  for (const Fault& f : faults()) {
    SCOPED_TRACE(std::string(f.name) + " " + dtype_name(dtype) + (portable_only ? " portable" : " dispatch"));
    Call call(ragged(64), dtype, f.page_size);
    ForwardArgs host = call.args(false);
    f.make(call, host);
    call.upload_offsets();
    const std::optional<Error> expected = error_of([&] { forward(host); });
    ForwardArgs device = host;
    device.options.check_on_device = true;
    FUSEDATTN_RUN_OR_SKIP(call.dc->forward(device));
    EXPECT_TRUE(every_element_is(call.c.out, device_nan_bits(dtype))) << "out not poisoned";
    EXPECT_TRUE(every_element_is(call.c.lse, device_nan_bits(DType::kFloat32))) << "lse not poisoned";
    const std::optional<Error> found = error_of([] { check_device_errors(kGpu); });
    if (expected && found) {
      EXPECT_EQ(found->code(), expected->code());
      EXPECT_EQ(found->argument(), expected->argument());
      EXPECT_STREQ(found->what(), expected->what());
    }
    EXPECT_NO_THROW(check_device_errors(kGpu)) << "a fault is raised once";
  }
}

TEST(GpuDeviceChecks, FaultsPoisonTheOutputsAndRaiseAsTheHostCheck) {
  FUSEDATTN_REQUIRE_GPU();
  for (const DType dtype : kGpuDtypes)
    for (const bool portable_only : {true, false}) expect_faults_found(dtype, portable_only);
}

// A fault in the backward's offsets poisons dq, dk and dv.
TEST(GpuDeviceChecks, BackwardFaultPoisonsTheGradients) {
  FUSEDATTN_REQUIRE_GPU();
  Call call(ragged(64), DType::kBFloat16, 0, /*backward=*/true);
  FUSEDATTN_RUN_OR_SKIP(call.dc->forward(call.args(false)));
  entries(call.c.cu_k)[3] = 250;
  call.upload_offsets();
  BackwardArgs a = call.dc->backward_args();
  a.options.check_on_device = true;
  FUSEDATTN_RUN_OR_SKIP(call.dc->backward(a));
  for (const HostTensor* g : {&call.c.dq, &call.c.dk, &call.c.dv})
    EXPECT_TRUE(every_element_is(*g, device_nan_bits(DType::kBFloat16)));
  expect_error([] { check_device_errors(kGpu); }, ErrorCode::kInvalidArgument, "cu_seqlens_k", "non-decreasing");
}

// A forward captured into a CUDA graph (no check_on_device: the capture implies it) replays the
// offsets written into its tensors after the capture: new valid ones as the host-checked call on
// them computes, bad ones poisoned and raised.
void expect_replays_follow_the_offsets(int64_t page_size) {
  SCOPED_TRACE("page " + std::to_string(page_size));
  Call call(ragged(128), DType::kFloat16, page_size);
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  ForwardArgs a = call.args(false);
  a.options.stream = stream;
  // An eager call first sizes the stream's scratch, which cannot grow during a capture.
  FUSEDATTN_RUN_OR_SKIP(run_unless_missing([&] { forward(a); }));
  cuda_check(cudaStreamSynchronize(stream), "eager call");
  const CapturedGraph graph(stream, [&] { forward(a); });
  const auto replay = [&] {
    call.dc->out.poison();
    call.dc->lse.poison();
    graph.replay();
    call.dc->out.download(call.c.out);
    call.dc->lse.download(call.c.lse);
  };
  // New lengths over the same rows: query sequences 40, 3, 70, 1; key sequences 0, 300, 700, 100.
  const std::vector<int32_t> cu_q = {0, 40, 43, 113, 114}, cu_k = {0, 0, 300, 1000, 1100};
  std::memcpy(call.c.cu_q.data(), cu_q.data(), cu_q.size() * sizeof(int32_t));
  std::memcpy(call.c.cu_k.data(), cu_k.data(), cu_k.size() * sizeof(int32_t));
  if (call.paged) {
    // Each sequence's pages as the new key lengths reach them: sequence b reads the pages the
    // old key sequence of the same length had (0 <- 1, 1 <- 0, 2 <- 3, 3 <- 2).
    HostTensor& table = call.paged->table;
    const HostTensor old = table;
    const int64_t cols = table.shape()[1];
    for (const auto& [to, from] : {std::pair{0, 1}, {1, 0}, {2, 3}, {3, 2}})
      std::memcpy(entries(table) + to * cols, static_cast<const int32_t*>(old.data()) + from * cols,
                  cols * sizeof(int32_t));
    // The paged pools hold the old sequences' keys: the new key sequence b has old sequence
    // from's keys, which is what the host-checked call below reads too.
  }
  call.upload_offsets();
  replay();
  const auto out = bytes_of(call.c.out), lse = bytes_of(call.c.lse);
  EXPECT_NO_THROW(check_device_errors(kGpu));
  FUSEDATTN_RUN_OR_SKIP(call.dc->forward(call.args(false)));
  EXPECT_TRUE(bytes_of(call.c.out) == out) << "the replay differs from the host-checked call on the new offsets";
  EXPECT_TRUE(bytes_of(call.c.lse) == lse);
  entries(call.c.cu_q)[2] = 39;  // below entry 1
  call.upload_offsets();
  replay();
  EXPECT_TRUE(every_element_is(call.c.out, device_nan_bits(DType::kFloat16)));
  expect_error([] { check_device_errors(kGpu); }, ErrorCode::kInvalidArgument, "cu_seqlens_q", "entry 2 (39)");
  cudaStreamDestroy(stream);
}

TEST(GpuDeviceChecks, CapturedCallsReplayTheOffsetsTheyFind) {
  FUSEDATTN_REQUIRE_GPU();
  expect_replays_follow_the_offsets(0);
  expect_replays_follow_the_offsets(kCudaPageRows);
}

}  // namespace

// Offsets far outside the tensors, checked on the device, under compute-sanitizer
// (tools/gpu_check.sh filters on *Sanitizer*): the portable and the Hopper forward, paged and not.
TEST(GpuSanitizer, DeviceChecks) {
  FUSEDATTN_REQUIRE_GPU();
  expect_faults_found(DType::kFloat16, /*portable_only=*/true);
  expect_faults_found(DType::kFloat16, /*portable_only=*/false);
}

}  // namespace fusedattn::testing
