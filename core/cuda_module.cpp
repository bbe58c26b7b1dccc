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
  const CudaBackend* backend = nullptr;
  std::string path, why;
};

Loaded load() {
  Loaded r;
  if (!cuda_module_built()) {
    r.why = "this build has no CUDA backend";
    return r;
  }
  r.path = chosen_path();
  const std::string from_env = std::getenv("TRAINER_CUDA_MODULE") ? " (from TRAINER_CUDA_MODULE)" : "";
  const std::string module = "the CUDA module " + r.path + from_env;
  // Never dlclose'd: the CUDA runtime keeps threads and atexit handlers in it.
  void* h = ::dlopen(r.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    r.why = module + " cannot be loaded (" + (e ? e : "dlopen failed") + ")";
    return r;
  }
  ::dlerror();
  auto entry = reinterpret_cast<CudaBackendEntry>(::dlsym(h, kCudaBackendEntry));
  if (!entry) {
    r.why = module + " has no " + kCudaBackendEntry + "(): it is not a trainer CUDA module";
    return r;
  }
  const CudaBackend* b = entry();
  if (!b || b->abi_version != kCudaBackendAbi || b->signature != kCudaBackendSignature ||
      b->table_bytes != sizeof(CudaBackend)) {
    r.why = module + " was built from other sources (" +
            (b ? "ABI " + std::to_string(b->abi_version) + ", signature " + hex(b->signature) + ", " +
                     std::to_string(b->table_bytes) + "-byte table"
               : std::string("no table")) +
            "; this trainer needs ABI " + std::to_string(kCudaBackendAbi) + ", signature " +
            hex(kCudaBackendSignature) + ", " + std::to_string(sizeof(CudaBackend)) +
            " bytes): rebuild both from one checkout";
    return r;
  }
  r.backend = b;
  return r;
}

// Set once load() has run: what the queries below may read without loading.
std::atomic<bool> g_tried{false}, g_loaded{false};

const Loaded& loaded() {
  static Loaded r;
  static std::once_flag once;
  std::call_once(once, [] {
    r = load();
    g_loaded.store(r.backend != nullptr);
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

const CudaBackend* cuda_backend(std::string* why) {
  const Loaded& r = loaded();
  if (!r.backend && why) *why = r.why;
  return r.backend;
}

bool cuda_backend_loaded() { return g_loaded.load(); }

std::string cuda_module_path() {
  if (!cuda_module_built()) return "";
  if (g_tried.load()) return loaded().path;
  return chosen_path();
}

}  // namespace trainer
