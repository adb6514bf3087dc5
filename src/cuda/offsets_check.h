// The device check of a variable-length call's offsets and paged table (FwdParams::
// offsets_on_device): run on the call's stream after its attention kernels, so it never waits for
// the host. A fault is recorded per device (take_offsets_fault) and the call's outputs are
// poisoned with NaN, so a wrong answer is never silent; seq_info() (params.h) has already kept
// the kernels inside the tensors whatever the offsets held.
#pragma once

#include "cuda/offsets_fault.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda {

// After a forward: out and lse poisoned on a fault.
void check_offsets_on_device(const FwdParams& p);
// After a backward: dq, dk and dv poisoned on a fault.
void check_offsets_on_device(const BwdParams& p);

// The current device's recorded fault, if any, which it then forgets. Call after the device has
// finished the calls in question (the copies wait for the legacy stream only).
bool take_offsets_fault(OffsetsFault& fault);

}  // namespace fusedattn::cuda
