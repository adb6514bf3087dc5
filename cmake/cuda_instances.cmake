# The CUDA backend: host-side glue plus one kernel instance per translation unit.
# Instance files live in src/cuda/instances/ (written by tools/gen_instances.py); this file picks
# the ones the options ask for and writes instance_table.inc, an X-macro list of exactly those,
# from which src/cuda/dispatch.cu builds its table. A request no compiled instance serves gets a
# clear kUnsupported error at run time.

set(_inst_dir ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/instances)
set(_table "")
set(_sm80_sources "")
set(_sm90_sources "")

foreach(dt IN LISTS FUSEDATTN_DTYPES)
  foreach(hd IN LISTS FUSEDATTN_HEAD_DIMS)
    foreach(mask IN LISTS FUSEDATTN_MASKS)
      foreach(dir fwd bwd)
        set(f ${_inst_dir}/sm80_${dir}_${dt}_d${hd}_${mask}.cu)
        if(EXISTS ${f})
          list(APPEND _sm80_sources ${f})
          string(APPEND _table "FUSEDATTN_INSTANCE(sm80, ${dir}, ${dt}, ${hd}, ${mask})\n")
        endif()
      endforeach()
      list(FIND FUSEDATTN_SM90_HEAD_DIMS ${hd} _is90)
      set(f ${_inst_dir}/sm90_fwd_${dt}_d${hd}_${mask}.cu)
      if(FUSEDATTN_SM90 AND _is90 GREATER -1 AND EXISTS ${f})
        list(APPEND _sm90_sources ${f})
        # Its clustered and decode kernels (fwd_launch.cuh declares them), one translation unit each.
        file(GLOB _own_units ${_inst_dir}/sm90_fwd_${dt}_d${hd}_${mask}_pair_n*.cu
          ${_inst_dir}/sm90_fwd_${dt}_d${hd}_${mask}_quads_n*.cu
          ${_inst_dir}/sm90_fwd_${dt}_d${hd}_${mask}_octets_n*.cu
          ${_inst_dir}/sm90_fwd_${dt}_d${hd}_${mask}_decode_n*.cu)
        list(APPEND _sm90_sources ${_own_units})
        string(APPEND _table "FUSEDATTN_INSTANCE(sm90, fwd, ${dt}, ${hd}, ${mask})\n")
      endif()
      set(f ${_inst_dir}/sm90_bwd_${dt}_d${hd}_${mask}.cu)
      if(FUSEDATTN_SM90 AND _is90 GREATER -1 AND EXISTS ${f})
        list(APPEND _sm90_sources ${f})
        string(APPEND _table "FUSEDATTN_INSTANCE(sm90, bwd, ${dt}, ${hd}, ${mask})\n")
      endif()
    endforeach()
  endforeach()
endforeach()

set(_gen_dir ${CMAKE_CURRENT_BINARY_DIR}/generated)
file(CONFIGURE OUTPUT ${_gen_dir}/instance_table.inc CONTENT "${_table}")

set(_cuda_flags -Xptxas=-v --expt-relaxed-constexpr -lineinfo)
set(_sm80_gencode "")
# Each architecture compiles from its own PTX level, so sm_90 code may use the sm_90-only
# instructions the kernels select with __CUDA_ARCH__ (the vector dQ reductions of the backward).
foreach(a IN LISTS FUSEDATTN_SM80_ARCHS)
  list(APPEND _sm80_gencode -gencode=arch=compute_${a},code=sm_${a})
endforeach()
# Plus the PTX of the highest one, which the driver compiles at load time for GPUs newer than every
# listed architecture (e.g. Blackwell) instead of failing with "no kernel image". On a Hopper GPU a
# build with FUSEDATTN_SM80_ARCHS=80 runs this PTX, i.e. the code paths an A100 takes (scalar dQ
# reductions): that is how the GPU tests cover them without an A100.
set(_sm80_archs_sorted ${FUSEDATTN_SM80_ARCHS})
list(SORT _sm80_archs_sorted COMPARE NATURAL)
list(GET _sm80_archs_sorted -1 _sm80_ptx_arch)
list(APPEND _sm80_gencode -gencode=arch=compute_${_sm80_ptx_arch},code=compute_${_sm80_ptx_arch})

# Kernels built from sm80 instructions, compiled for every architecture in FUSEDATTN_SM80_ARCHS.
# Non-instance CUDA sources (host glue, small helper kernels) are picked up by folder.
file(GLOB _glue CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/*.cu ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm80/*.cu)
file(GLOB _sm90_glue CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm90/*.cu)
add_library(fusedattn_cuda_sm80 OBJECT ${_sm80_sources} ${_glue})
set_target_properties(fusedattn_cuda_sm80 PROPERTIES CUDA_ARCHITECTURES OFF)
target_compile_options(fusedattn_cuda_sm80 PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${_cuda_flags} ${_sm80_gencode}>)
target_include_directories(fusedattn_cuda_sm80 PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include
  ${CMAKE_CURRENT_SOURCE_DIR}/src ${_gen_dir})
target_compile_definitions(fusedattn_cuda_sm80 PRIVATE $<$<BOOL:${FUSEDATTN_SM90}>:FUSEDATTN_HAVE_SM90=1>
  # Which architecture's PTX is embedded: SASS below it that is never JIT-compiled may leave out
  # rows it cannot run (src/cuda/sm80/bwd_kernel.cuh).
  FUSEDATTN_SM80_PTX_ARCH=${_sm80_ptx_arch})
# The objects go into the library itself (not a link to the object library, which an installed
# package would have to export too: CMakeLists.txt's install).
target_sources(fusedattn PRIVATE $<TARGET_OBJECTS:fusedattn_cuda_sm80>)

# Hopper-only kernels (wgmma, setmaxnreg) need the arch-specific sm_90a target.
if(FUSEDATTN_SM90 AND _sm90_sources)
  add_library(fusedattn_cuda_sm90 OBJECT ${_sm90_sources} ${_sm90_glue})
  set_target_properties(fusedattn_cuda_sm90 PROPERTIES CUDA_ARCHITECTURES OFF)
  target_compile_options(fusedattn_cuda_sm90 PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${_cuda_flags} -gencode=arch=compute_90a,code=sm_90a>)
  target_include_directories(fusedattn_cuda_sm90 PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include
    ${CMAKE_CURRENT_SOURCE_DIR}/src ${_gen_dir})
  target_sources(fusedattn PRIVATE $<TARGET_OBJECTS:fusedattn_cuda_sm90>)
  target_link_libraries(fusedattn PRIVATE CUDA::cuda_driver)
endif()
target_link_libraries(fusedattn PRIVATE CUDA::cudart_static)
target_compile_definitions(fusedattn PRIVATE FUSEDATTN_WITH_CUDA=1)
