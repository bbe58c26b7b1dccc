#include "tests/build_paths.h"

namespace trainer::test {

const char* trainer_bin() { return BUILD_TRAINER_BIN; }
const char* source_dir() { return BUILD_SOURCE_DIR; }
const char* nvml_standin_file() { return BUILD_NVML_STANDIN_FILE; }
#ifdef BUILD_CUDA_MODULE_FILE
const char* cuda_module_file() { return BUILD_CUDA_MODULE_FILE; }
const char* stand_in_cuda_module_file() { return BUILD_STAND_IN_CUDA_MODULE_FILE; }
#else
const char* cuda_module_file() { return ""; }
const char* stand_in_cuda_module_file() { return ""; }
#endif
#ifdef BUILD_CUDA_EMU_MODULE_FILE
const char* cuda_emu_module_file() { return BUILD_CUDA_EMU_MODULE_FILE; }
#else
const char* cuda_emu_module_file() { return ""; }
#endif

}  // namespace trainer::test
