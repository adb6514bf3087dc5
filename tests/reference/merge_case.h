// merge_attention (fusedattn/merge.h) on the host: each row's attention over two disjoint key sets
// of fresh scores and values, worked out in float64 and stored in the dtypes the call takes; what
// the merge must give (the float64 attention over both sets); and a plain fp32 merge (the textbook
// formula) for the 2x rule. Some rows see no key of one set (its LSE -inf, its output NaN, which
// the merge must not read), a few no key of either (0 and -inf). The call may cover only the
// middle rows of longer tensors, as ring attention's steps do; the rows around them must stay as
// they were. The CPU and GPU suites run it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "fusedattn/merge.h"
#include "reference/reference.h"
#include "reference/test_util.h"

namespace fusedattn::testing {

struct MergeShape {
  int64_t batch = 1, seqlen = 1, heads = 1, dim = 8;
  bool varlen = false;     // [total, heads, dim] with LSE [heads, total]; batch must be 1
  int64_t rows_around = 0; // rows of the tensors before and after the merged ones (the sequence dim)
  Layout layout = Layout::kBSHD;  // of both outputs (kBHSD: dense only)
};

class MergeCase {
 public:
  static constexpr int kKeysA = 23, kKeysB = 17;
  static constexpr double kScoreStddev = 2.0;

  MergeCase(const MergeShape& shape, DType out_dtype, DType part_dtype, std::mt19937_64& rng) : s_(shape) {
    const int64_t total = s_.seqlen + 2 * s_.rows_around;
    const std::vector<int64_t> out_shape = s_.varlen ? std::vector<int64_t>{total, s_.heads, s_.dim}
                                                     : std::vector<int64_t>{s_.batch, total, s_.heads, s_.dim};
    const std::vector<int64_t> lse_shape = s_.varlen ? std::vector<int64_t>{s_.heads, total}
                                                     : std::vector<int64_t>{s_.batch, s_.heads, total};
    out = HostTensor(out_dtype, out_shape, s_.layout);
    part_out = HostTensor(part_dtype, out_shape, s_.layout);
    lse = HostTensor(DType::kFloat32, lse_shape);
    part_lse = HostTensor(DType::kFloat32, lse_shape);
    const int64_t rows = s_.batch * total * s_.heads;
    std::vector<double> oa(static_cast<size_t>(rows * s_.dim)), ob = oa, la(static_cast<size_t>(rows)), lb = la;
    want_out_.assign(oa.size(), 0.0);
    want_lse_.assign(la.size(), -INFINITY);
    out_merged_.assign(oa.size(), false);
    lse_merged_.assign(la.size(), false);
    std::normal_distribution<double> normal;
    for (int64_t b = 0; b < s_.batch; ++b)
      for (int64_t t = 0; t < total; ++t)
        for (int64_t h = 0; h < s_.heads; ++h) {
          const int64_t r = (b * total + t) * s_.heads + h, o = r * s_.dim, l = lse_index(b, t, h);
          // Which sets the row sees keys of: mostly both; one set alone; neither.
          const bool sees_a = r % 7 != 3 && r % 11 != 4, sees_b = r % 5 != 2 && r % 11 != 4;
          std::vector<double> sum(static_cast<size_t>(s_.dim), 0.0);
          double mass = 0.0;
          const auto attend = [&](int keys, bool sees, double* out_row, double& row_lse) {
            std::vector<double> acc(static_cast<size_t>(s_.dim), 0.0);
            double max = -INFINITY;
            std::vector<double> scores(static_cast<size_t>(keys)), values(static_cast<size_t>(keys * s_.dim));
            for (double& x : scores) x = kScoreStddev * normal(rng);
            for (double& x : values) x = normal(rng);
            if (!sees) {
              for (int64_t d = 0; d < s_.dim; ++d) out_row[d] = NAN;  // no key: whatever it holds
              row_lse = -INFINITY;
              return;
            }
            for (double x : scores) max = std::max(max, x);
            double z = 0.0;
            for (int j = 0; j < keys; ++j) {
              const double p = std::exp(scores[j] - max);
              z += p;
              for (int64_t d = 0; d < s_.dim; ++d) acc[d] += p * values[j * s_.dim + d];
            }
            row_lse = max + std::log(z);
            for (int64_t d = 0; d < s_.dim; ++d) {
              out_row[d] = acc[d] / z;
              sum[d] += acc[d] * std::exp(max);  // the unnormalised sums over both sets
            }
            mass += z * std::exp(max);
          };
          attend(kKeysA, sees_a, oa.data() + o, la[l]);
          attend(kKeysB, sees_b, ob.data() + o, lb[l]);
          if (!inside(t)) {  // untouched by the call: it must keep what it holds
            for (int64_t d = 0; d < s_.dim; ++d) want_out_[o + d] = round_to(out_dtype, oa[o + d]);
            want_lse_[l] = round_to(DType::kFloat32, la[l]);
            continue;
          }
          lse_merged_[l] = true;
          for (int64_t d = 0; d < s_.dim; ++d) out_merged_[o + d] = true;
          if (mass > 0.0) {
            want_lse_[l] = std::log(mass);
            for (int64_t d = 0; d < s_.dim; ++d) want_out_[o + d] = sum[d] / mass;
          }
        }
    out.fill(oa);
    part_out.fill(ob);
    lse.fill(la);
    part_lse.fill(lb);
    plain_merge(out_dtype);
  }

