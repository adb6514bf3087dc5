// A paged case's pages and table on the device (reference/paged.h), for the GPU tests that call
// the forward through Options::block_table.
#pragma once

#include "gpu/gpu_util.h"
#include "reference/paged.h"

namespace fusedattn::testing {

// The pages of a case on the device, and the case's forward through them.
struct DevicePaged {
  PagedKV& host;
  DeviceTensor k, v, table;
  explicit DevicePaged(PagedKV& paged) : host(paged), k(paged.k), v(paged.v), table(paged.table) {}
  ForwardArgs args(const DeviceCase& dc) const {
    ForwardArgs a = dc.forward_args();
    a.k = k.view(host.k);
    a.v = v.view(host.v);
    a.options.block_table = table.view(host.table);
    return a;
  }
};

}  // namespace fusedattn::testing
