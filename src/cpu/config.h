// Tile sizes of the CPU backend. A 64 x 64 score tile (16 KiB) plus the Q/K/V/O tiles of a
// head_dim 64 problem fit in L1/L2 together; the compute loops vectorise along the 64-wide rows.
#pragma once

#include "cpu/isa.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

inline constexpr int kBlockQ = 64;  // query rows per task (forward, dQ pass)
// The forward's query rows per task where the launch has tasks to spare (forward.cpp): each K
// and V tile it loads then serves twice the rows.
inline constexpr int kWideBlockQ = 2 * kBlockQ;
inline constexpr int kBlockK = 64;  // keys per inner tile (and per task of the dK/dV pass)

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
