// Where this build put `trainer` and the CUDA modules, and the source tree.
// Only tests/build_paths.cpp is compiled with the paths (tests/CMakeLists.txt),
// so every other test source compiles to the same object in any checkout and
// build directory, and ccache hands it to a fresh clone.
#pragma once

namespace trainer::test {
const char* trainer_bin();
const char* source_dir();
const char* cuda_module_file();           // "" when this build has no CUDA module
const char* stand_in_cuda_module_file();  // "" likewise
const char* cuda_emu_module_file();       // "" when this build has no emulated CUDA module
const char* nvml_standin_file();          // tests/nvml_standin.cpp's library
}  // namespace trainer::test

#define TRAINER_BIN (::trainer::test::trainer_bin())
#define TRAINER_SOURCE_DIR (::trainer::test::source_dir())
#define TRAINER_CUDA_MODULE_FILE (::trainer::test::cuda_module_file())
#define STAND_IN_CUDA_MODULE_FILE (::trainer::test::stand_in_cuda_module_file())
#define TRAINER_CUDA_EMU_MODULE (::trainer::test::cuda_emu_module_file())
#define NVML_STANDIN_FILE (::trainer::test::nvml_standin_file())
