#include "emu/kernel_names.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace trainer::emu {
namespace {

// Function symbols of one ELF file by their value (the address relative to
// the file's load base for a shared object or PIE).
using SymbolMap = std::unordered_map<uintptr_t, std::string>;

struct MappedFile {
  const unsigned char* data = nullptr;
  size_t size = 0;
  ~MappedFile() {
    if (data) ::munmap(const_cast<unsigned char*>(data), size);
  }
};

bool map_file(const char* path, MappedFile& f) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st{};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    void* p = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
      f.data = static_cast<const unsigned char*>(p);
      f.size = size_t(st.st_size);
    }
  }
  ::close(fd);
  return f.data != nullptr;
}

void add_symbols(const MappedFile& f, const Elf64_Shdr& symtab, const Elf64_Shdr& strtab, SymbolMap& out) {
  if (symtab.sh_offset + symtab.sh_size > f.size || strtab.sh_offset + strtab.sh_size > f.size) return;
  const auto* syms = reinterpret_cast<const Elf64_Sym*>(f.data + symtab.sh_offset);
  const char* names = reinterpret_cast<const char*>(f.data + strtab.sh_offset);
  for (size_t i = 0; i < symtab.sh_size / sizeof(Elf64_Sym); ++i) {
    if (ELF64_ST_TYPE(syms[i].st_info) != STT_FUNC || syms[i].st_value == 0) continue;
    if (syms[i].st_name >= strtab.sh_size) continue;
    out.emplace(uintptr_t(syms[i].st_value), names + syms[i].st_name);
  }
}

SymbolMap read_symbols(const char* path) {
  SymbolMap out;
  MappedFile f;
  if (!map_file(path, f) || f.size < sizeof(Elf64_Ehdr)) return out;
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(f.data);
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64) return out;
  if (eh->e_shoff + size_t(eh->e_shnum) * sizeof(Elf64_Shdr) > f.size) return out;
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(f.data + eh->e_shoff);
  for (int i = 0; i < eh->e_shnum; ++i)
    if (sh[i].sh_type == SHT_SYMTAB && sh[i].sh_link < eh->e_shnum) add_symbols(f, sh[i], sh[sh[i].sh_link], out);
  return out;
}

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(mangled);
}

// "void ns::(anonymous namespace)::k<float>(float*, int)" -> "ns::k<float>".
std::string shorten(std::string name) {
  if (!name.empty() && name.back() == ')') {
    int depth = 0;
    for (size_t i = name.size(); i-- > 0;) {
      depth += name[i] == ')' ? 1 : name[i] == '(' ? -1 : 0;
      if (depth == 0) {
        name.resize(i);
        break;
      }
    }
  }
  for (size_t at; (at = name.find("(anonymous namespace)::")) != std::string::npos;) name.erase(at, 23);
  // A template function's demangled name starts with its return type.
  int depth = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    depth += name[i] == '<' ? 1 : name[i] == '>' ? -1 : 0;
    if (depth == 0 && name[i] == ' ') return name.substr(i + 1);
  }
  return name;
}

std::string look_up(const void* kernel) {
  Dl_info info{};
  if (::dladdr(kernel, &info) == 0 || !info.dli_fname) return {};
  if (info.dli_sname && info.dli_saddr == kernel) return demangle(info.dli_sname);
  static std::map<std::string, SymbolMap> files;  // under the caller's lock
  auto [it, fresh] = files.try_emplace(info.dli_fname);
  if (fresh) it->second = read_symbols(info.dli_fname);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(kernel);
  const uintptr_t base = reinterpret_cast<uintptr_t>(info.dli_fbase);
  for (uintptr_t value : {addr - base, addr}) {
    if (auto s = it->second.find(value); s != it->second.end()) return demangle(s->second.c_str());
  }
  return {};
}

}  // namespace

std::string kernel_name(const void* kernel) {
  static std::mutex mutex;
  static std::unordered_map<const void*, std::string> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = cache.try_emplace(kernel);
  if (fresh) {
    const std::string found = look_up(kernel);
    if (!found.empty()) {
      it->second = shorten(found);
    } else {
      char text[40];
      std::snprintf(text, sizeof text, "kernel at %p", kernel);
      it->second = text;
    }
  }
  return it->second;
}

}  // namespace trainer::emu
