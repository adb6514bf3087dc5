#include "checked_offsets.h"

#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <mutex>
#include <unordered_map>

#include "torch_views.h"

namespace fusedattn::torch_binding {
namespace {

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// What a passed check was about; all of it must match for the result to stand.
struct CheckedTensor {
  WeakImpl impl;  // expired once the tensor is gone (its address may then be reused)
  int64_t version;
  const void* data;
  int64_t entries;
  int64_t max_seqlen;
  int64_t packed_rows;
  int64_t last;  // check_cu_seqlens's result
};

// A few offsets tensors live at a time (one per batch in flight); dead entries are dropped when
// the table grows past this.
constexpr std::size_t kMaxEntries = 64;

std::mutex table_mutex;
std::unordered_map<const c10::TensorImpl*, CheckedTensor>& table() {
  static std::unordered_map<const c10::TensorImpl*, CheckedTensor> entries;
  return entries;
}

bool still_holds(const CheckedTensor& c, const at::Tensor& cu, int64_t max_seqlen, int64_t packed_rows) {
  return !c.impl.expired() && c.version == static_cast<int64_t>(cu._version()) && c.data == cu.data_ptr() &&
         c.entries == cu.numel() && c.max_seqlen == max_seqlen && c.packed_rows == packed_rows;
}

int64_t checked_rows(const at::Tensor& cu, const TensorView& view, bool keys, int64_t max_seqlen, int64_t packed_rows,
                     void* stream) {
  // Under a CUDA graph capture nothing may wait for the stream, so the offsets are not read: -1,
  // and the library checks them on the device at every replay (Options::check_on_device). Asked
  // only where a read would follow; a remembered result needs none.
  const auto unreadable = [&] { return stream_capturing(view.device, stream); };
  // Inference tensors (torch.inference_mode) have no version counter: checked every call.
  if (cu.is_inference()) return unreadable() ? -1 : check_cu_seqlens(view, keys, max_seqlen, packed_rows, stream);
  const c10::TensorImpl* key = cu.unsafeGetTensorImpl();
  {
    const std::lock_guard<std::mutex> lock(table_mutex);
    const auto it = table().find(key);
    if (it != table().end() && still_holds(it->second, cu, max_seqlen, packed_rows)) return it->second.last;
  }
  if (unreadable()) return -1;
  const int64_t last = check_cu_seqlens(view, keys, max_seqlen, packed_rows, stream);  // throws when bad
  const std::lock_guard<std::mutex> lock(table_mutex);
  auto& entries = table();
  if (entries.size() >= kMaxEntries) {
    for (auto it = entries.begin(); it != entries.end();) it = it->second.impl.expired() ? entries.erase(it) : ++it;
    if (entries.size() >= kMaxEntries) entries.clear();
  }
  entries.insert_or_assign(key, CheckedTensor{WeakImpl(cu.getIntrusivePtr()), static_cast<int64_t>(cu._version()),
                                              cu.data_ptr(), cu.numel(), max_seqlen, packed_rows, last});
  return last;
}

}  // namespace

void set_checked_rows(Options& options, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                      int64_t packed_rows_q, int64_t packed_rows_k) {
  // Offsets of different lengths: the library's own validation names that mismatch.
  if (cu_seqlens_q.numel() != cu_seqlens_k.numel()) return;
  set_checked_rows_q(options, cu_seqlens_q, packed_rows_q);
  options.checked_rows_k = checked_rows(cu_seqlens_k, options.cu_seqlens_k, /*keys=*/true, options.max_seqlen_k,
                                        packed_rows_k, options.stream);
}

void set_checked_rows_q(Options& options, const at::Tensor& cu_seqlens_q, int64_t packed_rows_q) {
  options.checked_rows_q = checked_rows(cu_seqlens_q, options.cu_seqlens_q, /*keys=*/false, options.max_seqlen_q,
                                        packed_rows_q, options.stream);
}

}  // namespace fusedattn::torch_binding
