#include "core/cuda_module.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace trainer {

namespace {

std::string executable_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, size_t(n));
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

// Rule 2 of the header: a module already mapped because the program links it.
void* linked_module(std::string* path) {
  void* h = ::dlopen(kCudaModuleFile, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) return nullptr;
  link_map* lm = nullptr;
  if (::dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name)
    *path = lm->l_name;
  else
    *path = kCudaModuleFile;
  return h;
}

std::string chosen_path() {
  if (const char* env = std::getenv("TRAINER_CUDA_MODULE"); env && *env) return env;
  std::string linked;
  if (void* h = linked_module(&linked)) {
    ::dlclose(h);  // drops only the reference RTLD_NOLOAD added
    return linked;
  }
  return executable_dir() + "/" + kCudaModuleFile;
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

struct Loaded {
  void* handle = nullptr;
  std::string path, module, why;  // module: "the CUDA module PATH", for messages
};

Loaded load() {
  Loaded r;
  if (!cuda_module_built()) {
    r.why = "this build has no CUDA backend";
    return r;
  }
  r.path = chosen_path();
  const std::string from_env = std::getenv("TRAINER_CUDA_MODULE") ? " (from TRAINER_CUDA_MODULE)" : "";
  r.module = "the CUDA module " + r.path + from_env;
  // Never dlclose'd: the CUDA runtime keeps threads and atexit handlers in it.
  r.handle = ::dlopen(r.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!r.handle) {
    const char* e = ::dlerror();
    r.why = r.module + " cannot be loaded (" + (e ? e : "dlopen failed") + ")";
  }
  return r;
}

std::string table_text(int abi, uint64_t signature, size_t bytes) {
  return "ABI " + std::to_string(abi) + ", signature " + hex(signature) + ", " + std::to_string(bytes) +
         "-byte table";
}

// Set once load() has run: what the queries below may read without loading.
std::atomic<bool> g_tried{false}, g_loaded{false};

const Loaded& loaded() {
  static Loaded r;
  static std::once_flag once;
  std::call_once(once, [] {
    r = load();
    g_loaded.store(r.handle != nullptr);
    g_tried.store(true);
  });
  return r;
}

}  // namespace

bool cuda_module_built() {
#ifdef TRAINER_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

const CudaTable* cuda_module_table(const CudaTableSpec& want, std::string* why) {
  const Loaded& r = loaded();
  std::string reason;
  const CudaTable* t = nullptr;
  if (r.handle) {
    // dlsym is safe from any thread; the entry returns a static table.
    auto entry = reinterpret_cast<CudaTableEntry>(::dlsym(r.handle, want.entry));
    if (!entry) {
      reason = r.module + " has no " + want.entry + "(): it is not a trainer CUDA module (its " + want.name +
               " table is missing)";
    } else if (t = entry(); !t || t->abi_version != want.abi_version || t->signature != want.signature ||
                            t->table_bytes != want.table_bytes) {
      reason = r.module + " was built from other sources (its " + want.name + " table: " +
               (t ? table_text(t->abi_version, t->signature, t->table_bytes) : std::string("none")) +
               "; this trainer needs " + table_text(want.abi_version, want.signature, want.table_bytes) +
               "): rebuild both from one checkout";
      t = nullptr;
    }
  } else {
    reason = r.why;
  }
  if (!t && why) *why = reason;
  return t;
}

bool cuda_backend_loaded() { return g_loaded.load(); }

std::string cuda_module_path() {
  if (!cuda_module_built()) return "";
  if (g_tried.load()) return loaded().path;
  return chosen_path();
}

bool cuda_module_emulated() {
  const std::string path = cuda_module_path();
  const size_t slash = path.rfind('/');
  return path.substr(slash == std::string::npos ? 0 : slash + 1) == kCudaEmuModuleFile;
}

}  // namespace trainer