  // The call's arguments over views of the four tensors that view_of gives (host or device
  // copies), narrowed to the merged rows.
  MergeArgs args(const std::function<TensorView(HostTensor&)>& view_of) {
    MergeArgs a;
    a.out = inside_rows(view_of(out), s_.varlen ? 0 : 1);
    a.part_out = inside_rows(view_of(part_out), s_.varlen ? 0 : 1);
    a.lse = inside_rows(view_of(lse), s_.varlen ? 1 : 2);
    a.part_lse = inside_rows(view_of(part_lse), s_.varlen ? 1 : 2);
    return a;
  }

  // Whether out and lse (as the call left them, downloaded into this case's tensors) hold the
  // merge within the 2x rule in the merged rows, and exactly what they held around them.
  ::testing::AssertionResult check() const {
    constexpr double kAtol = 1e-6;
    const auto rule = [&](const char* name, const std::vector<double>& got, const std::vector<double>& plain,
                          const std::vector<double>& want, const std::vector<bool>& merged) {
      std::vector<double> g, p, w;
      for (size_t i = 0; i < got.size(); ++i) {
        if (merged[i]) {
          g.push_back(got[i]), p.push_back(plain[i]), w.push_back(want[i]);
        } else if (!(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))) {
          return ::testing::AssertionFailure() << name << " changed outside the merged rows at " << i << ": "
                                               << want[i] << " -> " << got[i];
        }
      }
      const ::testing::AssertionResult r = obeys_2x_rule(g, p, w, kAtol);
      return r ? ::testing::AssertionSuccess() << name << ": " << r.message()
               : ::testing::AssertionFailure() << name << ": " << r.message();
    };
    const ::testing::AssertionResult o = rule("out", out.to_double(), plain_out_, want_out_, out_merged_);
    if (!o) return o;
    const ::testing::AssertionResult l = rule("lse", lse.to_double(), plain_lse_, want_lse_, lse_merged_);
    if (!l) return l;
    return ::testing::AssertionSuccess() << o.message() << "; " << l.message();
  }

  HostTensor out, lse, part_out, part_lse;

 private:
  bool inside(int64_t t) const { return t >= s_.rows_around && t < s_.rows_around + s_.seqlen; }
  int64_t lse_index(int64_t b, int64_t t, int64_t h) const {
    const int64_t total = s_.seqlen + 2 * s_.rows_around;
    return (b * s_.heads + h) * total + t;  // dense [B, H, total]; varlen [H, total] (b = 0)
  }
  TensorView inside_rows(TensorView v, int dim) const {
    v.data = static_cast<unsigned char*>(v.data) +
             s_.rows_around * v.stride[dim] * static_cast<int64_t>(dtype_size(v.dtype));
    v.shape[dim] = s_.seqlen;
    return v;
  }

  // The textbook merge in fp32 from the stored inputs, a side without keys given weight 0.
  void plain_merge(DType out_dtype) {
    const std::vector<double> oa = out.to_double(), ob = part_out.to_double(), la = lse.to_double(),
                              lb = part_lse.to_double();
    plain_out_ = want_out_;
    plain_lse_ = want_lse_;
    const int64_t total = s_.seqlen + 2 * s_.rows_around;
    for (int64_t b = 0; b < s_.batch; ++b)
      for (int64_t t = s_.rows_around; t < s_.rows_around + s_.seqlen; ++t)
        for (int64_t h = 0; h < s_.heads; ++h) {
          const int64_t o = ((b * total + t) * s_.heads + h) * s_.dim, l = lse_index(b, t, h);
          const float a = static_cast<float>(la[l]), c = static_cast<float>(lb[l]);
          const float merged = std::log(std::exp(a) + std::exp(c));
          const float wa = std::isinf(a) ? 0.0f : std::exp(a - merged), wc = std::isinf(c) ? 0.0f : std::exp(c - merged);
          plain_lse_[l] = merged;
          for (int64_t d = 0; d < s_.dim; ++d) {
            const float x = (wa != 0.0f ? wa * static_cast<float>(oa[o + d]) : 0.0f) +
                            (wc != 0.0f ? wc * static_cast<float>(ob[o + d]) : 0.0f);
            plain_out_[o + d] = round_to(out_dtype, x);
          }
        }
  }

  MergeShape s_;
  std::vector<double> want_out_, want_lse_, plain_out_, plain_lse_;
  std::vector<bool> out_merged_, lse_merged_;  // the positions the call merges (canonical order)
};

}  // namespace fusedattn::testing
