// Which instruction set this translation unit's CPU backend code is built for. The hot units
// (forward.cpp, backward.cpp) are compiled twice on x86-64 Linux with GCC (CMakeLists.txt): as
// they are (FUSEDATTN_CPU_ISA = base: 8-wide vectors, simd.h's x86-64-v3 and baseline clones)
// and with FUSEDATTN_CPU_AVX512 (avx512: 16-wide vectors, one AVX-512 register, the hot
// functions built for x86-64-v4). Each build's code, the inline helpers of every header here among
// it, lives in a namespace of its own, so the two builds never share a definition; dispatch.cpp
// picks one per machine.
#pragma once

#if defined(FUSEDATTN_CPU_AVX512)
#define FUSEDATTN_CPU_ISA avx512
#else
#define FUSEDATTN_CPU_ISA base
#endif
