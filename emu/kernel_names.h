// A kernel's readable name from its address, for the emulator's messages:
// "trainer::cuda::rope_kernel<float>". The module's kernels sit in anonymous
// namespaces, so dladdr (the dynamic symbol table) rarely knows them; the
// file's full symbol table (.symtab, read once per file) does, unless the
// file was stripped: then "kernel at 0x...".
#pragma once

#include <string>

namespace trainer::emu {

// Demangled, without the return type, parameter list and "(anonymous
// namespace)::"; cached per address (thread-safe).
std::string kernel_name(const void* kernel);

}  // namespace trainer::emu
